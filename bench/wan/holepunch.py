"""Hole punching on the WAN bed: fresh trials per NAT gateway mode (issue 33; root only).

One trial: a fresh bed with ``boot`` (public bootstrap peer, the relay) and ``n1``, ``n2``,
each behind its own gateway in ``mode`` (bench.wan.bed.NAT_MODES), every pair at --rtt-ms and
--rate-mbit; fresh swarm processes. n1 and n2 learn they are NATed, reserve slots on boot,
meet through it (a relayed connection) and then punch (swarm.holepunch). A trial is
``direct`` when both swarm processes count the other as a direct peer **and** each host has an
established TCP connection to the other's gateway (``ss`` in its namespace: what the kernel
sees, not what the node says). Time to direct runs from the first relayed connection between
them. Reported per mode: success rate with a Wilson 95 % interval, median and p90 time to
direct, punch attempts.

    PYTHONPATH=$PWD python -m bench.wan.holepunch --trials 20 --modes home,masquerade,symmetric
Writes bench/results/wan_holepunch.json atomically (every trial's record too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import atomic_write_bytes

from .bed import NAT_MODES, WanBed, hosts
from .procs import WanProcs

NAMES = ["boot", "n1", "n2"]
NATED = ["n1", "n2"]


@dataclass
class Nodes:
    """The running swarm processes of one trial and their IPC bridges."""

    bed: WanBed
    procs: WanProcs
    boot: Any
    n1: Any
    n2: Any
    bridges: dict[str, Any]

    def stats(self, name: str) -> dict[str, int]:
        return self.bridges[name].stats()

    def stop(self) -> None:
        """Close the bridges, then stop every process."""
        for b in self.bridges.values():
            b.close()
        self.procs.stop_all()


def start(bed: WanBed, root: Path, **config: Any) -> Nodes:
    """boot (public, a relay) and n1, n2, each with a learner's IPC socket."""
    from node.ipc_client import SocketBridge

    ps = WanProcs(root, bed)
    # a public node, not bootstrap_only: those serve no IPC socket, and we read its relay's
    # stats (it serves as a relay once n1 or n2 dialled it back)
    boot = ps.nodes(["boot"])[0]
    n1, n2 = ps.nodes(NATED, bootstrap=(boot.addr,), **config)
    bridges = {p.name: SocketBridge.connect(p.ready["ipc"]) for p in (boot, n1, n2)}
    return Nodes(bed, ps, boot, n1, n2, bridges)


def tcp_peers(bed: WanBed, name: str) -> set[str]:
    """IPs of the established TCP connections in host ``name``'s namespace."""
    out = bed.run(name, ["ss", "-tnH", "state", "established"], capture_output=True,
                  text=True, timeout=10).stdout
    return {line.split()[-1].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def kernel_direct(bed: WanBed) -> bool:
    """Each NATed host holds a TCP connection to the other's gateway (public) address."""
    return (bed.public_addr("n2") in tcp_peers(bed, "n1")
            and bed.public_addr("n1") in tcp_peers(bed, "n2"))


def linked(stats: dict[str, int]) -> str | None:
    """n1's or n2's link to the other (boot is always direct): direct, relayed or None."""
    if stats.get("peers_relayed", 0) >= 1:
        return "relayed"
    if stats.get("peers_direct", 0) >= 2:
        return "direct"
    return None


def poll(until: Callable[[], Any], timeout_s: float, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = until()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


STAT_KEYS = ("holepunch_attempts", "holepunch_direct", "holepunch_failed",
             "holepunch_unilateral", "peers_direct", "peers_relayed")


def punch_stats(nodes: Nodes) -> dict[str, dict[str, Any]]:
    """Each NATed node's hole-punch counters (one stats call per node)."""
    return {n: {k: s.get(k) for k in STAT_KEYS} for n in NATED for s in [nodes.stats(n)]}


def gave_up(nodes: Nodes) -> bool:
    """Some side failed its last allowed attempt and neither side is punching any more."""
    # imported here: the WAN tests import this module, and libp2p beside hivemind in one
    # pytest session broke collection before
    from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS

    s = [nodes.stats(n) for n in NATED]
    return (max(x.get("holepunch_failed", 0) for x in s) >= MAX_HOLE_PUNCH_ATTEMPTS
            and all(x.get("holepunch_attempts", 0) == x.get("holepunch_failed", 0)
                    + x.get("holepunch_direct", 0) for x in s))


def trial(mode: str, *, rtt_ms: float = 80.0, rate_mbit: float = 50.0,
          direct_within_s: float = 30.0, meet_within_s: float = 90.0, watch_s: float = 0.0,
          keep_logs: Path | None = None) -> dict[str, Any]:
    """One fresh bed and fresh nodes; the record of what happened."""
    from tests.swarm.procs import short_tmpdir

    rec: dict[str, Any] = {"mode": mode, "direct": False}
    with WanBed(hosts(NAMES, rtt_ms=rtt_ms, rate_mbit=rate_mbit, nat=NATED,
                      nat_mode=mode)) as bed:
        root = short_tmpdir()
        nodes = None
        try:
            t0 = time.monotonic()
            nodes = start(bed, root)
            rec["start_s"] = time.monotonic() - t0

            def links() -> tuple[str | None, str | None]:
                return linked(nodes.stats("n1")), linked(nodes.stats("n2"))

            met = poll(lambda: any(links()), meet_within_s)
            t_met = time.monotonic()
            rec["met_s"] = t_met - t0
            rec["first_link"] = links()
            if not met:
                rec["error"] = "n1 and n2 never connected"
                return rec
            done = poll(lambda: links() == ("direct", "direct") and kernel_direct(bed),
                        direct_within_s)
            rec["direct"] = bool(done)
            if done:
                rec["time_to_direct_s"] = time.monotonic() - t_met
            rec["links"] = links()
            rec["kernel_direct"] = kernel_direct(bed)
            rec["stats"] = punch_stats(nodes)
            if watch_s > 0 and not done:
                t_watch = time.monotonic()
                rec["gave_up"] = bool(poll(lambda: gave_up(nodes), watch_s, interval_s=0.5))
                if rec["gave_up"]:
                    time.sleep(5.0)  # no further attempt starts
                rec["after_watch"] = {
                    "watched_s": time.monotonic() - t_watch, "links": links(),
                    "kernel_direct": kernel_direct(bed),
                    "stats": punch_stats(nodes)}
        finally:
            if nodes is not None:
                nodes.stop()
            if keep_logs is not None and not rec["direct"]:
                dest = keep_logs / f"{mode}-{len(list(keep_logs.glob(mode + '-*')))}"
                dest.mkdir(parents=True, exist_ok=True)
                for log in root.glob("**/*.log"):
                    shutil.copy(log, dest / log.name)
            shutil.rmtree(root, ignore_errors=True)
    return rec


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate k/n (95 % by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    n, ok = len(records), [r for r in records if r["direct"]]
    times = sorted(r["time_to_direct_s"] for r in ok)
    low, high = wilson(len(ok), n)
    return {"trials": n, "direct": len(ok), "success_rate": len(ok) / n if n else None,
            "wilson95": [round(low, 3), round(high, 3)],
            "time_to_direct_median_s": statistics.median(times) if times else None,
            "time_to_direct_p90_s": times[min(len(times) - 1, math.ceil(0.9 * len(times)) - 1)]
            if times else None,
            "attempts_max": max((s.get("holepunch_attempts") or 0
                                 for r in records for s in r.get("stats", {}).values()),
                                default=None),
            "errors": [r["error"] for r in records if "error" in r]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--modes", default="home,masquerade,symmetric")
    ap.add_argument("--rtt-ms", type=float, default=80.0)
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--watch-s", type=float, default=0.0,
                    help="after a trial that stayed relayed, watch until the punch gave up")
    ap.add_argument("--keep-logs", type=Path, default=None,
                    help="copy the swarm logs of trials that did not go direct here")
    ap.add_argument("--out", default="bench/results/wan_holepunch.json")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(NAT_MODES)
    if unknown:
        ap.error(f"--modes: {sorted(unknown)} not in {sorted(NAT_MODES)}")
    t = time.monotonic()
    result: dict[str, Any] = {"command": " ".join(sys.argv), "rtt_ms": args.rtt_ms,
                              "rate_mbit": args.rate_mbit, "loadavg_before": os.getloadavg(),
                              "modes": {}}
    for mode in modes:
        records = []
        for i in range(args.trials):
            rec = trial(mode, rtt_ms=args.rtt_ms, rate_mbit=args.rate_mbit,
                        watch_s=args.watch_s, keep_logs=args.keep_logs)
            rec["loadavg"] = os.getloadavg()
            print(json.dumps(rec), flush=True)
            records.append(rec)
        result["modes"][mode] = {**summary(records), "records": records}
        print(json.dumps({mode: summary(records)}), flush=True)
    result["loadavg_after"] = os.getloadavg()
    result["wall_s"] = time.monotonic() - t
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, (json.dumps(result, indent=2) + "\n").encode())
    print(json.dumps({m: {k: v for k, v in r.items() if k != "records"}
                      for m, r in result["modes"].items()}, indent=2))


if __name__ == "__main__":
    main()
