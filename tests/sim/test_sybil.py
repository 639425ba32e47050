"""The Sybil-farm simulation (bench/sim/sybil.py) and its mirror of swarm/feeds.py's picker."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys

import pytest

from bench.sim.picker import MIRRORED, FeedPicker, Table
from bench.sim.sybil import SybilScenario, run
from bench.sim.sybil_grid import farm_sizes
from swarm.config import FeedsConfig

K = FeedsConfig().sources


def honest_slots(farm: str, farm_size: int, policy: str, *, n: int = 16) -> float:
    """Mean over 3 seeds of the honest feeds a node holds in rounds 61..120."""
    return statistics.fmean(run(SybilScenario(n=n, farm_size=farm_size, farm=farm, policy=policy,
                                              rounds=120, seed=s))["honest_slots"]
                            for s in range(3))


def test_new_policy_keeps_all_but_the_exploration_slot_against_a_farm_of_4n() -> None:
    new, old = honest_slots("idle", 64, "new"), honest_slots("idle", 64, "old")
    assert new >= K - FeedsConfig().explore_slots - 0.1, new
    # by keys: 15 honest of 79 -> 4 * 15 / 79 = 0.76 honest slots
    assert 0.5 <= old <= 1.0, old


def test_a_minting_farm_takes_every_slot_from_the_old_policy_only() -> None:
    # fresh keys went first: a farm that mints one every 8 s holds them all (issue 32)
    assert honest_slots("mint", 4, "old") < 0.3
    assert honest_slots("mint", 4, "new") >= K - 1.1


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


def test_picker_mirrors_the_feed_clients_choice() -> None:
    """tests/swarm/feeds_checks.py's check of FeedClient (issue 32), on the mirror: 3 honest
    sources among 20 keys, k = 4, trial_rounds = 3."""
    table = Table(range(24))  # 23 is the node itself
    honest = [0, 1, 2]
    p = FeedPicker(23, config=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3),
                   table=table, rng=random.Random(1))
    assert p.want_proven([]) is None
    picks = [p.pick() for _ in range(2000)]
    assert 23 not in picks and sum(x in honest for x in picks) < 2000 * 3 / 23 * 1.4
    p.rate(0.0, {h: 5 for h in honest})
    started = p.maintain(0.0) + p.maintain(0.5)  # OPENS_PER_TICK = 2 a tick
    for f in started:
        p.opened(f, 1.0)
    held = {f.peer for f in p.feeds.values() if f.open}
    assert set(honest) < held and len(held) == 4
    key = (held - set(honest)).pop()
    # a rotation whose oldest is proven, with no other proven source free: it stays
    for f in p.feeds.values():
        f.started = 0.0 if f.peer == honest[0] else 5.0
    p.last_rotation = -10.0
    assert p.maintain(1.0) == [] and p.last_rotation == 1.0
    for n in range(6, 9):  # the key never delivers: closed after 3 reports, cooled
        closed = p.rate(2.0, {h: n for h in honest})
    assert closed == [key] and key in p.cooldown and key in p.idle and not p.proven(key)
    assert p.cooldown[key] == 2.0 + 5.0 and p.counters == {"feed_dropped_idle": 1}
    (gap,) = p.maintain(2.5)
    assert gap.peer not in honest and gap.peer != key  # the slot goes to another key
    assert p.want_proven(list(p.feeds.values())) is False
    assert p.pick(proven=True, strict=True) is None and p.pick(proven=True) not in honest
    # nobody is judged while no feed delivers; then a source that stops while another goes on
    p2 = FeedPicker(9, config=FeedsConfig(sources=2, trial_rounds=2), table=Table([0, 1, 9]),
                    rng=random.Random(2))
    p2.rate(0.0, {})
    for f in p2.maintain(0.0):
        p2.opened(f, 0.1)
    assert all(p2.rate(1.0, {}) == [] for _ in range(3))
    assert p2.rate(2.0, {0: 1}) == [1] and not p2.proven(1) and list(p2.feeds) == [0]


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
