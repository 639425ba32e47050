"""Throughput ceiling of the bed's delay router (user-space Python, one process).

With no rate limit, pushes --mbytes over TCP between bed hosts: one stream, then --pairs
streams at once between distinct host pairs, at each RTT; reports Mbit/s per stream and in
total, and the router's CPU seconds per GB. A shared 2-core machine's load moves these a
lot: the load average is recorded next to each. Writes bench/results/wan_router_ceiling.json.

    PYTHONPATH=$PWD python -m bench.wan.ceiling --rtt-ms 0 50 --pairs 2 --mbytes 100
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from protocol import atomic_write_bytes

from .bed import WanBed, hosts

log = logging.getLogger(__name__)
PROBE = [sys.executable, "-m", "bench.wan.probe"]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def streams(bed: WanBed, pairs: list[tuple[str, str]], nbytes: int) -> dict:
    ports = []
    for _, dst in pairs:
        srv = bed.run_in(dst, [*PROBE, "serve", bed.addr(dst)], stdout=subprocess.PIPE,
                         text=True)
        ports.append(int(srv.stdout.readline()))
    router = bed.router_pid
    cpu0, t = cpu_s(router) if router else 0.0, time.monotonic()
    senders = [bed.run_in(src, [*PROBE, "send", bed.addr(dst), str(port), str(nbytes)],
                          stdout=subprocess.PIPE, text=True)
               for (src, dst), port in zip(pairs, ports)]
    outs = [json.loads(s.communicate(timeout=600)[0]) for s in senders]
    wall = time.monotonic() - t
    cpu = (cpu_s(router) - cpu0) if router else None
    return {"streams": len(pairs), "mbit_s_each": [o["mbit_s"] for o in outs],
            "mbit_s_total": round(len(pairs) * nbytes * 8 / wall / 1e6, 1),
            "router_cpu_s_per_gb": round(cpu / (len(pairs) * nbytes / 1e9), 2) if cpu else None,
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--mbytes", type=int, default=100)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--out", default="bench/results/wan_router_ceiling.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    res = {"host": platform.node(), "cpus": os.cpu_count(), "started": time.time(),
           "args": {k: v for k, v in vars(args).items() if k != "out"}, "runs": []}
    for rtt in args.rtt_ms:
        names = [f"h{i}" for i in range(2 * args.pairs)]
        with WanBed(hosts(names, rtt_ms=rtt), mtu=args.mtu) as bed:
            pairs = [(names[2 * i], names[2 * i + 1]) for i in range(args.pairs)]
            for p in ([pairs[0]], pairs) if args.pairs > 1 else ([pairs[0]],):
                r = {"rtt_ms": rtt, "mtu": args.mtu,
                     **streams(bed, p, args.mbytes * 1_000_000)}
                log.info("%s", json.dumps(r))
                res["runs"].append(r)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, json.dumps(res, indent=1).encode())
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
