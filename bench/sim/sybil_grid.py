"""The Sybil-farm grid (issue 32): honest-slot share vs farm size at N = 16, 100, 1,000,
for the feed-source picker before issue 32 (``old``) and now (``new``); JSON and PNG.

Each cell (N, F, farm, policy) runs ``bench/sim/sybil.py`` with several seeds and reports
the mean and [min, max] over them of: the honest share of a node's k feed slots at steady
state (the second half of the rounds), the nodes with no honest feed, the honest groups
received per round, as a ratio to the same policy's run without a farm (same seed), and the
farm's groups the learner re-scores. ``trickle`` is not in the grid (a slower ``wrong``: valid
groups without signal; it costs another ~20 % of the grid's time).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.sim.sybil import POLICIES, SybilScenario, run

__all__ = ["SIMULATED", "farm_sizes", "grid", "plot", "summarize"]

log = logging.getLogger(__name__)

SIMULATED = ("idle", "wrong", "mint", "signal")
BASELINE = "none"
"""The farm name of F = 0 (no farm; ``mint`` at F = 0 starts empty and mints)."""
METRICS = ("honest_slots", "honest_slot_share", "sybil_slots", "no_honest_feed",
           "honest_signal_per_round", "honest_useful_per_round", "usable_per_round",
           "sybil_signal_per_round", "sybil_groups_per_round")
CHECKPOINTS = (1, 10, 30, 60, 120)
"""Rounds at which a row states the mean honest feeds held (how fast the picker recovers)."""
RATIOS = {"honest_useful_ratio": "honest_useful_per_round", "usable_ratio": "usable_per_round"}


def farm_sizes(n: int) -> list[int]:
    """0, N/4, N, 4N, and 50 where it is not below N/4 (at N = 1,000 it adds nothing)."""
    sizes = {0, n // 4, n, 4 * n}
    if 50 >= n // 4:
        sizes.add(50)
    return sorted(sizes)


def cells(n: int) -> list[tuple[int, str]]:
    """(F, farm) of one N: the baseline, mint from an empty farm, every farm at F > 0."""
    return [(0, BASELINE), (0, "mint")] + [(f, farm) for f in farm_sizes(n) if f
                                            for farm in SIMULATED]


LARGE = 1000
"""From this N on, a grid runs ``large_seeds`` seeds: a run averages N nodes, so its seeds
differ little (and one costs ~3 s of a core at N = 1,000, 120 rounds)."""


def grid(*, sizes: Sequence[int], seeds: int, large_seeds: int,
         rounds: int, farm_networks: int = 0) -> list[dict[str, Any]]:
    """Every cell of every N, both policies, seeds 0 .. seeds - 1 (``large_seeds`` from N =
    ``LARGE``), the farm in ``farm_networks`` networks (``SybilScenario``): ``sybil.run``'s
    results."""
    out = []
    for n in sizes:
        t0 = time.monotonic()
        for policy in POLICIES:
            for f, farm in cells(n):
                for seed in range(large_seeds if n >= LARGE else seeds):
                    sc = SybilScenario(n=n, farm_size=f, farm="idle" if farm == BASELINE else farm,
                                       policy=policy, rounds=rounds, seed=seed,
                                       farm_networks=farm_networks)
                    res = run(sc)
                    res["farm"] = farm
                    out.append(res)
        log.info("n=%d: %d runs in %.1f s", n, sum(r["n"] == n for r in out),
                 time.monotonic() - t0)
    return out


def _spread(xs: list[float], digits: int = 3) -> dict[str, float]:
    return {"mean": round(statistics.fmean(xs), digits), "min": round(min(xs), digits),
            "max": round(max(xs), digits)}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (N, F, farm, policy): each metric's mean and range over the seeds, the
    ratios to the baseline, the mean honest slots per round."""
    base = {(r["n"], r["policy"], r["seed"]): r for r in runs if r["farm"] == BASELINE}
    groups: dict[tuple[int, int, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["n"], r["farm_size"], r["farm"], r["policy"]), []).append(r)
    rows = []
    for (n, f, farm, policy), rs in groups.items():
        row: dict[str, Any] = {"n": n, "farm_size": f, "farm": farm, "policy": policy,
                               "seeds": [r["seed"] for r in rs],
                               "farm_at_end": max(r["farm_at_end"] for r in rs)}
        for m in METRICS:
            row[m] = _spread([r[m] for r in rs])
        for name, m in RATIOS.items():
            row[name] = _spread([r[m] / base[(n, policy, r["seed"])][m] for r in rs])
        series = [r["honest_slots_per_round"] for r in rs]
        row["honest_slots_per_round"] = [round(statistics.fmean(xs), 3) for xs in zip(*series)]
        row["honest_slots_at_round"] = {r: row["honest_slots_per_round"][r - 1]
                                        for r in CHECKPOINTS if r <= len(series[0])}
        rows.append(row)
    return rows


def _symlog(ax: Any) -> None:
    ax.set_xscale("symlog", linthresh=4)
    ax.set_xlim(left=-0.5)
    ax.set_xlabel("farm size F (Sybil identities)")
    ax.grid(True, which="both", alpha=0.3)


def plot(rows: list[dict[str, Any]], path: Path, *, k: int, explore: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(3, len(sizes), figsize=(5 * len(sizes), 12), squeeze=False)
    colors = {"old": "tab:red", "new": "tab:blue"}
    styles = {"idle": ("-", "o"), "wrong": ("-.", "d"), "mint": ("--", "s"),
              "signal": (":", "^")}

    def line(ax: Any, n: int, policy: str, farm: str, y: Callable[[dict[str, Any]], Any]) -> None:
        rs = sorted((r for r in rows if r["n"] == n and r["policy"] == policy
                     and (r["farm"] == farm or r["farm"] == BASELINE and farm != "mint")),
                    key=lambda r: r["farm_size"])
        xs = [r["farm_size"] for r in rs]
        mean = [y(r)["mean"] for r in rs]
        err = [[m - y(r)["min"] for m, r in zip(mean, rs)],
               [y(r)["max"] - m for m, r in zip(mean, rs)]]
        ls, marker = styles[farm]
        ax.errorbar(xs, mean, yerr=err, color=colors[policy], linestyle=ls, marker=marker,
                    capsize=3, label=f"{policy}, {farm}")

    for col, n in enumerate(sizes):
        for policy in POLICIES:
            for farm in SIMULATED:
                line(axes[0][col], n, policy, farm, lambda r: r["honest_slot_share"])
                line(axes[1][col], n, policy, farm, lambda r: r["honest_useful_ratio"])
        axes[0][col].axhline((k - explore) / k, color="black", linewidth=0.8,
                             label=f"(k - explore_slots) / k = {(k - explore) / k:.2f}")
        axes[0][col].set_title(f"N = {n}: honest share of a node's {k} feed slots", fontsize=10)
        axes[1][col].set_title(f"N = {n}: honest useful groups per round / no farm", fontsize=10)
        for ax in axes[0][col], axes[1][col]:
            _symlog(ax)
            ax.set_ylim(-0.03, 1.1)
            ax.legend(fontsize=7)
        ax = axes[2][col]
        for r in rows:
            if r["n"] == n and r["farm_size"] == 4 * n and r["farm"] in ("idle", "wrong", "mint"):
                ls, _ = styles[r["farm"]]
                ax.plot(range(1, len(r["honest_slots_per_round"]) + 1), r["honest_slots_per_round"],
                        color=colors[r["policy"]], linestyle=ls,
                        label=f"{r['policy']}, {r['farm']}")
        ax.set_title(f"N = {n}, F = 4N = {4 * n}: honest feeds held, per round", fontsize=10)
        ax.set_xlabel("the node's learner round (10 s)")
        ax.set_ylim(-0.1, k + 0.1)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("bench/sim sybil: feed sources picked uniformly over keys (old) vs by what they "
                 "deliver (new, swarm/feeds.py)\nmean and range over seeds; steady state = second "
                 "half of the rounds; mint at F = 0: a farm that starts empty", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
