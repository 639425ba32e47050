"""The Sybil-farm simulation (bench/sim/sybil.py) and its mirror of swarm/feeds.py's picker."""

from __future__ import annotations

import collections
import json
import random
import statistics
import subprocess
import sys

import pytest

from bench.sim.picker import MIRRORED, TICK_S, FeedPicker, Table
from bench.sim.sybil import SybilScenario, run
from bench.sim.sybil_grid import farm_sizes
from swarm.config import FeedsConfig
from swarm.feed_standing import MIN_WAIT_S, Kind, Verdict

K = FeedsConfig().sources


def honest_slots(farm: str, farm_size: int, policy: str, *, n: int = 16,
                 farm_networks: int = 0) -> float:
    """Mean over 3 seeds of the honest feeds a node holds in rounds 61..120."""
    return statistics.fmean(run(SybilScenario(n=n, farm_size=farm_size, farm=farm, policy=policy,
                                              rounds=120, seed=s,
                                              farm_networks=farm_networks))["honest_slots"]
                            for s in range(3))


def test_a_farm_in_one_network_holds_at_most_its_cap_even_against_the_pick_by_keys() -> None:
    """swarm.networks: with the farm on one machine, even the picker before issue 32 (uniform
    over keys, fresh ones first) keeps k - max_per_network slots for honest sources, where
    by keys it held 0.76 against 64 idle keys and nothing against a minting farm."""
    cap = FeedsConfig().max_per_network
    assert honest_slots("idle", 64, "old", farm_networks=1) >= K - cap - 0.05
    assert honest_slots("mint", 4, "old", farm_networks=1) >= K - cap - 0.05
    # spread over two networks, it holds up to twice the cap: by keys again here
    assert honest_slots("mint", 4, "old", farm_networks=2) < K - cap
    assert honest_slots("idle", 64, "new", farm_networks=1) >= K - 1.1
    # a farm that delivers signal is proven and never rotated out for a stranger: only the
    # check at the opening (several picks in flight before any opens) keeps it to its cap
    assert honest_slots("signal", 64, "new", farm_networks=1) >= K - cap - 0.05


def test_new_policy_keeps_all_but_the_exploration_slot_against_a_farm_of_4n() -> None:
    reserved = K - FeedsConfig().explore_slots
    for farm in ("idle", "wrong"):  # nothing reported; valid groups without signal
        new = honest_slots(farm, 64, "new")
        assert new >= reserved - 0.1, (farm, new)
    # by keys: 15 honest of 79 -> 4 * 15 / 79 = 0.76 honest slots
    old = honest_slots("idle", 64, "old")
    assert 0.5 <= old <= 1.0, old


def test_a_minting_farm_takes_every_slot_from_the_old_policy_only() -> None:
    # fresh keys went first: a farm that mints one every 8 s holds them all (issue 32)
    assert honest_slots("mint", 4, "old") < 0.3
    assert honest_slots("mint", 4, "new") >= K - 1.1
    assert honest_slots("mint", 64, "new") >= K - 1.1


def test_a_farm_that_delivers_signal_is_proven_like_an_honest_source() -> None:
    """The report cannot tell a group with signal that never beats our baseline from an
    honest one: such a farm keeps the share it has of the keys, as before issue 32."""
    new, old = honest_slots("signal", 64, "new"), honest_slots("signal", 64, "old")
    assert new < 1.2 and abs(new - old) < 0.4, (new, old)


def test_same_seed_same_run_and_farms_are_checked() -> None:
    sc = SybilScenario(n=16, farm_size=16, farm="signal", policy="new", rounds=20, seed=5)
    assert run(sc) == run(sc)
    assert run(sc) != run(SybilScenario(n=16, farm_size=16, farm="signal", policy="new",
                                        rounds=20, seed=6))
    with pytest.raises(ValueError, match="farm"):
        SybilScenario(n=16, farm_size=1, farm="loud")
    assert farm_sizes(16) == [0, 4, 16, 50, 64] and farm_sizes(1000) == [0, 250, 1000, 4000]


def test_a_full_table_keeps_the_peers_that_came_first() -> None:
    table = Table(range(10), capacity=5)  # the newest arrival is displaced (swarm.peers)
    assert table.peers == [0, 1, 2, 3, 9] and 8 not in table.members
    table.add(10)
    assert table.peers == [0, 1, 2, 3, 10] and 9 not in table.members


def opened_all(p: FeedPicker, now: float) -> list[int]:
    """``maintain`` at ``now`` (and a tick later), every feed it started opened at once (as
    tests/swarm/feeds_checks.py's ``following``); returns the sources it started."""
    started = p.maintain(now) + p.maintain(now + TICK_S)
    for f in started:
        p.opened(f, now + TICK_S)
    return [f.peer for f in started]


def four_live_keys(seed: int = 7) -> tuple[Table, list[int], FeedPicker]:
    """A node (peer 4) whose four feeds, opened at ``TICK_S``, are live keys 0-3 (valid
    groups, no signal), rotate_s 60 s: the table, the keys and its picker."""
    table, keys = Table(range(5)), [0, 1, 2, 3]
    p = FeedPicker(4, config=FeedsConfig(sources=4, rotate_s=60.0, trial_rounds=3,
                                         probe_rounds=2, probe_s=30.0),
                   table=table, rng=random.Random(seed))
    p.rate(0.0, {}, {k: 1 for k in keys}, own=0)
    opened_all(p, 0.0)
    return table, keys, p


def sources(p: FeedPicker) -> set[int]:
    return {f.peer for f in p.feeds.values() if f.open}


def test_picker_mirrors_the_feed_clients_choice() -> None:
    """tests/swarm/feeds_checks.py's check of FeedClient (issue 32), replayed on the mirror:
    3 honest sources among 20 keys, k = 4, trial_rounds = 3, probe_rounds = 2."""
    table = Table(range(24))  # 23 is the node itself
    honest = [0, 1, 2]
    p = FeedPicker(23, config=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3,
                                          probe_rounds=2, probe_s=1e-9),
                   table=table, rng=random.Random(1))
    assert p.want([]) is None  # no report yet: any
    picks = [p.pick() for _ in range(2000)]
    assert 23 not in picks and sum(x in honest for x in picks) < 2000 * 3 / 23 * 1.4
    p.rate(0.0, {}, {h: 5 for h in honest})  # valid groups, none with signal yet
    opened_all(p, 0.0)
    assert set(honest) < sources(p) and len(sources(p)) == 4
    assert p.kinds() == {"proven": 0, "live": 3, "trial": 1, "idle": 0}
    key = (sources(p) - set(honest)).pop()
    # a rotation: the oldest is live and no proven source is free, so it stays and the
    # oldest stranger (the key) is replaced, by another key (which asks for a backfill)
    for f in p.feeds.values():
        f.started = 0.0 if f.peer == honest[0] else 5.0
    p.last_rotation = -10.0
    (new,) = p.maintain(1.0)
    assert new.replaces == key and new.peer not in honest and new.backfill
    assert p.opened(new, 1.5) == key and p.counters["feed_rotated"] == 1
    assert set(honest) < sources(p) and key not in sources(p) and key in p.rested
    key = new.peer
    # the honest sources' groups carry signal now; the key never sent a frame: two reports
    # later it is closed, cooled and no longer a candidate
    closed = [p.rate(2.0 + n, {h: n for h in honest}, {h: 5 + n for h in honest})
              for n in (1, 2)]
    assert closed == [[], [key]] and key in p.cooldown and p.cooldown[key] == 4.0 + 5.0
    assert p.counters["feed_dropped_idle"] == 1
    assert p.counters["feed_idle_slot_rounds"] == 1  # the key, in the second report
    assert p.kinds() == {"proven": 3, "live": 0, "trial": 0, "idle": 0}
    opened_all(p, 5.0)
    assert len(sources(p)) == 4 and p.kinds()["trial"] == 1
    for fresh in range(100, 110):  # a farm that mints fresh keys: strangers, never proven
        table.add(fresh)
    # every proven source is held: a rotation finds none, a gap fill a stranger
    assert p.pick(want=Kind.PROVEN, at_least=Kind.PROVEN) is None
    assert p.pick(want=Kind.LIVE) not in honest
    assert p.want(list(p.feeds.values())) is Kind.STRANGER  # k - 1 proven held
    # a key dropped idle again is cooled twice as long (its strikes survive reopening)
    assert p.standing.dropped(key, Verdict.IDLE) == 2

    # while no source delivers anything new (a quiet swarm), known sources keep their slots;
    # then a source that stops delivering while another goes on loses its slot, and is a
    # stranger until it delivers again
    p2 = FeedPicker(9, config=FeedsConfig(sources=2, trial_rounds=2, explore_slots=1,
                                          probe_s=1e-9), table=Table([0, 1, 9]),
                    rng=random.Random(2))
    p2.rate(0.0, {}, {0: 1, 1: 1})
    opened_all(p2, 0.0)
    assert sources(p2) == {0, 1}
    assert all(p2.rate(1.0 + i, {}, {0: 1, 1: 1}) == [] for i in range(3))
    assert [p2.rate(5.0 + n, {}, {0: n, 1: 1}) for n in (2, 3)] == [[], [1]]
    assert sources(p2) == {0} and p2.kind(1) is Kind.STRANGER
    assert p2.counters["feed_dropped_idle"] == 1


def test_the_exploration_slot_rotates_even_when_every_held_source_is_live() -> None:
    """feeds_checks.py's check of the same name, on the mirror: four keys that each sent one
    valid batch held all four slots as live sources and nothing rotated (measured); beyond
    the reserved slots, the live source that delivered least recently is rotated out."""
    honest, keys = [0, 1, 2], [3, 4, 5, 6, 7]
    p = FeedPicker(8, config=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3),
                   table=Table(range(9)), rng=random.Random(3))
    p.rate(0.0, {}, {h: 1 for h in honest})
    opened_all(p, 0.0)
    key = (sources(p) - set(honest)).pop()
    p.rate(1.0, {}, {**{h: 1 for h in honest}, key: 1})  # the key's one valid batch
    for n in (2, 3):  # the honest sources go on delivering, the key does not
        p.rate(1.0 + n, {}, {**{h: n for h in honest}, key: 1})
    assert p.kinds()["live"] == 4 and key in sources(p)
    p.last_rotation = -10.0
    (new,) = p.maintain(5.0)
    assert new.replaces == key and new.peer in keys
    p.opened(new, 5.5)
    assert key not in sources(p) and set(honest) < sources(p)


def test_while_signal_flows_live_candidates_go_uniform_and_silent_live_sources_rotate() -> None:
    """feeds_checks.py's check of the same name, on the mirror: once our own groups carry
    signal, a live candidate is picked like a stranger; a held live source silent for
    probe_s is rotated out like a stranger (resting, still live), one that delivers stays."""
    table = Table(range(9))  # 8 is the node itself
    wrong = 0
    config = FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3, probe_rounds=2, probe_s=0.2)
    p = FeedPicker(8, config=config, table=table, rng=random.Random(4))
    p.rate(0.0, {}, {wrong: 1}, own=0)  # a hard task's first rounds: no signal anywhere
    assert all(p.pick(want=Kind.LIVE) == wrong for _ in range(50))
    p.rate(1.0, {}, {wrong: 2}, own=1)  # our own groups carry signal
    picks = collections.Counter(p.pick(want=Kind.LIVE) for _ in range(800))
    assert len(picks) == 8 and picks[wrong] < 800 / 8 * 1.5, picks
    # held: two live sources, one goes on delivering, one falls silent
    talks, silent = 0, 1
    p2 = FeedPicker(8, config=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=10,
                                          probe_rounds=2, probe_s=0.2),
                    table=Table(range(9)), rng=random.Random(5))
    p2.rate(0.0, {}, {talks: 1, silent: 1}, own=0)
    # the live sources open first (a tick fills OPENS_PER_TICK = 2 slots, live ones first),
    # the two strangers 0.2 s later: at the rotation they have not yet waited probe_s for a
    # frame (the product's check rotates in the same tick as the report that drops them idle,
    # before their tasks end)
    first = p2.maintain(0.0)
    assert {f.peer for f in first} == {talks, silent}
    for f in first:
        p2.opened(f, 0.5)
    for f in p2.maintain(0.5):
        p2.opened(f, 0.7)
    assert {talks, silent} < sources(p2) and p2.kinds()["live"] == 2
    for n in (2, 3, 4):
        p2.rate(0.7, {}, {talks: n, silent: 1}, own=0)
    assert p2.rate(0.8, {}, {talks: 5, silent: 1}, own=0) == []  # probe_s after its opening
    for f in p2.feeds.values():  # the live sources are the oldest
        f.started = 0.0 if f.peer in (talks, silent) else 5.0
    p2.last_rotation = -10.0
    assert not p2.starved(list(p2.feeds.values()), 0.8)  # talks delivers
    (new,) = p2.maintain(0.8)
    assert new.replaces == silent and new.peer not in (talks, silent)
    assert p2.opened(new, 1.3) == silent and talks in sources(p2) and silent in p2.rested
    # rotated out (resting, still live), not closed as idle (a stranger again)
    assert p2.counters["feed_rotated"] == 1 and p2.kind(silent) is Kind.LIVE


def test_while_nothing_arrives_rotations_come_every_wait() -> None:
    """feeds_checks.py's check of the same name, on the mirror: while every held feed is
    silent for the wait (3 of the swarm's publishing intervals, at least 1 s), a rotation
    comes every wait and takes a never-tried peer; while one feed delivers, every rotate_s.
    And ``rotation_due`` (the simulation's wake-up) is when that rotation comes."""
    table, keys, p = four_live_keys(seed=6)
    assert sources(p) == set(keys) and p.kinds()["live"] == 4, p.kinds()
    others = [5, 6, 7, 8]  # never-tried peers join
    for fresh in others:
        table.add(fresh)
    for t in range(8):  # the swarm publishes every 0.1 s: the wait is MIN_WAIT_S
        p.standing.frame(keys[0], t * 0.1)
    assert p.standing.wait_s() == MIN_WAIT_S
    for n in (2, 3):  # one held feed still delivers: no early rotation
        p.rate(1.0, {}, {**{k: 1 for k in keys}, keys[0]: n}, own=0)
    assert p.rotation_due() == 60.0
    assert p.maintain(1.0 + MIN_WAIT_S + 0.1) == [] and not p.counters["feed_rotated"]
    for _ in range(2):  # now none does
        p.rate(2.1, {}, {**{k: 1 for k in keys}, keys[0]: 3}, own=0)
    # the wait after keys[0]'s last valid group (the report at 1.0)
    due = p.rotation_due()
    assert due == 1.0 + MIN_WAIT_S
    open_ = [f for f in p.feeds.values() if f.open]
    assert not p.starved(open_, due - 0.01) and p.starved(open_, due)
    assert p.maintain(due - 0.01) == []
    (new,) = p.maintain(due)
    assert new.peer in others and new.replaces in keys and p.last_rotation == due
    p.opened(new, due + 0.5)
    assert p.counters["feed_rotated"] == 1, p.counters
    assert len(sources(p)) == 4 and len(sources(p) & set(others)) == 1
    # the new feed is not idle before probe_rounds reports; then the next rotation comes a
    # wait after its opening, not rotate_s after the last
    assert p.rotation_due() == due + 60.0
    for _ in range(2):
        p.rate(due + 1.0, {}, {**{k: 1 for k in keys}, keys[0]: 3}, own=0)
    assert p.rotation_due() == due + 0.5 + MIN_WAIT_S


def test_a_starved_rotation_takes_a_live_source_only_after_3_of_its_own_gaps() -> None:
    """swarm/feeds.py at 0dea100 (``Standing.silent_s``): while nothing arrives, a held live
    source that publishes slower than the swarm is slow, not silent, until the wait and 3 of
    its own gaps between frames have passed; the stalest live source rotates instead."""
    table, keys, p = four_live_keys()
    assert sources(p) == set(keys)
    for fresh in (5, 6, 7, 8):  # never-tried peers join
        table.add(fresh)
    slow = keys[1]
    for t in range(8):  # the swarm publishes every 0.1 s: the wait is MIN_WAIT_S
        p.standing.frame(keys[0], t * 0.1)
    for at in (0.0, 0.8):  # the slow source every 0.8 s
        p.standing.frame(slow, at)
    assert p.standing.wait_s() == MIN_WAIT_S and p.standing.silent_s(slow) == 3 * 0.8
    p.rate(1.0, {}, {**{k: 1 for k in keys}, keys[0]: 2, slow: 2}, own=0)
    p.rate(1.0, {}, {**{k: 1 for k in keys}, keys[0]: 3, slow: 2}, own=0)
    for _ in range(2):  # then nothing arrives
        p.rate(2.0, {}, {**{k: 1 for k in keys}, keys[0]: 3, slow: 2}, own=0)
    for f in p.feeds.values():  # the slow source is the oldest feed
        f.started = -1.0 if f.peer == slow else 0.0
    due = p.rotation_due()
    assert due == 1.0 + MIN_WAIT_S and p.starved(list(p.feeds.values()), due)
    (new,) = p.maintain(due)  # 1 s after its last valid group: slow, not silent
    assert new.replaces in (keys[2], keys[3]), new.replaces


def test_while_searching_each_slot_not_proven_tries_an_unrested_stranger_for_one_wait() -> None:
    """swarm/feeds.py ``FeedClient._search`` (Standing.searching): our own groups carry
    signal and no held feed brings any, so each feed whose source is not proven is replaced
    by a stranger one wait after its opening, oldest first, never-held strangers first."""
    table, keys, p = four_live_keys()
    for fresh in (5, 6, 7, 8):  # never-tried peers join
        table.add(fresh)
    for t in range(8):  # the swarm publishes every 0.1 s: the wait is MIN_WAIT_S
        p.standing.frame(keys[0], t * 0.1)
    p.rate(0.5, {}, {k: 2 for k in keys}, own=0)  # no signal anywhere: nobody is behind
    assert p.rotation_due() == 60.0 and p.maintain(MIN_WAIT_S) == []
    p.rate(1.5, {}, {k: 3 for k in keys}, own=1)  # our own groups carry signal
    assert p.rotation_due() == TICK_S + MIN_WAIT_S  # a wait after the opening
    rotated = []
    for at in (1.5, 1.6, 1.7, 1.8):
        (new,) = p.maintain(at)
        assert new.peer in (5, 6, 7, 8) and new.replaces in keys
        rotated.append(p.opened(new, at + 0.05))
    assert sorted(rotated) == keys and p.counters["feed_search_rotations"] == 4
    assert sources(p) == {5, 6, 7, 8}
    assert p.maintain(1.9) == []  # each holds its slot for the wait
    assert p.rotation_due() == 1.55 + MIN_WAIT_S


def test_mirrored_constants_match_swarm_feeds() -> None:
    # a child interpreter: libp2p cannot be imported after hivemind
    # (tests/swarm/test_feeds_units.py)
    code = (f"import json, swarm.feeds as f; print(json.dumps({{n: getattr(f, n) for n in "
            f"{list(MIRRORED)!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    drift = "swarm/feeds.py changed: bench/sim/picker.py mirrors its choice (see its docstring)"
    assert out.returncode == 0, f"{drift}\n{out.stderr[-2000:]}"
    import bench.sim.picker as picker
    assert json.loads(out.stdout) == {n: getattr(picker, n) for n in MIRRORED}, drift


def test_the_simulation_imports_neither_trio_nor_libp2p() -> None:
    """It uses swarm.feed_standing itself: a Standing that starts to need either must be
    mirrored instead (see bench/sim/picker.py)."""
    code = ("import sys, bench.sim.sybil; print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'trio', 'libp2p'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
