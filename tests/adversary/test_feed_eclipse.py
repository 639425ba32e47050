"""A farm of fresh identities against three honest nodes' feeds (issue 32), as real processes.

One run: a bootstrap, three honest ``join`` nodes in feeds mode and the hostile farm
(tests/adversary/feeds.py) that announces 24 keys like honest peers and serves every feed it
is asked for badly, each key in one of the three ways in turn: idle (sends nothing), wrong
(a valid, signed batch of all-wrong groups every second) and trickle (the same every 15 s);
and it mints one more fresh key every 4 s. With the pick of issue 32 (uniform over keys,
never-held keys first) such a farm took ~90 % of a node's slots and a minting one kept honest
sources out for good (honest external groups 3.07 -> 0.03 per round).

What is asserted does not hang on when the tiny model's learning takes off (the ratio of
external groups used to a no-attack run does: bench/feed_eclipse.py measures that, with
repeats): once the first rounds are over, the honest nodes receive rollouts from honest peers
in most of their rounds (the mean share over the three nodes), and the keys are counted where
they were dropped. Measured: 0.82-1.0 per node in 3 runs (load 3 on 2 cores, 31 s each).
The threshold is the mean, not each node's: about one node in 50-100 of the benchmark's
received nothing from an honest peer in its 60 rounds (its feeds never held one, and for
some rounds it had no candidate at all: not yet explained), and one such node in a run leaves
a mean of about 0.6. With the pick of before, a minting farm left two of three nodes without
an honest feed for good (a mean near 0).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.adversary.attacks import Attack
from tests.adversary.harness import Plan, honest_identity, run_swarm

pytestmark = pytest.mark.slow

ROUNDS = 60
"""The embedded model's rounds take 0.2-1 s: 60 rounds are 20-40 s, long enough for the keys
to be probed out (the wait is 1-10 s) and short enough for a CI lane."""
SETTLED = 15
"""Rounds left for the feeds to find the honest peers among the farm's keys."""
MINT_S = 4.0
FROM_HONEST = 0.5
"""The least share of settled rounds with rollouts from an honest peer (mean over the three
nodes)."""


@pytest.fixture(scope="module")
def farm_run() -> dict[str, Any]:
    attack = {"mode": "mixed", "identities": 24, "mint_every_s": MINT_S}
    return run_swarm(Plan(rounds=ROUNDS, honest=3, rollout_mode="feeds", every_rounds=10**6,
                          timeout_s=300.0, attacks=((Attack.FEED_SYBIL, attack),)))


def test_a_mixed_minting_farm_does_not_keep_honest_peers_out_of_the_feeds(farm_run) -> None:
    run = farm_run
    assert not run["timed_out"]
    farm = run["attackers"]["feed_sybil"]
    assert farm["event"] == "done", farm  # the farm reports, even past finished victims
    # (an identity whose host failed, e.g. dialling a victim that finished, is not counted)
    assert farm["identities"] >= 20 and farm["sent"]["feeds"] >= 3, farm
    honest = {honest_identity(n).peer_id for n in run["nodes"]}
    shares: dict[str, float] = {}
    for name, node in run["nodes"].items():
        rounds = node["report"]["rounds"][SETTLED:]
        assert len(rounds) == ROUNDS - SETTLED, (name, node["report"].get("log"))
        senders = [set(r["rollouts_from"]) & honest for r in rounds]
        shares[name] = sum(map(bool, senders)) / len(rounds)
    print(f"share of settled rounds with rollouts from an honest peer: {shares}; farm {farm}")
    assert sum(shares.values()) / len(shares) >= FROM_HONEST, shares
    # every node tried keys and closed some for bringing nothing (the idle ones; the
    # trickling ones between their batches), and says so in its round records
    last = {n: node["report"]["rounds"][-1]["feeds"] for n, node in run["nodes"].items()}
    assert all(f["dropped_idle"] >= 1 for f in last.values()), last
