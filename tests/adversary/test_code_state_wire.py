"""Run A: code execution, a CPU/memory bomb, unknown keys, bad pubsub signatures and a
DiLoCo takeover, all at once against two honest nodes (see conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adversary.checks import (
    assert_completed_in_bounded_time,
    assert_reward_within_noise,
    assert_rss_bounded,
)
from tests.adversary.expect import (
    FAMILY_REASONS,
    PUBSUB_SIGNATURE_REASONS,
    UNKNOWN_KEY_REASONS,
    gossip_rejections,
    learner_rejections,
    rejected_commits,
)

pytestmark = pytest.mark.slow

TAKEOVER_STEP = 10**6
SWARM_CPU_FACTOR = 3.0
"""Swarm process CPU per second of run may be at most this multiple of the baseline's
(plus 3 % of a core). On main each of these floods alone cost 3.7-5x (bench/adversary.py;
the issue measured 28-41x against a quieter baseline)."""


def _count(counter: Any, reasons: tuple[str, ...]) -> int:
    return sum(counter.get(r, 0) for r in reasons)


def test_every_attacker_of_run_a_attacked(run_a: dict[str, Any]) -> None:
    """Guards against a vacuous pass: each hostile process reached the victims and sent."""
    sent = {name: a.get("sent", {}) for name, a in run_a["attackers"].items()}
    assert sent["code_exec"].get("rollouts", 0) >= 7 * 5, sent
    assert sent["cpu_bomb"].get("messages", 0) == 1, sent
    assert sent["unknown_keys"].get("messages", 0) >= 50, sent
    assert sent["bad_signatures"].get("messages", 0) >= 1000, sent
    assert sent["diloco_takeover"].get("stores", 0) >= 2, sent


def test_no_remote_text_is_evaluated(run_a: dict[str, Any]) -> None:
    assert run_a["markers"] == [], f"code from a peer ran: {run_a['markers'][:10]}"
    for name in run_a["nodes"]:
        rejected = learner_rejections(run_a, name)
        assert _count(rejected, FAMILY_REASONS) >= 7, (name, dict(rejected))


def test_cpu_and_memory_of_re_scoring_are_bounded(run_a: dict[str, Any],
                                                  baseline: dict[str, Any]) -> None:
    assert_completed_in_bounded_time(run_a, baseline)
    assert_rss_bounded(run_a, baseline)


def test_unknown_keys_and_bad_signatures_are_counted_and_cheap(
        run_a: dict[str, Any], baseline: dict[str, Any]) -> None:
    for name, node in run_a["nodes"].items():
        rejected = gossip_rejections(run_a, name)
        # a defence may graylist the sender after a few: at least those are counted
        assert _count(rejected, UNKNOWN_KEY_REASONS) >= 5, (name, dict(rejected))
        assert _count(rejected, PUBSUB_SIGNATURE_REASONS) >= 5, (name, dict(rejected))
        base = baseline["nodes"][name]["swarm_cpu_s"] / baseline["seconds"]
        got = node["swarm_cpu_s"] / run_a["seconds"]
        assert got <= SWARM_CPU_FACTOR * base + 0.03, (
            name, f"swarm CPU {got:.3f} core under attack vs {base:.3f} without")


def test_diloco_takeover_is_rejected_and_honest_state_kept(run_a: dict[str, Any]) -> None:
    attacker = run_a["attackers"]["diloco_takeover"]
    bad_hash = attacker["state_hash"]
    for name, node in run_a["nodes"].items():
        steps = node["report"]["outer_steps"]
        assert steps, name
        for o in steps:
            assert o["step"] < TAKEOVER_STEP and o["param_hash"] != bad_hash, (name, o)
    # non-vacuity: the forged commit was read and refused. Per run, not per node: a node may
    # take its few catch-ups before the attacker's first store reaches the DHT (30 rounds can
    # last seconds), and refusing nothing it never saw is fine. A finished node's catch-ups at
    # the meetings it attends emit no record unless it steps: its log says what it refused
    assert sum(rejected_commits(run_a, name) + node["refused_commit_lines"]
               for name, node in run_a["nodes"].items()) >= 1, \
        {name: node["report"]["outer_steps"][-1] for name, node in run_a["nodes"].items()}
    # the honest pair still averages together
    assert any(o["status"] == "ok" and o["peers"] >= 2 for node in run_a["nodes"].values()
               for o in node["report"]["outer_steps"])
