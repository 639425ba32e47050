"""Gossip benchmark: propagation latency and delivered messages/s on loopback.

Starts a bootstrap peer and N swarm processes (``python -m swarm``), each with a learner-side
SocketBridge; every node publishes ``--batches`` RolloutBatches, one every ``--interval-s``.
A batch's ``round`` carries its publish time (ms), so latency = receipt time at the swarm
process − publish time (one clock: same machine). ``cpu_ms_per_delivery`` is the CPU time
(user + system, from /proc) the N node processes and the bootstrap spent from the first
publish to the last receipt, divided by the deliveries. Prints a summary and writes
``bench/results/gossip.json``. Never fails for slowness.

    PYTHONPATH=$PWD python bench/gossip_bench.py --nodes 8 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.ipc_client import SocketBridge  # noqa: E402
from tests.swarm.conftest import Procs, batch  # noqa: E402
from tests.swarm.procs import short_tmpdir, wait_until  # noqa: E402
from tests.swarm.test_swarm import wait_stable  # noqa: E402


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(n: int, batches: int, interval_s: float, rollouts: int, *,
        procs: Procs | None = None) -> dict:
    """One swarm of ``n`` nodes; ``procs`` starts them (default: on loopback)."""
    procs = procs or Procs(short_tmpdir())
    try:
        t0 = time.monotonic()
        boot = procs.node("boot", learner=False, bootstrap_only=True)
        nodes = procs.nodes([f"n{i}" for i in range(n)], bootstrap=(boot.addr,), target_peers=4)
        bridges = [SocketBridge.connect(p.ready["ipc"], wait_s=60) for p in nodes]
        wait_until(lambda: all(len(b.peers()) >= n for b in bridges), timeout_s=60, what="discovery")
        wait_stable(bridges)
        startup_s = time.monotonic() - t0
        pids = [p.proc.pid for p in procs.procs if p.proc is not None]
        cpu0 = sum(cpu_s(pid) for pid in pids)
        start_ms = time.time() * 1000
        for k in range(batches):
            for i, b in enumerate(bridges):
                b.publish(batch(f"n{i}", int(time.time() * 1000), n=rollouts))
            time.sleep(interval_s)
        expected = batches * (n - 1)
        lat: list[float] = []
        counts = [0] * n
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and min(counts) < expected:
            for i, b in enumerate(bridges):
                for r in b.receive("rollouts", max_items=1024):
                    counts[i] += 1
                    lat.append(r.received_ms - r.message.round)
            time.sleep(0.05)
        end_ms = time.time() * 1000
        cpu = sum(cpu_s(pid) for pid in pids) - cpu0
        stats = [b.stats() for b in bridges]
        for b in bridges:
            b.close()
    finally:
        procs.stop_all()
    lat.sort()
    delivered = sum(counts)
    return {
        "nodes": n, "batches_per_node": batches, "rollouts_per_batch": rollouts,
        "interval_s": interval_s, "startup_s": round(startup_s, 1),
        "expected_deliveries": expected * n, "delivered": delivered,
        "lost": expected * n - delivered,
        "latency_ms_min": round(lat[0], 1) if lat else None,
        "latency_ms_p10": round(lat[int(0.1 * (len(lat) - 1))], 1) if lat else None,
        "latency_ms_p50": round(statistics.median(lat), 1) if lat else None,
        "latency_ms_p99": round(lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
        "latency_ms_max": round(lat[-1], 1) if lat else None,
        "delivered_per_s": round(delivered / ((end_ms - start_ms) / 1000), 1),
        "cpu_ms_per_delivery": round(1000 * cpu / max(1, delivered), 2),
        "duplicates": sum(s.get("gossip_duplicates", 0) for s in stats),
        "rejected": sum(v for s in stats for k, v in s.items() if k.startswith("rejected_")),
        "dropped": sum(v for s in stats for k, v in s.items() if k.startswith("dropped_")),
        "connections_per_node": [s["peers"] for s in stats],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--interval-s", type=float, default=0.25)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gossip.json"))
    args = ap.parse_args()
    results = []
    for n in args.nodes:
        r = run(n, args.batches, args.interval_s, args.rollouts)
        print(json.dumps(r), flush=True)
        results.append(r)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": "2 cores, loopback", "runs": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
