"""Run B: one identity steering with valid tiny_add groups of 64 and 8, and 20 Sybil
identities doing the same, against two honest nodes (see conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adversary.checks import assert_completed_in_bounded_time, assert_reward_within_noise
from tests.adversary.conftest import ROUNDS
from tests.adversary.expect import (GROUP_SIZE_REASONS, learner_rejections, rounds,
                                   steered_fraction)

pytestmark = pytest.mark.slow

MAX_STEERED = 0.02
"""Most of the honest nodes' own completions in the second half of the run that may be the
steered answer "9999" (a cold-start policy never writes it; main after 30 rounds: 4.7-7.3 %,
rising; the issue's 96-99 % came from a longer run)."""


def test_every_attacker_of_run_b_attacked(run_b: dict[str, Any]) -> None:
    steering, sybil = run_b["attackers"]["steering"], run_b["attackers"]["sybil"]
    assert steering.get("sent", {}).get("messages", 0) >= 30, steering
    assert len(set(sybil.get("peer_ids", []))) == 20, sybil
    assert sybil.get("sent", {}).get("messages", 0) >= 100, sybil
    observed = run_b["attackers"]["observe"].get("observed", {})
    for name, node in run_b["nodes"].items():  # the silent observer heard the second half
        heard = {int(r) for r in observed.get(node["peer_id"], {})}
        assert len(heard & set(range(ROUNDS // 2, ROUNDS))) >= ROUNDS // 4, \
            _not_heard(run_b, name, observed.get(node["peer_id"], {}))


def _not_heard(run: dict[str, Any], name: str, heard: dict[str, list[Any]]) -> str:
    """Why the observer may not have heard node ``name``: what the node published and when,
    what the observer heard and when, the link as each end saw it at the end."""
    node, observe = run["nodes"][name], run["attackers"]["observe"]
    records = rounds(run, name)
    last = records[-1] if records else {}
    published = [(r["round"], r["rollouts_published"], r.get("published_at")) for r in records]
    heard_at = [(int(k), v[-1]) for k, v in heard.items()]
    link = observe.get("links", {}).get(node["peer_id"])
    return (f"{name}: published {published}; observer heard {heard_at}; observer's link "
            f"{link}, counters {observe.get('observer_counters')}; node's last pubsub_peers "
            f"{last.get('pubsub_peers')}, rollout subscribers by round "
            f"{[r.get('rollout_subscribers') for r in records]}, dropped "
            f"{last.get('gossip_dropped')}")


def test_honest_generations_are_not_hijacked(run_b: dict[str, Any]) -> None:
    frac = steered_fraction(run_b, "observe", last=ROUNDS // 2)
    assert frac <= MAX_STEERED, f"{frac:.1%} of honest completions say 9999"


def test_groups_of_the_wrong_size_are_rejected_by_reason(run_b: dict[str, Any]) -> None:
    for name in run_b["nodes"]:
        rejected = learner_rejections(run_b, name)
        assert sum(rejected.get(r, 0) for r in GROUP_SIZE_REASONS) >= 2, (name, dict(rejected))
