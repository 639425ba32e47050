"""Gossip latency on the WAN bed: bench/gossip_bench.py's swarm, one node per bed host.

First the same swarm on loopback (the baseline of this run: on a shared 2-core machine
CPU contention alone moves latency by seconds), then for each RTT a bed of N+1 hosts (a
bootstrap and N nodes, every pair at that RTT, each host's upload limited to --rate-mbit)
with gossip_bench.run() in it; p50/p99 latency next to the load average. Needs root (see
bench/wan). Never fails for slowness; writes bench/results/wan_gossip.json atomically.

    PYTHONPATH=$PWD python -m bench.wan.gossip --nodes 8 --rtt-ms 0 50 150
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.gossip_bench import run
from protocol import atomic_write_bytes
from tests.swarm.procs import short_tmpdir

from .bed import WanBed, hosts
from .procs import WanProcs

log = logging.getLogger(__name__)


def timed(fn: Callable[[], dict]) -> dict:
    load0 = os.getloadavg()
    t = time.monotonic()
    r = fn()
    r.update(wall_s=round(time.monotonic() - t, 1),
             loadavg_before=[round(x, 2) for x in load0],
             loadavg_after=[round(x, 2) for x in os.getloadavg()])
    return r


def run_at(n: int, rtt_ms: float | None, *, rate_mbit: float, batches: int,
           interval_s: float, rollouts: int, mode: str = "feeds", sources: int = 4) -> dict:
    """One swarm at ``rtt_ms`` on the bed, or on loopback when ``rtt_ms`` is None."""
    if rtt_ms is None:
        r = timed(lambda: run(n, mode, batches=batches, interval_s=interval_s,
                                rollouts=rollouts, sources=sources))
        r.update(path="loopback", rtt_ms=None, rate_mbit=None)
        return r
    names = ["boot", *[f"n{i}" for i in range(n)]]
    root = short_tmpdir()
    try:
        with WanBed(hosts(names, rtt_ms=rtt_ms, rate_mbit=rate_mbit)) as bed:
            r = timed(lambda: run(n, mode, batches=batches, interval_s=interval_s,
                                    rollouts=rollouts, sources=sources,
                                    procs=WanProcs(root, bed)))
            r.update(path="wan bed", rtt_ms=rtt_ms, rate_mbit=rate_mbit,
                     router=bed.router_stats())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0, 150.0])
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--no-baseline", action="store_true", help="skip the loopback run")
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--mode", choices=("feeds", "flood"), default="feeds",
                    help="how rollouts travel (swarm/SCALING.md)")
    ap.add_argument("--sources", type=int, default=4, help="feeds per node (feeds mode)")
    ap.add_argument("--out", default="bench/results/wan_gossip.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # leave through the beds' close()
    out = Path(args.out)
    res = {"host": platform.node(), "cpus": os.cpu_count(), "started": time.time(),
           "args": {k: v for k, v in vars(args).items() if k != "out"},
           "note": "latency = receipt at the node's swarm process - publish time (one clock); "
                   "every pair of hosts at rtt_ms; upload limited to rate_mbit per host",
           "runs": []}
    for rtt in ([] if args.no_baseline else [None]) + args.rtt_ms:
        try:
            r = run_at(args.nodes, rtt, rate_mbit=args.rate_mbit, batches=args.batches,
                       interval_s=args.interval_s, rollouts=args.rollouts, mode=args.mode,
                       sources=args.sources)
        except (TimeoutError, RuntimeError) as e:  # e.g. no discovery in 60 s on a busy box
            r = {"rtt_ms": rtt, "error": f"{type(e).__name__}: {e}"[:500],
                 "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
        log.info("%s", json.dumps(r))
        res["runs"].append(r)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, json.dumps(res, indent=1).encode())
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
