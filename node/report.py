"""Node and swarm reports (DESIGN.md contract) and the reward-curve plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from protocol import atomic_write_bytes


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())


def node_report(*, peer_id: str, model: str | None, rounds: list[dict[str, Any]],
                outer_steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Contract keys first, then ``compute_utilisation`` (time in inner rounds ÷ wall time
    of the learner's round loop, as of its last round; None before one) and
    ``discarded_rounds`` (inner rounds whose work an outer step dropped, over all learner
    runs); ``extra`` for anything useful (restarts, exit reason...)."""
    return {"peer_id": peer_id, "model": model, "rounds": rounds, "outer_steps": outer_steps,
            "compute_utilisation": next((r["compute_utilisation"] for r in reversed(rounds)
                                         if r.get("compute_utilisation") is not None), None),
            "discarded_rounds": discarded_rounds(outer_steps), **extra}


def discarded_rounds(outer_steps: list[dict[str, Any]]) -> int:
    """Sum of the outer loop's running ``discarded_rounds`` totals (one per learner run: a
    total that goes down means the learner restarted and counts from 0 again)."""
    total = last = 0
    for step in outer_steps:
        n = step.get("discarded_rounds")
        if not isinstance(n, int):
            continue
        if n < last:
            total += last
        last = n
    return total + last


def plot_rewards(nodes: list[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """One reward curve per node (round → mean reward of its local rollouts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for node in nodes:
        pts = [(r["round"], r["mean_reward"]) for r in node.get("rounds", [])
               if r.get("mean_reward") is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", ms=3, label=str(node.get("peer_id", "?"))[-8:])
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("mean reward (local rollouts)")
    ax.set_title(title or "swarm-node reward per node")
    ax.grid(alpha=0.3)
    if nodes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
