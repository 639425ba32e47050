"""swarm.feed_standing: what a source must deliver to keep a feed slot (issue 32)."""

from __future__ import annotations

from swarm.feed_standing import (
    LIVE_PATIENCE,
    MIN_WAIT_S,
    PROVEN_PATIENCE,
    Kind,
    Standing,
    Verdict,
)

T = 4
"""trial_rounds in these tests."""


def standing(*, probe: int = 2, trial: int = T, capacity: int = 100,
             probe_s: float = 0.0) -> Standing:
    return Standing(trial_rounds=trial, probe_rounds=probe, probe_s=probe_s, capacity=capacity)


def test_a_source_is_a_stranger_until_it_delivers_valid_groups_then_signal() -> None:
    s = standing()
    assert s.kind("a") is Kind.STRANGER
    s.report({}, {"a": 3}, 0.0)
    assert s.kind("a") is Kind.LIVE and Kind.LIVE.label == "live"
    s.report({"a": 1}, {"a": 5}, 0.0)
    assert s.kind("a") is Kind.PROVEN and Kind.STRANGER.label == "trial"


def test_a_strangers_feed_without_a_frame_is_closed_after_the_probe() -> None:
    s = standing(probe=2)
    silent, talks = s.open("silent", 0.0), s.open("talks", 0.0)
    talks.frames = 1
    s.report({}, {}, 0.0)
    assert s.judge({"silent": silent, "talks": talks}, 0.0) == {}
    s.report({}, {}, 0.0)  # nobody else delivers: the probe needs no other feed to compare with
    assert s.judge({"silent": silent, "talks": talks}, 0.0) == {"silent": Verdict.IDLE}
    assert s.idle(silent) and s.idle(talks)  # two reports without a valid group


def test_at_start_up_nothing_is_closed_sooner_than_probe_s_however_fast_the_reports() -> None:
    """A learner whose rounds skip training reports several times a second: faster than an
    honest source publishes its first batch (measured: honest sources probed out at start-up,
    reports 0.3 s apart). After trial_rounds reports with no frame from any feed, our own
    round stands in for the swarm's pace (a node whose first picks were all silent keys)."""
    s = standing(probe=2, probe_s=10.0)
    silent, quiet = s.open("silent", 0.0), s.open("quiet", 0.0)
    quiet.frames = 1
    for n in range(1, T + 1):
        s.report({}, {}, n * 0.3)
        assert s.judge({"silent": silent, "quiet": quiet}, n * 0.3) == {}
        assert s.wait_s() == 10.0
    s.report({}, {}, (T + 1) * 0.3)  # T reports and 4 gaps between them
    assert s.wait_s() == MIN_WAIT_S  # 3 x 0.3 s, at least 1 s
    assert s.judge({"silent": silent, "quiet": quiet}, (T + 1) * 0.3) == {
        "silent": Verdict.IDLE, "quiet": Verdict.IDLE}
    # a feed that delivers nothing beside one with signal is idle (judged after the wait),
    # not 'no signal' (judged in rounds only: 2 x T of them pass well within the wait here)
    s2 = standing(probe=2, probe_s=10.0)
    s2.report({"honest": 1}, {"honest": 1}, 0.0)
    trials = {"honest": s2.open("honest", 0.0), "farm": s2.open("farm", 0.0)}
    for n in range(1, 15):  # 2 x T reports pass, and more, within the wait (1.5 s)
        s2.frame("honest", n * 0.5)
        s2.report({"honest": 1 + n}, {"honest": 1 + n}, n * 0.1)
        assert s2.judge(trials, n * 0.1) == {}, n
    s2.report({"honest": 99}, {"honest": 99}, 1.5)
    assert s2.judge(trials, 1.5) == {"farm": Verdict.IDLE}  # 3 x 0.5 s


def test_no_valid_group_in_trial_rounds_closes_a_stranger_a_known_source_beside_others() -> None:
    s = standing(probe=0)
    s.report({}, {"known": 2}, 0.0)
    known, stranger = s.open("known", 0.0), s.open("stranger", 0.0)
    stranger.frames = 1  # frames that never pass re-scoring (a forged or all-broken batch)
    for _ in range(T - 1):
        s.report({}, {"known": 2}, 0.0)
        assert s.judge({"known": known, "stranger": stranger}, 0.0) == {}
    s.report({}, {"known": 2}, 0.0)
    # the whole swarm is quiet: the known source stays, the stranger goes
    assert s.judge({"known": known, "stranger": stranger}, 0.0) == {"stranger": Verdict.IDLE}
    s2 = standing(probe=0)
    s2.report({}, {"known": 2, "other": 1}, 0.0)
    known, other = s2.open("known", 0.0), s2.open("other", 0.0)
    for n in range(T):
        s2.report({}, {"known": 2, "other": 2 + n}, 0.0)
        verdicts = s2.judge({"known": known, "other": other}, 0.0)
    assert verdicts == {"known": Verdict.IDLE}


def test_valid_groups_without_signal_lose_the_slot_while_another_feed_has_signal() -> None:
    s = standing(probe=0)
    s.report({"proven": 1}, {"honest": 1, "farm": 1, "proven": 1}, 0.0)
    trials = {p: s.open(p, 0.0) for p in ("honest", "farm", "proven")}
    assert trials["proven"].kind is Kind.PROVEN and trials["farm"].kind is Kind.LIVE
    dropped_at = {}
    for n in range(1, PROVEN_PATIENCE * T + 1):
        # honest delivers signal from now on; the farm valid groups only; proven nothing new
        s.report({"honest": n, "proven": 1},
                 {"honest": 1 + n, "farm": 1 + n, "proven": 1 + n}, 0.0)
        for peer, verdict in s.judge(trials, 0.0).items():
            assert verdict is Verdict.NO_SIGNAL
            dropped_at[peer] = n
            s.dropped(peer, verdict)
            del trials[peer]
    assert dropped_at == {"farm": LIVE_PATIENCE * T, "proven": PROVEN_PATIENCE * T}
    # a farm dropped for no signal is a stranger whatever valid groups it sends, until signal
    s.report({"honest": 99}, {"farm": 500}, 0.0)
    assert s.kind("farm") is Kind.STRANGER
    s.report({"honest": 99, "farm": 1}, {"farm": 501}, 0.0)
    assert s.kind("farm") is Kind.PROVEN


def test_nothing_is_judged_while_no_feed_has_signal_nor_with_trial_rounds_zero() -> None:
    s = standing(probe=0)
    s.report({}, {"a": 1, "b": 1}, 0.0)
    a, b = s.open("a", 0.0), s.open("b", 0.0)
    for n in range(10 * T):
        s.report({}, {"a": 2 + n, "b": 2 + n}, 0.0)  # a hard task's first rounds: no signal
        assert s.judge({"a": a, "b": b}, 0.0) == {}
    off = standing(trial=0)
    off.report({}, {}, 0.0)
    quiet = off.open("quiet", 0.0)
    for _ in range(10):
        off.report({}, {}, 0.0)
        assert off.judge({"quiet": quiet}, 0.0) == {}


def test_an_idle_drop_makes_a_stranger_until_it_delivers_and_strikes_grow() -> None:
    s = standing()
    s.report({}, {"a": 4}, 0.0)
    assert s.dropped("a", Verdict.IDLE) == 1
    assert s.kind("a") is Kind.STRANGER
    assert s.dropped("a", Verdict.IDLE) == 2
    trial = s.open("a", 0.0)
    s.report({}, {"a": 5}, 0.0)
    assert s.kind("a") is Kind.LIVE
    s.judge({"a": trial}, 0.0)  # it delivered on this feed: its strikes are forgiven
    assert s.dropped("a", Verdict.IDLE) == 1
    assert s.dropped("b", Verdict.NO_SIGNAL) == 0


def test_memory_is_bounded_by_capacity() -> None:
    s = standing(capacity=3)
    for i in range(10):
        s.dropped(f"p{i}", Verdict.IDLE)
    assert len(s._base) == 3 and len(s._strikes) == 3


def test_the_wait_follows_the_swarms_publishing_pace_within_bounds() -> None:
    """probe_s until feeds have delivered; then 3 gaps between two batches of one source,
    at least MIN_WAIT_S (the embedded model's rounds take 0.2 s: a fixed 10 s kept idle keys
    in their slots for most of a run)."""
    s = standing(probe=2, probe_s=10.0)
    assert s.wait_s() == 10.0
    for i in range(6):
        s.frame("a", i * 0.5)
        s.frame("b", i * 0.5 + 0.1)
    assert s.wait_s() == 3 * 0.5
    for i in range(6, 70):
        s.frame("a", i * 0.01)  # frames back to back: still MIN_WAIT_S
    assert s.wait_s() == MIN_WAIT_S
    slow = standing(probe_s=10.0)
    for i in range(6):
        slow.frame("a", i * 60.0)
    assert slow.wait_s() == 10.0
    silent = slow.open("silent", 0.0)
    slow.report({}, {}, 0.0)
    slow.report({}, {}, 0.0)
    assert slow.judge({"silent": silent}, 9.0) == {}
    assert slow.judge({"silent": silent}, 10.0) == {"silent": Verdict.IDLE}


def test_a_feed_opened_a_moment_ago_is_no_reason_to_judge_the_others() -> None:
    """Measured: counting a new feed's opening as growth dropped two honest live sources for
    'no signal' beside freshly opened idle keys (mint, 20 keys: that node never got them
    back)."""
    s = standing(probe=0)
    s.report({}, {"a": 1, "b": 1}, 0.0)
    trials = {"a": s.open("a", 0.0), "b": s.open("b", 0.0)}
    for n in range(1, 10 * T):
        trials[f"key{n}"] = s.open(f"key{n}", 0.0)  # a fresh silent key every report
        s.report({}, {"a": 1 + n, "b": 1 + n}, 0.0)
        verdicts = s.judge(trials, 0.0)
        assert "a" not in verdicts and "b" not in verdicts, (n, verdicts)
        for key in verdicts:
            del trials[key]


def test_a_known_source_slower_than_the_swarm_is_slow_not_idle() -> None:
    s = standing(probe=0, probe_s=10.0)
    s.report({}, {"slow": 1, "fast": 1}, 0.0)
    trials = {p: s.open(p, 0.0) for p in ("slow", "fast")}
    for i in range(30):
        s.frame("fast", i * 0.5)
    for i in range(4):
        s.frame("slow", i * 4.0)  # its own gap: 4 s
    assert s.wait_s() == 1.5  # the swarm's: 3 x 0.5 s
    for n in range(1, 4 * T):  # the fast one delivers every report, the slow one not
        s.report({}, {"slow": 1, "fast": 1 + n}, n * 0.5)
        assert s.judge(trials, n * 0.5) == {}, n
    s.report({}, {"slow": 1, "fast": 99}, 12.0)  # 3 of its own gaps (and probe_s)
    assert s.judge(trials, 12.0) == {"slow": Verdict.IDLE}
    quick = standing(probe=0, probe_s=10.0)  # a known source with short gaps: probe_s
    quick.report({}, {"a": 1, "b": 1}, 0.0)
    trials = {p: quick.open(p, 0.0) for p in ("a", "b")}
    for i in range(30):
        quick.frame("a", i * 0.1)
        quick.frame("b", i * 0.1)
    for n in range(1, 99):
        quick.report({}, {"a": 1, "b": 1 + n}, n * 0.1)
        assert quick.judge(trials, n * 0.1) == {}, n
    quick.report({}, {"a": 1, "b": 200}, 10.0)
    assert quick.judge(trials, 10.0) == {"a": Verdict.IDLE}


def test_valid_groups_rank_a_candidate_as_live_only_while_no_signal_flows() -> None:
    """A hard task's first rounds: a source with valid groups ranks live (an honest node
    whose model has not taken off). Once signal reaches us, ours or a sender's, it ranks as
    a stranger until it delivers signal too (its kind stays live: a held feed keeps its
    patience); after 2 x trial_rounds reports without any signal, live again."""
    s = standing(probe=0)
    s.report({}, {"farm": 1}, 0.0, own=0)
    assert s.rank("farm") is Kind.LIVE and not s.flowing
    s.report({}, {"farm": 2}, 0.0, own=1)  # our own groups carry signal
    assert s.flowing and s.rank("farm") is Kind.STRANGER and s.kind("farm") is Kind.LIVE
    for _ in range(LIVE_PATIENCE * T - 1):
        s.report({}, {"farm": 3}, 0.0, own=1)
        assert s.rank("farm") is Kind.STRANGER
    s.report({}, {"farm": 4}, 0.0, own=1)
    assert not s.flowing and s.rank("farm") is Kind.LIVE
    s.report({"other": 1}, {"farm": 5, "other": 1}, 0.0, own=1)  # a sender's signal counts too
    assert s.rank("farm") is Kind.STRANGER and s.rank("other") is Kind.PROVEN


def test_our_own_signal_judges_a_feed_without_signal_when_no_other_feed_has_any() -> None:
    """Every slot held by keys trickling valid all-wrong groups: no other feed has signal to
    judge them against, but our own groups do. Not before the wait, however fast we report."""
    s = standing(probe=0, probe_s=10.0)
    s.report({}, {"farm": 1}, 0.0, own=0)
    farm = s.open("farm", 0.0)
    verdicts: dict[str, Verdict] = {}
    n = 0
    while not verdicts:
        n += 1
        s.report({}, {"farm": 1 + n}, n * 0.1, own=n)  # ours grow every report, 0.1 s apart
        verdicts = s.judge({"farm": farm}, n * 0.1)
        assert n < 1000
    assert verdicts == {"farm": Verdict.NO_SIGNAL}
    # 2 x T reports, and the wait: no frame pace known, our own round's (3 x 0.1 s, >= 1 s)
    assert n == LIVE_PATIENCE * T + 2 and s.wait_s() == MIN_WAIT_S
    # our own signal now and then: only the reports in which it grew count
    s3 = standing(probe=0, probe_s=1e-9)
    s3.report({}, {"farm": 1}, 0.0, own=0)
    sparse = s3.open("farm", 0.0)
    for n in range(1, 4 * LIVE_PATIENCE * T + 10):
        s3.report({}, {"farm": 1 + n}, float(n), own=n // 4)  # grows every 4th report
        if s3.judge({"farm": sparse}, float(n)):
            break
    assert n == 4 * LIVE_PATIENCE * T, n  # 2 x T reports in which ours grew
    # without own signal reported, a lone feed is never judged by signal (as before)
    s2 = standing(probe=0, probe_s=10.0)
    s2.report({}, {"farm": 1}, 0.0)
    lone = s2.open("farm", 0.0)
    for n in range(1, 200):
        s2.report({}, {"farm": 1 + n}, n * 0.1)
        assert s2.judge({"farm": lone}, n * 0.1) == {}


def test_a_source_is_silent_after_the_wait_and_three_of_its_own_gaps() -> None:
    """swarm.feeds' starved rotation: a source that publishes every 4 s is not silent after
    the swarm's 1 s wait, but after 12 s; one never seen publishing, after the wait."""
    s = standing(probe_s=30.0)
    for i in range(8):
        s.frame("slow", i * 4.0)
    for i in range(30):
        s.frame("fast", i * 0.2)
    assert s.wait_s() == MIN_WAIT_S  # the median gap is the fast source's
    assert s.silent_s("never") == MIN_WAIT_S
    assert 11.0 < s.silent_s("slow") <= 12.0
    assert s.silent_s("fast") == MIN_WAIT_S


def test_searching_while_our_own_groups_carry_signal_and_no_held_feed_brings_any() -> None:
    """A node that joined where a farm sending valid all-wrong groups already sat: its own
    groups carry signal now and then, none of its feeds' ever do (``searching``: its
    sources that are not proven then rotate every wait)."""
    s = standing()
    wrong = {k: s.open(k, 0.0) for k in "abcd"}
    s.report({}, {k: 1 for k in wrong}, 0.0, own=0)
    assert not s.searching(wrong.values())  # no signal anywhere: nobody is behind
    s.report({}, {k: 2 for k in wrong}, 0.0, own=1)
    assert s.searching(wrong.values())
    for n in range(T - 1):  # our own signal stays recent for trial_rounds reports
        s.report({}, {k: 3 + n for k in wrong}, 0.0, own=1)
        assert s.searching(wrong.values())
    s.report({}, {k: 9 for k in wrong}, 0.0, own=1)
    assert not s.searching(wrong.values())
    s.report({}, {k: 10 for k in wrong}, 0.0, own=2)
    assert s.searching(wrong.values())
    # a held feed that brought signal within LIVE_PATIENCE x trial_rounds reports: not
    honest = s.open("h", 0.0)
    assert s.searching([*wrong.values(), honest])  # a stranger's feed brought nothing yet
    s.report({"h": 1}, {**{k: 11 for k in wrong}, "h": 1}, 0.0, own=3)
    s.judge({**wrong, "h": honest}, 0.0)
    assert honest.signal_grew == s.reports and not s.searching([*wrong.values(), honest])
    for n in range(LIVE_PATIENCE * T - 1):
        s.report({"h": 1}, {k: 12 + n for k in [*wrong, "h"]}, 0.0, own=4 + n)
        s.judge({**wrong, "h": honest}, 0.0)
        assert not s.searching([*wrong.values(), honest])
    s.report({"h": 1}, {k: 99 for k in [*wrong, "h"]}, 0.0, own=99)
    assert s.searching([*wrong.values(), honest])
    # a feed just opened to a proven source counts as bringing signal for that window
    again = s.open("h", 0.0)
    assert again.kind is Kind.PROVEN and not s.searching([again])
