"""Outer-step time on the WAN bed: bench/collectives_bench.py's all-reduce at several RTTs.

For each RTT, builds a bed of --peers hosts (every pair at that RTT, each upload limited to
--rate-mbit) and runs collectives_bench.run_config() in it: real peer processes doing
--steps outer steps, then one raw TCP transfer of the same bytes per peer over the same
path; ``ratio_vs_raw_tcp`` = raw TCP seconds / all-reduce seconds. Needs root. Never fails
for slowness; writes bench/results/wan_collectives.json atomically.

``--reuseport default false`` runs each RTT twice: as shipped, and with the peers' p2pd
started with LIBP2P_TCP_REUSEPORT=false. With reuse (go-libp2p's default) two peers that
dial each other at once from their listening ports make one TCP connection with two
initiators (the router's ``tcp_simultaneous_open``), the security handshake fails, and that
peer misses the step; at 0 RTT the window is too short to hit.

    PYTHONPATH=$PWD python -m bench.wan.collectives --rtt-ms 0 50 150 --reuseport default false

``--nat relayed punched`` runs, per RTT, rows with every peer behind its own NAT instead:
through relays, and over hole-punched connections (bench/wan/outer_nat.py; ``direct``: the
row above, no NAT).

    PYTHONPATH=$PWD python -m bench.wan.collectives --rtt-ms 80 --peers 2 --nat direct relayed punched
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench import collectives_bench as cb
from protocol import atomic_write_bytes

from .bed import WanBed, hosts
from .outer_nat import NAT_PATHS, run_nat

log = logging.getLogger(__name__)


def bench_args(deadline: float) -> argparse.Namespace:
    """collectives_bench's options at its defaults (clock mode) but the deadline: run_config
    reads them (it took the deadline alone before the clock mode)."""
    return argparse.Namespace(mode="clock", round_s=0.05, every_rounds=20, period="fixed",
                              deadline=deadline, join_window=3.0)


def run_at(rtt_ms: float, *, peers: int, size: int, codec: str, steps: int, rate_mbit: float,
           deadline: float) -> dict:
    # collectives_bench addresses peer i as f"{cb.SUBNET}.{i + 1}": give the bed that subnet
    subnet, last = cb.SUBNET.rsplit(".", 1)
    if last != "0":
        raise RuntimeError(f"collectives_bench.SUBNET={cb.SUBNET!r} no longer fits the bed")
    with WanBed(hosts(peers, rtt_ms=rtt_ms, rate_mbit=rate_mbit), subnet=subnet) as bed:
        names = list(bed.specs)
        assert [bed.addr(n) for n in names] == [f"{cb.SUBNET}.{i + 1}" for i in range(peers)]
        load0 = os.getloadavg()
        t = time.monotonic()
        r = cb.run_config(size, peers, codec, steps, [bed.ns(n) for n in names],
                          bench_args(deadline))
        r.update(rtt_ms=rtt_ms, rate_mbit=rate_mbit, wall_s=round(time.monotonic() - t, 1),
                 loadavg_before=[round(x, 2) for x in load0],
                 loadavg_after=[round(x, 2) for x in os.getloadavg()],
                 router=bed.router_stats())
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0, 150.0])
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--size", type=int, default=2_500_000, help="parameters (float32)")
    ap.add_argument("--codec", default="none")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--reuseport", nargs="+", default=["default"], choices=["default", "false"],
                    help="LIBP2P_TCP_REUSEPORT for the peers' p2pd: as shipped, or false")
    ap.add_argument("--nat", nargs="+", default=["direct"], choices=["direct", *NAT_PATHS],
                    help="direct: no NAT; relayed, punched: every peer behind its own NAT "
                    "(bench/wan/outer_nat.py)")
    ap.add_argument("--out", default="bench/results/wan_collectives.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # leave through the beds' close()
    out = Path(args.out)
    res: dict[str, Any] = {"host": platform.node(), "cpus": os.cpu_count(), "started": time.time(),
           "args": {k: v for k, v in vars(args).items() if k != "out"},
           "note": "step_s_median: outer step seconds; ratio_vs_raw_tcp: raw TCP seconds for "
                   "the same bytes on the same path / all-reduce seconds",
           "runs": []}
    shipped = os.environ.get("LIBP2P_TCP_REUSEPORT")
    for rtt in args.rtt_ms:
        for path in (p for p in args.nat if p != "direct"):
            r = run_nat(path, rtt, peers=args.peers, size=args.size, codec=args.codec,
                        steps=args.steps, rate_mbit=args.rate_mbit, deadline=args.deadline)
            log.info("%s", json.dumps(r))
            res["runs"].append(r)
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(out, json.dumps(res, indent=1).encode())
        for reuse in (args.reuseport if "direct" in args.nat else []):
            value = shipped if reuse == "default" else reuse
            if value is None:
                os.environ.pop("LIBP2P_TCP_REUSEPORT", None)
            else:
                os.environ["LIBP2P_TCP_REUSEPORT"] = value
            r = run_at(rtt, peers=args.peers, size=args.size, codec=args.codec,
                       steps=args.steps, rate_mbit=args.rate_mbit, deadline=args.deadline)
            r["libp2p_tcp_reuseport"] = os.environ.get("LIBP2P_TCP_REUSEPORT", "default")
            log.info("%s", json.dumps(r))
            res["runs"].append(r)
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(out, json.dumps(res, indent=1).encode())
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
