"""Compute utilisation with background outer steps on the clock: 4 peers, rounds up to 2x apart.

Two modes, both real processes and real hivemind on 127.0.0.1:

- ``--mode nodes`` (the issue's bar): a bootstrap peer and N ``swarm-node join`` nodes (the
  embedded model, SAPO rounds, gossip), node i with ``[learner] slowdown_for_tests`` =
  1 + i/(N-1) (round times up to 2x apart), stopped with SIGTERM after ``--seconds``. Reads
  every node report: ``compute_utilisation``, ``discarded_rounds``, the outer steps.
- ``--mode workers``: N ``tests/collectives/clock_worker.py`` peers (OuterLoop.after_round
  with synthetic rounds of ``--round-s`` x the same slowdowns): the outer loop alone.

An outer step is an attempt that applied a version (``STEPS``): the node's group averaged
(``ok``, ``peers`` members) or it adopted a version others averaged (``resynced``, made by
``made_by`` peers). ``alone``, ``failed`` and ``minority`` attempts change nothing (issue 17:
nothing published, nothing lost), so they are not steps, but once a node has made its first
step each of them is a meeting it attended in vain, and fails it.

Bars on every node: utilisation >= 0.9; every outer step after its first was made by >= 2
peers; after its first step no attempt was alone, failed or in a minority (but its last: the
others may have stopped first); at least one step
was its own group's average (``ok``: a node that only ever adopts never contributes);
``discarded_rounds`` = 0. Also reported, not a bar: the attempts before the first step (a cold
swarm's first node attends meetings before anyone else trains) and the stricter count of
records after the first that grouped (``later_records_grouped``). Never fails for slowness;
writes bench/results/utilisation-<mode>.json (atomically) with the load average next to it.

    PYTHONPATH=$PWD python bench/utilisation.py --mode nodes --nodes 4 --seconds 150
    PYTHONPATH=$PWD python bench/utilisation.py --mode workers --nodes 4 --seconds 40
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from node.local import LocalSwarm  # noqa: E402
from protocol import atomic_write_bytes  # noqa: E402
from tests.collectives.harness import Swarm  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def slowdowns(n: int) -> list[float]:
    return [1.0 + (i / (n - 1) if n > 1 else 0.0) for i in range(n)]


STEPS = ("ok", "resynced")
"""Statuses of the attempts that applied a version (see the module docstring)."""


def made_by(rec: dict[str, Any]) -> int:
    """How many peers' average made the version an outer step applied."""
    key = "peers" if rec.get("status") == "ok" else "made_by"
    return int(rec.get(key) or 0)


def judge(name: str, utilisation: float | None, records: list[dict[str, Any]],
          discarded: int | None) -> dict[str, Any]:
    """The bars for one node; ``records``: every attempt it reported, in order."""
    status = [r.get("status") for r in records]
    first = next((i for i, s in enumerate(status) if s in STEPS), len(records))
    steps = [r for r in records if r.get("status") in STEPS]
    # the last attempt may find the others gone: runs end apart (workers: their start
    # delays), and a node stopped by the bench leaves without its final steps
    later, after = steps[1:], status[first + 1:-1]
    vain = [s for s in after if s not in STEPS]
    grouped = [r for r in steps if r.get("status") == "ok" and made_by(r) >= 2]
    return {"name": name, "compute_utilisation": utilisation, "attempts": len(records),
            "status": status, "peers": [r.get("peers") for r in records],
            "outer_steps": len(steps), "made_by": [made_by(r) for r in steps],
            "before_first_step": status[:first], "later_steps": len(later),
            "later_steps_with_2_peers": sum(1 for r in later if made_by(r) >= 2),
            "vain_after_first_step": vain, "grouped_steps": len(grouped),
            "resynced_after_first_step": after.count("resynced"),
            "later_records_grouped": sum(1 for r in records[1:] if r.get("status") == "ok"
                                         and (r.get("peers") or 0) >= 2),
            "later_records": max(0, len(records) - 1), "discarded_rounds": discarded,
            "ok": bool(utilisation is not None and utilisation >= 0.9 and later
                       and all(made_by(r) >= 2 for r in later) and not vain and grouped
                       and discarded == 0)}


class SlowLocalSwarm(LocalSwarm):
    """``swarm-node local`` with one config file per node (its slowdown), stopped by time."""

    outer: str = ""
    seconds: float = 150.0
    max_receive: int = 8
    """Received batches re-scored per round: bounded, or a fast node's rollouts flood the
    slow ones' re-scoring and round times drift far beyond the slowdowns (measured: 0.7 s
    vs 24-74 s rounds with the default 256 on a loaded 2-core box)."""

    def _start_node(self, name: str, data_dir: Path, bootstrap: str) -> None:
        i = int(name.rsplit("-", 1)[1])
        data_dir.mkdir(parents=True, exist_ok=True)
        cfg = data_dir / "bench.toml"
        cfg.write_text(f"[outer]\n{self.outer}\n[learner]\ncheckpoint_every = 0\n"
                       f"slowdown_for_tests = {slowdowns(self.nodes)[i]}\n"
                       f"[learner.sapo]\nmax_receive = {self.max_receive}\n")
        self.config_file = str(cfg)
        super()._start_node(name, data_dir, bootstrap)

    def _wait(self, base: Path) -> dict[str, int]:
        timer = threading.Timer(self.seconds, self._on_signal, (signal.SIGTERM, None))
        timer.start()
        try:
            return super()._wait(base)
        finally:
            timer.cancel()


def run_nodes(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    outer = (f"every_rounds = {args.every_rounds}\ncompression = \"fp16\"\n"
             f"schedule = {{ join_window_s = {args.join_window}, deadline_s = {args.deadline} }}\n")
    swarm = SlowLocalSwarm(nodes=args.nodes, rounds=100_000, report=base / "swarm.json",
                           base_dir=base)
    swarm.outer, swarm.seconds, swarm.max_receive = outer, args.seconds, args.max_receive
    swarm.run()
    data = json.loads((base / "swarm.json").read_text())
    out = []
    for node in data["nodes"]:
        row = judge(node["name"], node.get("compute_utilisation"), node["outer_steps"],
                    node.get("discarded_rounds"))
        rounds = node.get("rounds", [])
        row["rounds"] = len(rounds)
        row["mean_round_s"] = round(sum(sum(r["seconds"].values()) for r in rounds)
                                    / max(1, len(rounds)), 3)
        row["slowdown"] = slowdowns(args.nodes)[int(node["name"].rsplit("-", 1)[1])]
        out.append(row)
    return out


def run_workers(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    swarm = Swarm(base)
    names = [f"w{i}" for i in range(args.nodes)]
    try:
        for i, (n, k) in enumerate(zip(names, slowdowns(args.nodes))):
            swarm.spawn(n, 100 + i, module="tests.collectives.clock_worker",
                        round_s=args.round_s * k, peers=args.nodes, duration=args.seconds,
                        delay=0.5 * i, every_rounds=args.every_rounds,
                        join_window=args.join_window, deadline=args.deadline,
                        numel=args.numel, compression="fp16", trust=True, no_save=True)
        swarm.wait_done(names, timeout=args.seconds + 180)
        out = []
        for n, k in zip(names, slowdowns(args.nodes)):
            stats = json.loads((base / "out" / f"{n}.json").read_text())
            recs = sorted(swarm.records(n).values(), key=lambda r: r["i"])
            row = judge(n, stats["compute_s"] / stats["wall_s"], recs,
                        max((r["discarded_rounds"] for r in recs), default=0))
            row.update(slowdown=k, rounds=stats["rounds"], period_s=stats["period_s"],
                       round_s=stats["round_s"],
                       step_seconds=[r["seconds"] for r in recs],
                       overlap_rounds=[r["overlap_rounds"] for r in recs])
            out.append(row)
        return out
    finally:
        swarm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["nodes", "workers"], default="nodes")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--every-rounds", type=int, default=4)
    ap.add_argument("--join-window", type=float, default=2.0)
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument("--round-s", type=float, default=0.5, help="workers: fastest round")
    ap.add_argument("--numel", type=int, default=1_000_000, help="workers: parameters")
    ap.add_argument("--max-receive", type=int, default=8, help="nodes: [learner.sapo]")
    ap.add_argument("--keep", default="", help="run in this directory and keep it (logs)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    t = time.monotonic()
    run = run_nodes if args.mode == "nodes" else run_workers
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        rows = run(args, Path(args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-util-") as tmp:
            rows = run(args, Path(tmp))
    result = {"mode": args.mode, "args": vars(args), "rows": rows,
              "ok": len(rows) == args.nodes and all(r["ok"] for r in rows),
              "wall_s": round(time.monotonic() - t, 1), "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
              "platform": platform.platform(),
              "command": " ".join(["python", "bench/utilisation.py", *sys.argv[1:]])}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"utilisation-{args.mode}.json"
    atomic_write_bytes(path, json.dumps(result, indent=1).encode())
    for r in rows:
        print(f"{r['name']}: utilisation {r['compute_utilisation']}, {r['outer_steps']} steps "
              f"made by {r['made_by']}, before the first {r['before_first_step']}, in vain "
              f"after it {r['vain_after_first_step']}, discarded {r['discarded_rounds']}, "
              f"ok {r['ok']}")
    print(f"{'PASS' if result['ok'] else 'FAIL'}: {path}")


if __name__ == "__main__":
    main()
