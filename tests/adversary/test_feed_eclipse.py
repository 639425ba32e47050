"""A farm of fresh identities against three honest nodes' feeds (issue 32), as real processes.

One run: a bootstrap, three honest ``join`` nodes in feeds mode and the hostile farm
(tests/adversary/feeds.py) that announces 20 keys like honest peers, serves every feed it is
asked for and sends nothing, and mints one more fresh key every 4 s: the variant that, with
a uniform pick (never-held keys first), kept honest sources out for good (issue 32: honest
external groups 3.07 -> 0.03 per round). A key that delivers nothing must not hold a slot
for more than a few rounds, and an honest source must keep its slot from its first valid
group, before its groups carry signal.

What is asserted does not hang on when the tiny model's learning takes off (the ratio of
external groups used to a no-attack run does; bench/feed_eclipse.py measures that, with
repeats): once the first rounds are over, every honest node receives rollouts from an honest
peer in at least 80 % of its rounds and from one or more per round on average; no key of the
farm ever counts as a live or proven source (they deliver nothing); the round records count
keys dropped as idle. With the pick of before (uniform over keys, honest sources rotated out
before their groups carried signal) a node got rollouts from an honest peer in 64 % of its
rounds (one run). Measured with this pick: passed in 2 of 3 runs beside other users' jobs
(load 6-9 on 2 cores); 52-65 s.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.adversary.attacks import Attack
from tests.adversary.harness import Plan, honest_identity, run_swarm

pytestmark = pytest.mark.slow

ROUNDS = 60
"""The embedded model's rounds take 0.2-1 s: 60 rounds are 20-40 s, long enough for the idle
keys to be probed out (``feeds.probe_s`` 10 s) and short enough for the ~60 s budget."""
SETTLED = 15
"""Rounds left for the feeds to find the honest peers among the farm's keys."""
MINT_S = 4.0


@pytest.fixture(scope="module")
def farm_run() -> dict[str, Any]:
    attack = {"mode": "idle", "identities": 20, "mint_every_s": MINT_S}
    return run_swarm(Plan(rounds=ROUNDS, honest=3, rollout_mode="feeds", every_rounds=10**6,
                          timeout_s=300.0, attacks=((Attack.FEED_SYBIL, attack),)))


def test_a_minting_farm_of_idle_keys_does_not_keep_honest_peers_out_of_the_feeds(farm_run):
    run = farm_run
    assert not run["timed_out"]
    farm = run["attackers"]["feed_sybil"]
    assert farm["event"] == "done", farm  # the farm reports, even past finished victims
    assert farm["identities"] >= 20 and farm["sent"]["feeds"] >= 3, farm
    honest = {honest_identity(n).peer_id for n in run["nodes"]}
    for name, node in run["nodes"].items():
        rounds = node["report"]["rounds"][SETTLED:]
        assert len(rounds) == ROUNDS - SETTLED, (name, node["report"].get("log"))
        senders = [set(r["rollouts_from"]) & honest for r in rounds]
        from_honest = sum(map(bool, senders)) / len(rounds)
        per_round = sum(map(len, senders)) / len(rounds)
        # the pick of before (one run on the 2-core box): 0.64 of rounds from an honest peer
        assert from_honest >= 0.8 and per_round >= 1.0, (name, [sorted(s) for s in senders])
        held = [r["feeds"]["proven"] + r["feeds"].get("live", 0) for r in rounds]
        assert max(held) <= 2, (name, held)  # the farm's keys never earned a kind
        last = node["report"]["rounds"][-1]["feeds"]
        assert last["dropped_idle"] >= 2, (name, last)  # they were tried and dropped as idle
