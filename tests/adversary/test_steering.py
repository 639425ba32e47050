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
        # what the node says it published, and when (to tell "it stopped publishing" from
        # "the observer stopped hearing it": this failed in 2 fresh-clone runs of stop 40)
        published = {r["round"]: (r["rollouts_published"], r.get("published_at"))
                     for r in rounds(run_b, name)}
        assert len(heard & set(range(ROUNDS // 2, ROUNDS))) >= ROUNDS // 4, \
            (name, sorted(heard), published, run_b["attackers"]["observe"].get("sent"))


def test_honest_generations_are_not_hijacked(run_b: dict[str, Any]) -> None:
    frac = steered_fraction(run_b, "observe", last=ROUNDS // 2)
    assert frac <= MAX_STEERED, f"{frac:.1%} of honest completions say 9999"


def test_groups_of_the_wrong_size_are_rejected_by_reason(run_b: dict[str, Any]) -> None:
    for name in run_b["nodes"]:
        rejected = learner_rejections(run_b, name)
        assert sum(rejected.get(r, 0) for r in GROUP_SIZE_REASONS) >= 2, (name, dict(rejected))
