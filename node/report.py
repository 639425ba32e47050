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
    runs), ``heldout`` (the held-out scores carried by the rounds, oldest first); ``extra``
    for anything useful (restarts, exit reason...)."""
    return {"peer_id": peer_id, "model": model, "rounds": rounds, "outer_steps": outer_steps,
            "compute_utilisation": next((r["compute_utilisation"] for r in reversed(rounds)
                                         if r.get("compute_utilisation") is not None), None),
            "discarded_rounds": discarded_rounds(outer_steps),
            "heldout": [r["heldout"] for r in rounds if isinstance(r.get("heldout"), dict)],
            **extra}


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


def moving_average(xs: list[float], k: int) -> list[float]:
    """Trailing mean over the last ``k`` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def smoothing_window(n: int) -> int:
    """The moving-average window the plots use for a curve of ``n`` points (1: none)."""
    return 1 if n < 20 else max(5, n // 15)


def learning(rounds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a node learned over its rounds: its mean training accuracy over the first and
    the last tenth of them (at least one round each), and its first and last held-out greedy
    accuracy, when scored. None without a round that has an accuracy."""
    acc = [float(r["accuracy"]) for r in rounds if isinstance(r.get("accuracy"), (int, float))]
    if not acc:
        return None
    k = max(1, len(acc) // 10)
    out: dict[str, Any] = {"window": k, "first": sum(acc[:k]) / k, "last": sum(acc[-k:]) / k}
    held = heldout_points(rounds)
    if held:
        out["heldout_first"] = {"after_rounds": held[0][0], "greedy": held[0][1]}
        out["heldout_last"] = {"after_rounds": held[-1][0], "greedy": held[-1][1]}
    return out


def heldout_points(rounds: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(rounds trained, greedy accuracy, sampled accuracy) of every held-out score in a
    node's round records (``heldout``, every ``eval_every`` rounds)."""
    out = []
    for r in rounds:
        h = r.get("heldout")
        if isinstance(h, dict) and isinstance(h.get("greedy_accuracy"), (int, float)):
            out.append((int(h.get("after_rounds", r["round"] + 1)), float(h["greedy_accuracy"]),
                        float(h.get("sampled_accuracy") or 0.0)))
    return out


def plot_rewards(nodes: list[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """One reward curve per node (round → mean reward of its local rollouts; past 20 rounds
    thin, under its moving average, so a rise shows through the noise) and, when any
    node scored the held-out set, a second panel: per node its training accuracy (thin) and
    held-out greedy (solid, dots) and sampled (dashed) accuracy, against rounds trained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    heldout = any(heldout_points(n.get("rounds", [])) for n in nodes)
    fig, axes = plt.subplots(1, 2 if heldout else 1, figsize=(12 if heldout else 7, 4),
                             squeeze=False)
    ax = axes[0][0]
    for node in nodes:
        pts = [(r["round"], r["mean_reward"]) for r in node.get("rounds", [])
               if r.get("mean_reward") is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        name, window = str(node.get("peer_id", "?"))[-8:], smoothing_window(len(pts))
        if window == 1:
            ax.plot(xs, ys, marker="o", ms=3, label=name)
            continue
        line, = ax.plot(xs, ys, lw=0.6, alpha=0.35)
        ax.plot(xs, moving_average(list(ys), window), color=line.get_color(), lw=2,
                label=f"{name} (mean of {window} rounds)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("mean reward (local rollouts)")
    ax.set_title(title or "swarm-node reward per node")
    ax.grid(alpha=0.3)
    if nodes:
        ax.legend(fontsize=7)
    if heldout:
        _plot_accuracy(axes[0][1], nodes)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def _plot_accuracy(ax: Any, nodes: list[dict[str, Any]]) -> None:
    from matplotlib.ticker import MaxNLocator

    for i, node in enumerate(nodes):
        color, name = f"C{i % 10}", str(node.get("peer_id", "?"))[-8:]
        train = [(r["round"], r["accuracy"]) for r in node.get("rounds", [])
                 if isinstance(r.get("accuracy"), (int, float))]
        if train:
            xs, ys = zip(*train)
            ax.plot(xs, ys, color=color, lw=0.7, alpha=0.5, label=f"{name} training")
        pts = heldout_points(node.get("rounds", []))
        if pts:
            xs, greedy, sampled = zip(*pts)
            ax.plot(xs, greedy, color=color, marker="o", ms=4, label=f"{name} held-out greedy")
            ax.plot(xs, sampled, color=color, ls="--", marker="x", ms=4,
                    label=f"{name} held-out sampled")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("rounds trained")
    ax.set_ylabel("accuracy")
    ax.set_title("training vs held-out accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
