"""Run the simulation grid (flood vs feeds, N = 16, 100, 1000, with and without churn), calibrate
against real runs, write ``bench/results/sim.json`` and ``bench/results/sim.png``.

    PYTHONPATH=$PWD python -m bench.sim --real bench/results/sim_real_runs.json

``--real`` files are ``bench/gossip_bench.py`` outputs (rows of both modes); the cost unit is
fitted per mode on them (``bench/sim/calibrate.py``), each row is replayed to state the
simulation's error, and the flood unit prices the WAN grid (``--unit-ms`` without them).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from bench.sim.calibrate import costs_from_unit, fit_unit, replay
from bench.sim.config import Scenario, Scheme
from bench.sim.engine import Sim
from bench.sim.metrics import summarize
from protocol.files import atomic_write_bytes

log = logging.getLogger("bench.sim")

RESULTS = Path(__file__).resolve().parents[1] / "results"
FLOOD_ROUNDS_1000 = 2
"""A flood of 1,000 peers is ~6 M copies per round (N^2 D): simulated for this many rounds
only (its per-round cost is what matters; it is saturated anyway)."""


VARIANTS = ("flood", "feeds", "flood_ann", "feeds_ann")
"""``*_ann``: the peer-announcement interval grown with the swarm (N / 20 s, at least 5 s;
peer_ttl_s 3 intervals), so announcements cost a node a constant ~20 per second: the follow-up
swarm/SCALING.md names. With today's 5 s, announcements alone saturate a node's core near
N = 1,000 whatever the rollout scheme, so only the ``*_ann`` pair compares the rollout schemes
at that size on latency."""


def scheme_for(variant: str, n: int) -> Scheme:
    kind = variant.removesuffix("_ann")
    if variant.endswith("_ann"):
        interval = max(5.0, n / 20)
        return Scheme(kind=kind, announce_interval_s=interval, peer_ttl_s=3 * interval)
    return Scheme(kind=kind)


def grid(unit_ms: float, *, sizes: list[int], rounds: int, batch_bytes: int,
         churn: float, seed: int) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        for variant in VARIANTS:
            for ch in (0.0, churn):
                flood = variant.startswith("flood")
                r = FLOOD_ROUNDS_1000 if flood and n >= 1000 else rounds
                if flood and n >= 1000 and ch > 0:
                    continue  # two rounds see almost no churn; not informative
                sc = Scenario(n=n, rounds=r, churn_per_min=ch, seed=seed,
                              costs=costs_from_unit(unit_ms, batch_bytes=batch_bytes),
                              scheme=scheme_for(variant, n))
                t0 = time.monotonic()
                res = summarize(Sim(sc).run(), wall_s=time.monotonic() - t0)
                res["variant"] = variant
                res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
                log.info("%s n=%d churn=%.2f: %.1f s, inbound %.1f/round, p99 %s ms", variant, n, ch,
                         res["wall_s"], res["per_node_per_round"]["inbound_copies"]["mean"],
                         res["latency_ms"]["p99"])
                out.append(res)
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rows(variant: str) -> list[dict[str, Any]]:
        return sorted((r for r in runs if r["variant"] == variant and r["churn_per_min"] == 0),
                      key=lambda r: r["n"])

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    red, blue, grey = "tab:red", "tab:blue", "tab:gray"
    for variant, color, marker in (("flood", red, "o"), ("feeds", blue, "s")):
        rs = rows(variant)
        ns = [r["n"] for r in rs]
        axes[0].plot(ns, [r["per_node_rollouts"]["bytes_in_per_s"]["mean"] / 1e3 for r in rs],
                     color=color, marker=marker, label=f"{variant}: rollout batches in")
    for variant, style, label in (("feeds", ":", "every 5 s"), ("feeds_ann", "-.", "every N/20 s")):
        rs = rows(variant)
        ns = [r["n"] for r in rs]
        axes[0].plot(ns, [r["per_node_announcements"]["bytes_in_per_s"] / 1e3 for r in rs],
                     color=grey, marker="^", linestyle=style, label=f"peer announcements {label}")
        axes[2].plot(ns, [r["per_node_announcements"]["cpu_ms_per_s"] / 1e3 for r in rs],
                     color=grey, marker="^", linestyle=style, label=f"peer announcements {label}")
    for variant, color, marker in (("flood_ann", red, "o"), ("feeds_ann", blue, "s")):
        rs = rows(variant)
        ns = [r["n"] for r in rs]
        name = variant.removesuffix("_ann")
        axes[1].plot(ns, [r["latency_ms"]["p50"] or 0 for r in rs], color=color, marker=marker,
                     label=f"{name} p50")
        axes[1].plot(ns, [r["latency_ms"]["p99"] or 0 for r in rs], color=color, marker=marker,
                     linestyle="--", label=f"{name} p99")
        axes[2].plot(ns, [r["per_node_rollouts"]["cpu_ms_per_s"]["mean"] / 1e3 for r in rs],
                     color=color, marker=marker, label=f"{name}: rollout traffic")
    axes[2].axhline(1.0, color="black", linewidth=0.8, label="one core (trio loop)")
    titles = ("per-node inbound bandwidth (kB/s)",
              "batch latency, publish to first copy (ms)\n(announcements every N/20 s)",
              "per-node CPU (cores)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("peers N")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("bench/sim: today's flood vs receiver-chosen feeds (WAN model, calibrated costs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", nargs="*", default=[], help="bench/gossip_bench.py outputs")
    ap.add_argument("--unit-ms", type=float, default=2.0, help="cost unit without --real")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 100, 1000])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--churn", type=float, default=0.1, help="fraction of peers leaving per minute")
    ap.add_argument("--batch-bytes", type=int, default=16_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "sim.json"))
    ap.add_argument("--png", default=str(RESULTS / "sim.png"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.monotonic()
    result: dict[str, Any] = {"command": "python -m bench.sim " + " ".join(
        f"{k}={v}" for k, v in vars(args).items()), "loadavg_start": list(os.getloadavg())}
    unit = args.unit_ms
    rows = [r for path in args.real for r in json.loads(Path(path).read_text())["runs"]]
    if rows:
        calibration: dict[str, Any] = {"real_rows": rows}
        for mode in ("flood", "feeds"):
            mine = [r for r in rows if r["mode"] == mode]
            if mine:
                fit = fit_unit(mine)
                calibration[mode] = {"fit": fit, "replays": [replay(r, fit["unit_ms"]) for r in mine]}
                log.info("%s: unit %.2f ms, replays %s", mode, fit["unit_ms"],
                         [x["relative_error"] for x in calibration[mode]["replays"]])
        result["calibration"] = calibration
        if "flood" in calibration:
            unit = calibration["flood"]["fit"]["unit_ms"]
    result["unit_ms"] = unit
    result["runs"] = grid(unit, sizes=args.sizes, rounds=args.rounds, batch_bytes=args.batch_bytes,
                          churn=args.churn, seed=args.seed)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    out = Path(args.out)
    atomic_write_bytes(out, json.dumps(result, indent=1).encode())
    plot(result["runs"], Path(args.png))
    log.info("wrote %s and %s in %.0f s", out, args.png, result["wall_s"])


if __name__ == "__main__":
    main()
