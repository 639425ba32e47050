"""Run the simulation grid (flood vs feeds, N = 16, 100, 1000, with and without churn), calibrate
against real runs, write ``bench/results/sim.json`` and ``bench/results/sim.png``.

    PYTHONPATH=$PWD python -m bench.sim calibrate \
        --quiet bench/results/gossip_quiet_16.json bench/results/gossip_quiet_8_32.json
                                                 # -> bench/results/sim_calibration.json
    PYTHONPATH=$PWD python -m bench.sim grid     # -> bench/results/sim.json, sim.png
    PYTHONPATH=$PWD python -m bench.sim sybil    # -> bench/results/sim_sybil.json, sim_sybil.png

``--real`` / ``--quiet`` files are ``bench/gossip_bench.py`` outputs (rows of both modes, e.g.
from ``bench/sim/realbench.py``; ``--quiet``: measured with the machine to themselves); each row's cost unit is fitted by replaying it
(``bench/sim/calibrate.py``), the replay states the simulation's error, and the flood rows
measured on a quiet box price the WAN grid.

``sybil`` (issue 32): a farm of F Sybil identities against the feed-source picker, before
issue 32 (uniform over keys) and now (by what sources deliver), at N = 16, 100, 1,000 and F = 0,
N/4, N, 4N (and 50 where it is at least N/4): the honest share of a node's feed slots at steady
state and over time, and the honest groups it receives per round against no farm; mean and
range over 4 seeds, 3 at N = 1,000 (``bench/sim/sybil.py``, ``sybil_grid.py``; ~10 min of
a core).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.sim import sybil_grid
from bench.sim.calibrate import costs_from_unit, fit_by_sim, fit_unit, replay
from bench.sim.config import Scenario, Scheme
from bench.sim.engine import Sim
from bench.sim.metrics import summarize
from bench.sim.picker import MIRRORED_AT
from bench.sim.sybil import FARMS, SybilScenario
from protocol.files import atomic_write_bytes

log = logging.getLogger("bench.sim")

RESULTS = Path(__file__).resolve().parents[1] / "results"
def flood_rounds(n: int, rounds: int) -> int:
    """A flood costs ~N^2 D events per round (~6 M at N = 1,000: minutes of one core, and
    the shared box gave this process ~4% of a core at load average 55): 1 round at 1,000 peers
    (its per-round cost is what it shows; it is saturated anyway), 10 at 100 (the sender
    spread needs 10)."""
    return 1 if n >= 1000 else min(rounds, 10) if n >= 100 else rounds


VARIANTS = ("flood", "feeds", "flood_ann", "feeds_ann")
"""Plain: peer announcements every 5 s whatever N (the swarm before the follow-up of issue 15:
O(N) per node; near N = 1,000 they alone saturate a node's core). ``*_ann``: announcements as
``swarm/peers.py`` builds them (period N / ``announce_rate_per_s`` = N / 4 s within [5, 600] s,
table TTL scaled with it), about 4 per node and second whatever N; only the ``*_ann`` pair
compares the rollout schemes at N = 1,000 on latency."""


def scheme_for(variant: str, n: int) -> Scheme:
    kind = variant.removesuffix("_ann")
    if variant.endswith("_ann"):
        return Scheme(kind=kind)
    return Scheme(kind=kind, announce_rate_per_s=0.0)


def grid(unit_ms: float, *, sizes: list[int], rounds: int, batch_bytes: int,
         churn: float, seed: int, variants: tuple[str, ...] = VARIANTS) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        same = Scheme().announce_period_s(n) == Scheme().announce_interval_s  # *_ann = plain
        for variant in variants:
            if same and variant.endswith("_ann"):
                continue  # copied from the plain row below
            for ch in (0.0, churn):
                flood = variant.startswith("flood")
                r = flood_rounds(n, rounds) if flood else rounds
                if flood and n >= 1000 and (ch > 0 or not variant.endswith("_ann")):
                    # one round sees almost no churn; and with 5 s announcements the node is
                    # saturated by them alone (announce.py), so only flood_ann is informative
                    continue
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
                if same and f"{variant}_ann" in variants:
                    out.append({**res, "variant": f"{variant}_ann", "same_as": variant})
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
    for variant, color, marker in (("flood_ann", red, "o"), ("feeds_ann", blue, "s")):
        rs = rows(variant)
        ns = [r["n"] for r in rs]
        axes[0].plot(ns, [r["per_node_rollouts"]["bytes_in_per_s"]["mean"] / 1e3 for r in rs],
                     color=color, marker=marker,
                     label=f"{variant.removesuffix('_ann')}: rollout batches in")
    for variant, style, label in (("feeds", ":", "every 5 s"),
                                  ("feeds_ann", "-.", "every N/4 s in [5, 600] s")):
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
              "batch latency, publish to first copy (ms)",
              "per-node CPU (cores)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log")
        if any(y > 0 for line in ax.get_lines() for y in line.get_ydata()):
            ax.set_yscale("log")
        ax.set_xlabel("peers N")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("bench/sim: flood vs receiver-chosen feeds, WAN model, calibrated costs "
                 "(rollout rows: announcements every N/4 s in [5, 600] s; flood at N=1000: 1 round)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


QUIET_LOAD = 2.0
"""A real row whose 1-minute load average before it was below this (on 2 cores) prices the
WAN grid; rows from a loaded box are replayed, but their CPU per message is inflated by the
contention (cache, context switches) and would overprice a node that has its core alone."""


def calibrate(paths: list[str], quiet_paths: list[str]) -> dict[str, Any]:
    rows = [r for path in paths for r in json.loads(Path(path).read_text())["runs"]]
    rows += [{**r, "quiet_machine": True}
             for path in quiet_paths for r in json.loads(Path(path).read_text())["runs"]]
    replays = []
    for row in rows:
        try:
            u = fit_by_sim(row)
        except ValueError as e:
            log.warning("%s n=%d skipped: %s", row["mode"], row["nodes"], e)
            replays.append({"nodes": row["nodes"], "mode": row["mode"], "skipped": str(e),
                            "quiet": False, "relative_error": {}})
            continue
        rep = replay(row, u)
        if row["mode"] == "feeds" and row.get("rotation") != "make_before_break":
            # the same row with today's rotation: what the model predicts the fix does
            new = replay({**row, "rotation": "make_before_break"}, u)
            rep["sim_make_before_break"] = new["sim"]
        rep["quiet"] = bool(row.get("quiet_machine")) or row["load_before"][0] < QUIET_LOAD
        log.info("%s n=%d load %.1f: unit %.2f ms, error %s", row["mode"], row["nodes"],
                 row["load_before"][0], u, rep["relative_error"])
        replays.append(rep)
    quiet = [r["unit_ms"] for r in replays if r["quiet"] and r["mode"] == "flood"]
    with_dups = [r for r in rows if r.get("duplicates") and r.get("inbound_per_node_round")]
    summary: dict[str, Any] = {}
    for mode in ("flood", "feeds"):
        reps = [r for r in replays if r["quiet"] and r["mode"] == mode]
        keys = sorted({k for r in reps for k in r["relative_error"]})
        summary[mode] = {k: {"rows": [(r["nodes"], r["relative_error"][k]) for r in reps
                                      if k in r["relative_error"]],
                             "mean_abs": round(statistics.fmean(
                                 abs(r["relative_error"][k]) for r in reps
                                 if k in r["relative_error"]), 3)} for k in keys}
    return {"real_files": paths + quiet_paths, "quiet_files": quiet_paths, "real_rows": rows,
            "replays": replays, "error_summary_quiet": summary,
            "fit_from_duplicate_counters": fit_unit(with_dups) if with_dups else None,
            "wan_unit_ms": round(sum(quiet) / len(quiet), 3) if quiet else None,
            "loadavg": list(os.getloadavg())}


def sybil(args: argparse.Namespace, t0: float) -> None:
    """The ``sybil`` subcommand: ``sybil_grid``'s runs, rows, JSON and PNG."""
    if min(args.seeds, args.large_seeds) < 1 or args.rounds < 2:
        raise SystemExit("--seeds and --large-seeds must be >= 1, --rounds >= 2")
    runs = sybil_grid.grid(sizes=args.sizes, seeds=args.seeds, large_seeds=args.large_seeds,
                           rounds=args.rounds, farm_networks=args.farm_networks)
    sc = SybilScenario(n=2, farm_size=0)  # the defaults every run used
    rows = sybil_grid.summarize(runs)
    result = {"command": "python -m bench.sim " + " ".join(sys.argv[1:]),
              "wall_s": round(time.monotonic() - t0, 1), "loadavg": list(os.getloadavg()),
              "model": {"feeds": vars(sc.feeds), "round_s": sc.round_s, "open_s": sc.open_s,
                        "groups_per_batch": sc.sapo.groups_per_batch, "p_pass": sc.sapo.p_pass,
                        "p_useful": sc.sapo.p_useful, "external": sc.sapo.external,
                        "per_sender_round": sc.sapo.per_sender_round,
                        "farms": {name: vars(f) for name, f in FARMS.items()},
                        "own_signal": "new only: groups_per_batch local groups a round, "
                                      "each with signal with p_pass",
                        "picker_mirrors": f"swarm/feeds.py at {MIRRORED_AT}",
                        "steady_state": f"rounds {args.rounds // 2 + 1}..{args.rounds}",
                        "farm_networks": args.farm_networks},
              "rows": rows,
              "runs": [{k: v for k, v in r.items() if k != "honest_slots_per_round"} for r in runs]}
    atomic_write_bytes(Path(args.out), json.dumps(result, indent=1).encode())
    sybil_grid.plot(rows, Path(args.png), k=sc.feeds.sources, explore=sc.feeds.explore_slots)
    log.info("wrote %s in %.0f s", args.out, result["wall_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="fit costs on real gossip_bench rows, replay them")
    cal.add_argument("--real", nargs="*", default=[], help="bench/gossip_bench.py outputs")
    cal.add_argument("--quiet", nargs="*", default=[],
                     help="outputs measured with the machine to themselves (their load average "
                          "is the bench's own previous row: no background load)")
    cal.add_argument("--out", default=str(RESULTS / "sim_calibration.json"))
    gr = sub.add_parser("grid", help="the WAN grid: JSON and PNG")
    gr.add_argument("--calibration", default=str(RESULTS / "sim_calibration.json"),
                    help="its wan_unit_ms prices the grid")
    gr.add_argument("--unit-ms", type=float, default=None, help="instead of --calibration")
    gr.add_argument("--sizes", type=int, nargs="+", default=[16, 100, 1000])
    gr.add_argument("--rounds", type=int, default=20)
    gr.add_argument("--churn", type=float, default=0.1, help="fraction of peers leaving per minute")
    gr.add_argument("--batch-bytes", type=int, default=16_000)
    gr.add_argument("--seed", type=int, default=0)
    gr.add_argument("--out", default=str(RESULTS / "sim.json"))
    gr.add_argument("--png", default=str(RESULTS / "sim.png"))
    gr.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    co = sub.add_parser("combine", help="merge grid outputs run in parts, plot them")
    co.add_argument("--inputs", nargs="+", required=True)
    co.add_argument("--out", default=str(RESULTS / "sim.json"))
    co.add_argument("--png", default=str(RESULTS / "sim.png"))
    sy = sub.add_parser("sybil", help="a Sybil farm against the feed-source picker: JSON and PNG")
    sy.add_argument("--sizes", type=int, nargs="+", default=[16, 100, 1000])
    sy.add_argument("--seeds", type=int, default=4, help="seeds 0 .. seeds-1 per cell")
    sy.add_argument("--large-seeds", type=int, default=3, help="--seeds from N = 1,000 on")
    sy.add_argument("--rounds", type=int, default=120, help="learner rounds (10 s) per run")
    sy.add_argument("--farm-networks", type=int, default=0,
                    help="networks the farm's keys sit in (1: one machine; 0: each key in its "
                         "own, which feeds.max_per_network cannot bound)")
    sy.add_argument("--out", default=str(RESULTS / "sim_sybil.json"))
    sy.add_argument("--png", default=str(RESULTS / "sim_sybil.png"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.monotonic()
    if args.command == "sybil":
        sybil(args, t0)
        return
    if args.command == "calibrate":
        result = calibrate(args.real, args.quiet)
    elif args.command == "combine":
        parts = [json.loads(Path(p).read_text()) for p in args.inputs]
        result = {"parts": [{k: v for k, v in p.items() if k != "runs"} for p in parts],
                  "unit_ms": parts[0]["unit_ms"], "batch_bytes": parts[0]["batch_bytes"],
                  "runs": [r for p in parts for r in p["runs"]]}
    else:
        unit = args.unit_ms
        if unit is None:
            unit = json.loads(Path(args.calibration).read_text())["wan_unit_ms"]
        result = {"loadavg_start": list(os.getloadavg()), "unit_ms": unit,
                  "batch_bytes": args.batch_bytes,
                  "runs": grid(unit, sizes=args.sizes, rounds=args.rounds,
                               batch_bytes=args.batch_bytes, churn=args.churn, seed=args.seed,
                               variants=tuple(args.variants))}
    result["command"] = "python -m bench.sim " + " ".join(sys.argv[1:])
    result["wall_s"] = round(time.monotonic() - t0, 1)
    atomic_write_bytes(Path(args.out), json.dumps(result, indent=1).encode())
    if args.command != "calibrate":  # after the JSON: a plot problem must not lose a run
        plot(result["runs"], Path(args.png))
    log.info("wrote %s in %.0f s", args.out, result["wall_s"])


if __name__ == "__main__":
    main()
