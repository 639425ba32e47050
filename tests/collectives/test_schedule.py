"""Pure unit tests: the clock (schedule.py), applying a background step (work.py
``Progress.collect``) and the rendezvous's reads (rendezvous.py)."""

from __future__ import annotations

import types

import pytest
import torch

from collectives import OuterConfig, OuterLoop
from collectives.attempt import Attempt
from collectives.leader import Blame
from collectives.consistency import Lineage
from collectives.holding import Holding
from collectives.record import Draft
from collectives.rendezvous import Rendezvous
from collectives.work import Progress, Work
from collectives.schedule import RUNGS, RUNGS_UP, Clock, ladder
from collectives.state import flatten
from protocol.tables import TableError


def clock(**kw: float) -> Clock:
    opts = dict(every_rounds=4, min_period_s=2.0, max_period_s=64.0, min_window_s=0.5,
                max_window_s=8.0)
    return Clock(**{**opts, **kw})  # type: ignore[arg-type]


def test_ladder_rounds_up_to_powers_of_two_within_bounds() -> None:
    assert [ladder(s, base=2, top=64) for s in (0, 1.9, 2, 2.1, 5, 64, 1e9)] \
        == [2, 2, 2, 4, 8, 64, 64]
    assert ladder(100, base=2, top=100) == 64  # the largest rung <= top
    with pytest.raises(ValueError):
        ladder(1, base=0, top=1)


def test_another_peers_claim_stretches_our_read_at_most_two_rungs() -> None:
    """A staller re-storing records that claim the longest period (issue 32) held three
    honest peers in one read for minutes (a fresh-clone CI run): a claimed period counts at
    most RUNGS_UP times ours, as a newcomer adopts one."""
    c = clock(max_period_s=600.0, max_window_s=300.0)
    for _ in range(5):
        c.observe_round(0.4)  # 4 rounds: 1.6 s -> the 2 s rung
    assert c.proposal() == c.period() == 2.0
    longest = c.longest([c.code(), 1 + (RUNGS - 1) + RUNGS * (RUNGS - 1)])
    assert longest == 600.0 and c.window(longest) == 225.0
    assert c.near(longest) == RUNGS_UP * 2.0 and c.window(c.near(longest)) == 1.5 * 8.0 / 4
    assert c.near(4.0) == 4.0  # a claim within two rungs counts as it is


def test_peers_that_disagree_on_the_period_still_meet_at_the_longer_ones() -> None:
    fast, slow = clock(), clock()
    for _ in range(5):
        fast.observe_round(0.9)  # 4 rounds: 3.6 s -> 4 s
        slow.observe_round(1.8)  # 7.2 s -> 8 s
    assert (fast.period(), slow.period()) == (4.0, 8.0)
    f = {t for t in range(0, 200) if fast.due(float(t)) is not None}
    s = {t for t in range(0, 200) if slow.due(float(t)) is not None}
    assert s and s <= f  # every meeting of the slower is one of the faster's
    fast.heard([slow.code(), fast.code()])  # the group's largest proposal: 8 s
    assert fast.period() == 8.0 and fast.proposal() == 4.0
    fast.heard([10**7])  # a hostile proposal is capped at max_period_s
    assert fast.period() == 64.0


def test_peers_that_came_with_different_periods_read_the_group_at_the_same_time() -> None:
    """The window follows the longest period in force among the join records, so a peer
    whose own period is shorter reads as late as the others (schedule.py)."""
    fast, slow = clock(), clock()
    for _ in range(5):
        fast.observe_round(0.9)
        slow.observe_round(1.8)
    assert fast.window() < slow.window()
    codes = [fast.code(), slow.code()]
    assert fast.window(fast.longest(codes)) == slow.window(slow.longest(codes)) \
        == slow.window()
    assert fast.longest([fast.code()]) == 4.0  # alone: its own
    assert fast.longest([10**7, -1, "x"]) <= 64.0  # type: ignore[list-item]
    fixed = clock(period_s=10.0)
    assert fixed.longest([slow.code()]) == 10.0  # a configured period is everyone's


def test_a_peer_joins_the_meeting_that_opened_during_its_round_not_a_stale_one() -> None:
    c = clock(period_s=10.0)
    assert c.window() == 3.75  # 1.5 rounds of a 10 s period of 4 rounds
    assert c.due(101.0) == 100.0  # opened 1 s ago: join
    assert c.due(105.0) is None  # joined already; the next opens at 110
    assert c.due(114.5) is None  # 4.5 s late (> window): wait for 120
    assert c.due(121.0) == 120.0
    c.skip_until(140.0)  # let the meetings before 140 pass
    assert c.due(131.0) is None and c.due(140.5) == 140.0


def test_a_meeting_that_opens_within_the_lead_is_due_before_it_opens() -> None:
    c = clock(period_s=10.0)
    assert c.due(98.5, lead=1.0) is None  # opens in 1.5 s: not yet (only 100 - 10 passed)
    assert c.due(99.2, lead=1.0) == 100.0  # opens in 0.8 s: prepare now
    assert c.due(100.5, lead=1.0) is None  # joined already
    assert c.due(109.5, lead=100.0) == 110.0  # the lead is capped at a quarter period ...
    assert c.due(117.0, lead=100.0) is None  # ... 2.5 s: 120 is not due 3 s early
    assert c.due(117.6, lead=100.0) == 120.0
    late = clock(period_s=10.0)
    assert late.due(109.3, lead=1.0) == 110.0  # 100 is stale (9.3 s > window): the next


def test_a_shorter_period_takes_effect_at_once_and_one_slow_round_does_not_stretch_it() -> None:
    c = clock()
    c.observe_round(30.0)  # the first round loaded the model
    assert c.period() == 64.0
    assert c.due(128.5) == 128.0
    for _ in range(4):
        c.observe_round(0.9)
    assert c.period() == 4.0  # the median of the last rounds
    assert c.due(130.0) is None  # 128 joined already
    assert c.due(132.2) == 132.0  # the next multiple of the new period, not 128 + 64


def test_the_period_holds_a_window_and_the_last_exchange() -> None:
    c = clock()
    c.observe_round(0.1)
    assert c.period() == 2.0
    c.observe_exchange(3.0)  # 1.25 x (0.5 + 3.0) = 4.375 -> 8
    assert c.period() == 8.0
    assert c.code() == 1 + 2 + 32 * 2  # proposal and period in force: rung 2 (8 s)
    c.finish()  # a finished peer asks for nothing, attends every meeting, says so
    assert c.period() == 2.0 and Clock.finished(c.code()) and not Clock.pending(c.code())
    assert Clock.pending(c.code(pending=True)) and not Clock.finished(1 + 2 + 32 * 2)


def _parts(params: list[torch.nn.Parameter]) -> tuple[Progress, Holding]:
    """The training thread's progress and the holding of θ_global: no transport."""
    return Progress(params), Holding(flatten(params), peer_id="me", momentum=0.0,
                                     minority_patience=3)


def test_rounds_trained_during_a_background_step_survive_its_application() -> None:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(50, 4, generator=g)),
              torch.nn.Parameter(torch.randn(7, generator=g))]
    progress, holding = _parts(params)
    progress.pending = 3
    work = Work(snapshot=flatten(params), rounds=3, weight=None)
    # the outer-step thread applies the average (θ_new) and rebases
    theta_new = holding.copy().theta - 0.5
    work.rebase(onto=theta_new, base=work.params())
    assert torch.equal(work.params(), theta_new)  # what the attempt sees from now on
    work.counted = True
    with torch.no_grad():  # meanwhile the training thread made two more rounds
        drift = [torch.randn(p.shape, generator=g) for p in params]
        for p, d in zip(params, drift):
            p.add_(d)
    progress.pending += 2
    before = flatten(params)
    rec = progress.collect(work, reset=holding.reset)
    made = before - work.snapshot  # the work since the snapshot
    assert torch.allclose(flatten(params), theta_new + made, atol=1e-6)
    assert (rec["rounds_pending"], rec["discarded_rounds"]) == (2, 0)


def test_snapshots_reuse_one_buffer_and_equal_the_params() -> None:
    """An attempt's snapshot goes into the previous attempt's buffer (no 400 MB allocation
    per step at 100M values): it holds exactly the params now, and a collected attempt's
    result does not depend on the buffer being overwritten by the next snapshot."""
    g = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(30, 3, generator=g)),
              torch.nn.Parameter(torch.randn(5, generator=g))]
    progress, holding = _parts(params)
    first = Work(snapshot=progress.snapshot(), rounds=1, weight=None)
    assert torch.equal(first.snapshot, flatten(params))
    theta_new = holding.copy().theta + 1.0
    first.rebase(onto=theta_new, base=first.params())
    progress.collect(first, reset=holding.reset)
    after_first = flatten(params)
    assert torch.allclose(after_first, theta_new, atol=1e-6)
    with torch.no_grad():
        params[1].add_(3.0)
    second = progress.snapshot()
    assert second.data_ptr() == first.snapshot.data_ptr()  # the same buffer, refilled
    assert torch.equal(second, flatten(params))
    assert torch.equal(flatten(params)[:90], after_first[:90])  # nothing written back
    half = [torch.nn.Parameter(torch.ones(4, dtype=torch.float16))]
    assert Progress(half).snapshot().dtype == torch.float32  # other dtypes: a fresh flatten


def test_a_failed_step_leaves_the_params_exactly_as_trained() -> None:
    params = [torch.nn.Parameter(torch.ones(10))]
    progress, holding = _parts(params)
    work = Work(snapshot=flatten(params), rounds=1, weight=None)
    applied = holding.copy().theta + 2.0  # applied, then rolled back: the shifts cancel
    work.rebase(onto=applied, base=work.snapshot)
    work.rebase(onto=work.snapshot, base=applied)
    with torch.no_grad():
        params[0].add_(0.25)
    progress.pending = 2
    rec = progress.collect(work, reset=holding.reset)
    assert torch.equal(params[0].detach(), torch.full((10,), 1.25))
    assert rec["rounds_pending"] == 2  # not counted: the rounds stay pending


def test_a_non_finite_local_delta_is_dropped_and_counted() -> None:
    params = [torch.nn.Parameter(torch.ones(4))]
    progress, holding = _parts(params)
    work = Work(snapshot=flatten(params), rounds=2, weight=None)
    work.rebase(onto=holding.copy().theta * 3, base=work.snapshot)
    with torch.no_grad():
        params[0][1] = float("nan")
    progress.pending = 4
    rec = progress.collect(work, reset=holding.reset)
    assert torch.equal(params[0].detach(), holding.copy().theta)
    assert rec["discarded_rounds"] == 4


def test_open_meetings_span_the_ladder_and_agreement_needs_others() -> None:
    c = clock()  # windows: 2 s -> 0.75, 4 -> 1.5, 8 -> 3, 16 -> 6, 32 and 64 -> 8
    assert c.open_meetings(97.0) == [96.0]  # multiple of 2, 4, 8, 16 and 32, opened 1 s ago
    assert c.open_meetings(101.8) == [96.0]  # 5.8 s after 96: open for 16 and 32, not 8
    assert c.open_meetings(100.5) == [96.0, 100.0]  # and 100 for 2 and 4
    assert not c.agreed
    c.heard([c.code()])  # alone: nothing agreed with anyone
    assert not c.agreed
    c.heard([c.code(), c.code()])
    assert c.agreed and clock(period_s=4.0).agreed  # a configured period is everyone's
    d = clock()
    d.adopt([1 + 32 * 3])  # a version's agreed period (16 s) read from its commit
    assert d.agreed and d.period() == 16.0


def test_a_joiner_reads_the_period_of_the_version_it_will_adopt_before_its_first_meeting(
        ) -> None:
    """loop.py ``_period_known`` / catchup.py ``Catchup.agreed``: the first attempt of a
    newcomer whose rounds are faster than the group's goes to the group's meeting."""
    from concurrent.futures import ThreadPoolExecutor

    from collectives.catchup import Catchup
    from collectives.consistency import CommitBook
    from protocol import Identity

    group, gid = "g", "gid"
    trusted = [Identity.generate() for _ in range(2)]
    stranger = Identity.generate()
    members = tuple(sorted(i.peer_id for i in trusted))
    heads = {i.peer_id: CommitBook(identity=i, group=group, gid=gid, swarm_id="s").version(
        3, "ab" * 32, parent="cd" * 32, members=members, period=1 + 32 * 3) for i in trusted}
    # a peer we do not trust claims a newer version with the longest period
    heads[stranger.peer_id] = CommitBook(identity=stranger, group=group, gid=gid,
                                         swarm_id="s").version(9, "ef" * 32, parent="cd" * 32,
                                                               members=(), period=1 + 32 * 8)

    class Transport:
        def add_dht_peers(self, maddrs: list[str], timeout: float) -> None:
            pass

        def dht_get(self, key: str, *, timeout: float) -> dict[str, bytes]:
            return heads if key == book.head_key else {}

    me = Identity.generate()
    book = CommitBook(identity=me, group=group, gid=gid, swarm_id="s")
    loop = object.__new__(OuterLoop)  # the first attempt's scheduling only: no p2pd
    loop.config, loop.clock, loop._transport = OuterConfig(), clock(), Transport()
    loop._catchup = Catchup(config=loop.config, peer_id=me.peer_id, book=book,
                            transport=Transport(), trust=lambda p: p in members)
    loop._holding = Holding(torch.zeros(3), peer_id=me.peer_id, momentum=0.0,
                            minority_patience=3)
    assert loop._holding.lineage().is_genesis
    loop._discover = lambda: ["/ip4/127.0.0.1/tcp/1/p2p/" + trusted[0].peer_id]
    loop._pool, loop._scout = ThreadPoolExecutor(max_workers=1), None
    for _ in range(3):
        loop.clock.observe_round(0.1)
    assert loop.clock.period() == 2.0  # its own pace: a meeting every 2 s
    try:
        while not loop._period_known():  # the read runs in the background
            pass
    finally:
        loop._pool.shutdown()
    assert loop.clock.period() == 16.0 and loop.clock.agreed  # the trusted heads' period
    assert loop.clock.due(1000.5) is None  # 1000 is not one of their meetings
    assert loop.clock.due(1009.0) == 1008.0


def test_a_version_adopted_at_the_meeting_that_made_it_ends_the_attempt_there() -> None:
    """rendezvous.py ``made_at``: a late node that adopts version 1 at the tail of the meeting
    where its witnesses made it does not step there (they have left; nobody could advance
    it), but it does at a meeting where they are at version 1."""
    from collectives.consistency import CommitBook, Lineage
    from protocol import Identity

    group, gid = "g", "gid"
    witnesses = [Identity.generate() for _ in range(2)]
    records = {w.peer_id: CommitBook(identity=w, group=group, gid=gid, swarm_id="s").join(
        0, "00" * 32, 1) for w in witnesses}
    me = Identity.generate()
    book = CommitBook(identity=me, group=group, gid=gid, swarm_id="s")

    class Transport:
        def dht_get(self, key: str, *, timeout: float) -> dict[str, bytes]:
            return records if key == book.join_key(0, meet=96.0) else {}

    rendezvous = Rendezvous(config=OuterConfig(), peer_id=me.peer_id, book=book,
                            transport=Transport(), clock=clock(), now=lambda: 100.0)
    made = Lineage(hash="ab" * 32, version=1, witnesses=frozenset(w.peer_id for w in witnesses))
    assert rendezvous.made_at(made, 96.0)  # they joined 96 at version 0 and made version 1
    assert not rendezvous.made_at(made, 128.0)  # a later meeting: they come at version 1
    elsewhere = Lineage(hash="ab" * 32, version=1, witnesses=frozenset({"someone"}))
    assert not rendezvous.made_at(elsewhere, 96.0)  # made elsewhere


def test_a_join_stored_after_the_window_of_the_longest_period_present_is_late() -> None:
    """OuterLoop: a peer whose join record was stored after the others' read ended (the
    meeting + the window of the longest period among the records) does not wait for their
    JOINs: they already grouped without it (on the WAN bed a NATed peer with the smallest
    id, 2 s late, led such a group alone for 28 s, 0.35 x deadline_s, twice in a row)."""
    c = clock(every_rounds=2, min_period_s=2.0, max_window_s=8.0)
    c.finish()  # finished peers: the base period (2 s), a 1 s window
    fin = c.code()
    assert c.closes(100.0, [fin, fin]) == pytest.approx(101.0)
    trainer = clock(every_rounds=2, min_period_s=2.0, max_window_s=8.0)
    trainer.observe_round(8.0)  # a peer still training on a 16 s period: 12 s -> 8 s cap
    assert c.closes(100.0, [fin, trainer.code()]) == pytest.approx(100.0 + c.window(16.0))
    assert c.window(16.0) == pytest.approx(8.0)
    # our own period does not lengthen the others' read: they never saw our record if it
    # came after theirs ended (a newcomer on its own 16 s period among peers on 2 s)
    assert trainer.closes(100.0, [fin, fin]) == pytest.approx(101.0)
    assert trainer.closes(100.0, []) == pytest.approx(100.0 + trainer.window())  # alone


def test_a_finished_peer_meets_on_a_period_whose_window_holds_the_least_window() -> None:
    """A peer whose run ended attends the meetings of the shortest rung whose window holds
    ``min_window_s``: the ladder's base (2 s) gave it 1 s windows, and on the WAN bed the
    rendezvous of a loaded or NATed peer took 1.7-2.7 s, so it came late to every meeting."""
    c = clock(every_rounds=2, min_period_s=2.0, min_window_s=3.0, max_window_s=600.0)
    c.finish()
    assert c.period() == 8.0 and c.proposal() == 8.0
    assert c.window() >= 3.0
    assert c.due(16.5) == 16.0 and c.due(20.0) is None  # multiples of 8 s only
    trainer = clock(every_rounds=2, min_period_s=2.0, min_window_s=3.0, max_window_s=600.0)
    trainer.observe_round(8.0)
    assert trainer.period() % c.period() == 0  # its meetings are among a longer period's


def test_a_finished_peer_finds_the_longer_meeting_where_a_missing_peer_joined() -> None:
    """rendezvous.py ``find_meeting(among=...)`` and ``join``: a finished peer (8 s meetings,
    4 s reads) whose discovered peer is missing from its meeting finds the one that peer
    joined: a meeting of its 128 s period that opened 22 s ago and is read for 64 s (e2e
    local swarm: the finished node left 4 s before the other two stepped there). Its join
    record there lives until their read ends, not 2 of its own 4 s windows."""
    from collectives.consistency import CommitBook
    from collectives.schedule import RUNGS
    from protocol import Identity

    group, gid, state = "g", "gid", "00" * 32
    trainer, stranger, me = (Identity.generate() for _ in range(3))
    slow = 1 + 6 + RUNGS * 6  # proposal and period in force: 2 s x 2^6 = 128 s
    records = {448.0: {trainer.peer_id: CommitBook(identity=trainer, group=group, gid=gid,
                                                   swarm_id="s").join(0, state, slow)},
               464.0: {stranger.peer_id: CommitBook(identity=stranger, group=group, gid=gid,
                                                    swarm_id="s").join(0, state, slow)}}
    book = CommitBook(identity=me, group=group, gid=gid, swarm_id="s")
    stored: list[tuple[str, float]] = []

    class Transport:
        def dht_get(self, key: str, *, timeout: float) -> dict[str, bytes]:
            return next((r for m, r in records.items() if key == book.join_key(0, meet=m)), {})

        def dht_store(self, key: str, subkey: str, value: bytes, *, ttl: float,
                      timeout: float) -> None:
            stored.append((key, ttl))
            records.setdefault(next(m for m in (448.0, 464.0, 472.0)
                                    if key == book.join_key(0, meet=m)), {})[subkey] = value

    ours = clock(every_rounds=2, min_period_s=2.0, min_window_s=3.0, max_period_s=600.0,
                 max_window_s=600.0)
    ours.finish()
    assert ours.window() == 4.0  # our own reads: 4 s
    rendezvous = Rendezvous(config=OuterConfig(), peer_id=me.peer_id, book=book,
                            transport=Transport(), clock=ours, now=lambda: 470.0)
    assert rendezvous.find_meeting(0, state, but=472.0, among=frozenset({trainer.peer_id})) \
        == (448.0, [slow])
    assert rendezvous.find_meeting(0, state, but=472.0, among=frozenset({"nobody"})) is None
    assert rendezvous.find_meeting(0, "ff" * 32, but=472.0) is None  # not at our state
    work = Work(snapshot=torch.zeros(1), rounds=3, weight=None, meet=472.0, final=True)
    attempt = object.__new__(Attempt)  # its move to another meeting: no p2pd
    attempt.rendezvous, attempt.clock, attempt.blame = rendezvous, ours, Blame()
    attempt.holding = types.SimpleNamespace(version=lambda: 0, hash=lambda: state)
    draft = Draft(step=0)
    assert attempt._meet_others(work, draft, but=472.0, among=frozenset({trainer.peer_id}))
    assert work.meet == 448.0 and work.met == (slow,) and draft.observed["meet"] == 448.0
    roster = rendezvous.join(work, 0, state, frozenset(), frozenset({trainer.peer_id}))
    assert set(roster.holders) == {me.peer_id, trainer.peer_id} and roster.early
    assert roster.late is None
    key, ttl = stored[-1]
    assert key == book.join_key(0, meet=448.0)
    assert ttl >= 448.0 + 64.0 - 470.0  # their read ends at 512: 42 s from now


def test_a_joiner_adopts_the_heads_of_peers_its_operator_pinned() -> None:
    """``[outer.catchup] trusted_peers`` (``--trust-peer``; ``swarm-node local`` pins its own
    nodes): a joiner that received no rollouts from anyone adopts the version its pinned
    peers signed, and still refuses an unpinned key's newer claim."""
    from collectives.catchup import Catchup
    from collectives.consistency import CommitBook, Lineage
    from protocol import Identity

    group, gid = "g", "gid"
    pinned, stranger, me = Identity.generate(), Identity.generate(), Identity.generate()
    heads = {pinned.peer_id: CommitBook(identity=pinned, group=group, gid=gid,
                                        swarm_id="s").version(
        2, "ab" * 32, parent="cd" * 32, members=(pinned.peer_id,), period=1 + 32 * 3),
        stranger.peer_id: CommitBook(identity=stranger, group=group, gid=gid,
                                     swarm_id="s").version(
        9, "ef" * 32, parent="cd" * 32, members=(), period=1 + 32 * 8)}
    book = CommitBook(identity=me, group=group, gid=gid, swarm_id="s")

    class Transport:
        def dht_get(self, key: str, *, timeout: float) -> dict[str, bytes]:
            return heads if key == book.head_key else {}

    genesis = Lineage(hash="00" * 32, version=0)

    def catchup(config: OuterConfig) -> Catchup:
        return Catchup(config=config, peer_id=me.peer_id, book=book,
                       transport=Transport(), trust=lambda p: False)  # type: ignore[arg-type]

    assert catchup(OuterConfig()).agreed(genesis) is None  # trusts nobody: trains alone
    config = OuterConfig.from_dict({"catchup": {"trusted_peers": [pinned.peer_id]}})
    assert catchup(config).agreed(genesis) == (2, (1 + 32 * 3,))
    with pytest.raises(TableError, match="trusted_peers"):
        OuterConfig.from_dict({"catchup": {"trusted_peers": ["not a peer id"]}})
