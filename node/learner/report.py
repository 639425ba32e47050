"""The ``summary`` of a learner's node report: totals over its per-round records.

The report itself (DESIGN.md contract: ``peer_id``, ``model``, ``rounds``, ``outer_steps``) is
built by ``node.report.node_report``; ``run_learner`` adds this summary to it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["summarize"]


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the rounds this run completed."""
    if not rounds:
        return {"rounds": 0}
    n = len(rounds)
    k = max(1, n // 5)
    return {
        "rounds": n,
        "mean_reward": sum(r["mean_reward"] for r in rounds) / n,
        "mean_reward_first": sum(r["mean_reward"] for r in rounds[:k]) / k,
        "mean_reward_last": sum(r["mean_reward"] for r in rounds[-k:]) / k,
        "rollouts_published": sum(r["rollouts_published"] for r in rounds),
        "rollouts_received": sum(r["rollouts_received"] for r in rounds),
        "external_used": sum(r["external_used"] for r in rounds),
        "rejected": sum(r["rejected"] for r in rounds),
        "tokens_generated": sum(r["tokens_generated"] for r in rounds),
        "seconds": sum(sum(r["seconds"].values()) for r in rounds),
    }

