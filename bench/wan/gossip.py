"""Gossip latency on the WAN bed: bench/gossip_bench.py's swarm, one node per bed host.

For each RTT, builds a bed of N+1 hosts (a bootstrap and N nodes, every pair at that RTT,
each host's upload limited to --rate-mbit), runs gossip_bench.run() in it, and records
p50/p99 latency next to the load average. Needs root (see bench/wan). Never fails for
slowness; writes bench/results/wan_gossip.json atomically.

    PYTHONPATH=$PWD python -m bench.wan.gossip --nodes 8 --rtt-ms 0 50 150
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import time
from pathlib import Path

from bench.gossip_bench import run
from protocol import atomic_write_bytes
from tests.swarm.procs import short_tmpdir

from .bed import WanBed, hosts
from .procs import WanProcs

log = logging.getLogger(__name__)


def run_at(n: int, rtt_ms: float, *, rate_mbit: float, batches: int, interval_s: float,
           rollouts: int) -> dict:
    names = ["boot", *[f"n{i}" for i in range(n)]]
    root = short_tmpdir()
    with WanBed(hosts(names, rtt_ms=rtt_ms, rate_mbit=rate_mbit)) as bed:
        load0 = os.getloadavg()
        t = time.monotonic()
        r = run(n, batches, interval_s, rollouts, procs=WanProcs(root, bed))
        r.update(rtt_ms=rtt_ms, rate_mbit=rate_mbit, wall_s=round(time.monotonic() - t, 1),
                 loadavg_before=[round(x, 2) for x in load0],
                 loadavg_after=[round(x, 2) for x in os.getloadavg()],
                 router=bed.router_stats())
    shutil.rmtree(root, ignore_errors=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0, 150.0])
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--interval-s", type=float, default=0.25)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--out", default="bench/results/wan_gossip.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    res = {"host": platform.node(), "cpus": os.cpu_count(), "started": time.time(),
           "command": "python -m bench.wan.gossip " + " ".join(
               f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
               for k, v in vars(args).items() if k != "out"),
           "note": "latency = receipt at the node's swarm process - publish time (one clock); "
                   "every pair of hosts at rtt_ms; upload limited to rate_mbit per host",
           "runs": []}
    for rtt in args.rtt_ms:
        r = run_at(args.nodes, rtt, rate_mbit=args.rate_mbit, batches=args.batches,
                   interval_s=args.interval_s, rollouts=args.rollouts)
        log.info("%s", json.dumps(r))
        res["runs"].append(r)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, json.dumps(res, indent=1).encode())
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
