"""What a waited-for outer step costs beyond its all-reduce: ``OuterLoop.outer_step()`` per phase.

Real peer processes (tests/collectives/peer_worker.py) on loopback meet at a file barrier
and run ``--steps`` blocking steps; every record's ``phase_seconds`` (rendezvous, join,
group, exchange, vote) and ``seconds`` are collected. ``overhead_s`` = ``seconds`` −
``allreduce_seconds`` is the part that is neither rendezvous-free wire nor compute: DHT
calls, the join read, the freeze, the votes and storing the version commit.

    PYTHONPATH=$PWD python bench/step_overhead.py --peers 2,4 --numel 1000000 --steps 4

Never fails for slowness; writes bench/results/step_overhead.json (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from protocol import atomic_write_bytes  # noqa: E402
from tests.collectives.harness import Swarm  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def phase(rec: dict, name: str) -> float:
    return float(rec.get("phase_seconds", {}).get(name, 0.0))


def run(peers: int, args: argparse.Namespace, code: str) -> dict:
    os.environ["PYTHONPATH"] = code  # the peers run this checkout's collectives
    os.chdir(code)  # (python -m puts the working directory first on the path)
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        swarm = Swarm(Path(tmp))
        names = [f"p{i}" for i in range(peers)]
        try:
            for i, n in enumerate(names):
                swarm.spawn(n, i + 1, steps=args.steps, peers=peers, numel=args.numel,
                            compression=args.codec, no_save=True)
            swarm.wait_done(names, timeout=120 + 30 * args.steps)
            recs = [r for n in names for r in swarm.records(n).values()]
        finally:
            swarm.close()
    ok = [r for r in recs if r["status"] == "ok"]
    first = [r for r in ok if r["i"] == 0]
    later = [r for r in ok if r["i"] > 0]

    def summary(rs: list[dict]) -> dict:
        if not rs:
            return {}
        phases = sorted({k for r in rs for k in r.get("phase_seconds", {})})
        return {"n": len(rs),
                "seconds_median": statistics.median(r["seconds"] for r in rs),
                "allreduce_median": statistics.median(r["allreduce_seconds"] for r in rs),
                "overhead_s_median": statistics.median(r["seconds"] - r["allreduce_seconds"]
                                                       for r in rs),
                "phase_seconds_median": {p: statistics.median(phase(r, p) for r in rs)
                                         for p in phases}}

    return {"code": code, "peers": peers, "numel": args.numel, "codec": args.codec,
            "ok": len(ok), "attempts": len(recs), "first_step": summary(first),
            "later_steps": summary(later)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", default="2,4")
    ap.add_argument("--numel", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--codec", default="none")
    ap.add_argument("--baseline", default="", help="another checkout (e.g. /work/main): "
                    "the same rows with its code, in the same run")
    args = ap.parse_args()
    t, load = time.monotonic(), os.getloadavg()
    here = str(Path(__file__).resolve().parents[1])
    rows = [run(int(p), args, code) for code in filter(None, [here, args.baseline])
            for p in args.peers.split(",")]
    result = {"rows": rows, "wall_s": round(time.monotonic() - t, 1), "loadavg_before": load,
              "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
              "command": " ".join(["python", "bench/step_overhead.py", *sys.argv[1:]])}
    RESULTS.mkdir(exist_ok=True)
    atomic_write_bytes(RESULTS / "step_overhead.json", json.dumps(result, indent=1).encode())
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
