"""The per-round record and the node report (DESIGN.md contract).

Node report keys: ``peer_id``, ``model`` (fingerprint), ``rounds`` (records with at least
``round``, ``mean_reward``, ``rollouts_published``, ``rollouts_received``, ``external_used``,
``rejected``), ``outer_steps`` (records returned by the collective's ``outer`` callback).
"""

from __future__ import annotations

from typing import Any

__all__ = ["node_report", "summarize"]


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


def node_report(*, peer_id: str, model: str, rounds: list[dict[str, Any]],
                outer_steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Assemble the JSON-able node report."""
    return {"peer_id": peer_id, "model": model, "rounds": list(rounds),
            "outer_steps": list(outer_steps), "summary": summarize(rounds), **extra}
