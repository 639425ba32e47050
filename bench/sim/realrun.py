"""Real swarm processes on loopback, measured the way the simulation reports (calibration input).

``bench/gossip_bench.py``'s run (a bootstrap peer + N ``python -m swarm`` processes with
``target_peers=4``, every node publishing one batch of 8 rollouts per ``interval_s``), with
what the calibration needs besides: counters taken as *deltas* over the publish window (the
processes' counters also hold the start-up's announcements), per-node inbound copies, CPU of
the swarm processes over the window, and the load average before and after (other work on the
machine slows every process: the simulation's ``background_load``).

    PYTHONPATH=$PWD python -m bench.sim.realrun --nodes 16 --batches 10 --out /tmp/real16.json

Extra ``--config KEY=JSON`` pairs go into every node's GossipConfig (e.g. ``rollout_mode="feeds"``
on a branch that has it). ``peer_ttl_s`` defaults to 30 s here (the tests' FAST has 6 s): on a
loaded 2-core box announcements arrive late and peers expired before all were known at once
(discovery timed out after 180 s at load average 30); it changes no rollout traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.gossip_bench import cpu_s
from bench.sim.metrics import percentile
from node.ipc_client import SocketBridge
from protocol.files import atomic_write_bytes
from tests.swarm.conftest import Procs, batch
from tests.swarm.procs import short_tmpdir, wait_until
from tests.swarm.test_swarm import wait_stable

__all__ = ["run"]

IDLE_S = 5.0


def _delta(after: dict[str, int], before: dict[str, int], prefix: str) -> int:
    return sum(v - before.get(k, 0) for k, v in after.items() if k.startswith(prefix))


def run(n: int, *, batches: int, interval_s: float, rollouts: int,
        extra: dict[str, Any]) -> dict[str, Any]:
    procs = Procs(short_tmpdir())
    try:
        boot = procs.node("boot", learner=False, bootstrap_only=True, **extra)
        nodes = procs.nodes([f"n{i}" for i in range(n)], bootstrap=(boot.addr,), target_peers=4,
                            **extra)
        bridges = [SocketBridge.connect(p.ready["ipc"], wait_s=60) for p in nodes]
        wait_until(lambda: all(len(b.peers()) >= n for b in bridges), timeout_s=180,
                   what="discovery")
        wait_stable(bridges)
        pids = [p.proc.pid for p in procs.procs if p.proc is not None]
        idle0 = [b.stats() for b in bridges]
        cpu_idle0 = sum(cpu_s(pid) for pid in pids)
        time.sleep(IDLE_S)  # what announcements and heartbeats cost without rollouts
        load_before = os.getloadavg()
        before = [b.stats() for b in bridges]
        cpu0 = sum(cpu_s(pid) for pid in pids)
        cpu_idle = cpu0 - cpu_idle0
        t0 = time.monotonic()
        for _ in range(batches):
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
        window_s = time.monotonic() - t0
        cpu = sum(cpu_s(pid) for pid in pids) - cpu0
        after = [b.stats() for b in bridges]
        load_after = os.getloadavg()
        for b in bridges:
            b.close()
    finally:
        procs.stop_all()
    lat.sort()
    dups = [_delta(a, b, "gossip_duplicates") for a, b in zip(after, before)]
    idle_dups = [_delta(a, b, "gossip_duplicates") for a, b in zip(before, idle0)]
    delivered = sum(counts)
    return {
        "nodes": n, "batches_per_node": batches, "rollouts_per_batch": rollouts,
        "interval_s": interval_s, "config": extra, "window_s": round(window_s, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "expected_deliveries": expected * n, "delivered": delivered,
        "latency_ms": {"p50": percentile(lat, 0.5), "p90": percentile(lat, 0.9),
                       "p99": percentile(lat, 0.99), "max": lat[-1] if lat else None},
        "idle_s": IDLE_S, "cpu_s_idle": round(cpu_idle, 2),
        "idle_duplicates_mean": round(statistics.fmean(idle_dups), 1),
        "counter_deltas_node0": {k: v - before[0].get(k, 0) for k, v in after[0].items()
                                 if isinstance(v, int) and v != before[0].get(k, 0)},
        "cpu_s_window": round(cpu, 2),
        "cpu_ms_per_delivery": round(1000 * cpu / max(1, delivered), 2),
        "duplicates_per_node": dups,
        "duplicates_mean": round(statistics.fmean(dups), 1),
        "rejected": sum(_delta(a, b, "rejected_") for a, b in zip(after, before)),
        "dropped": sum(_delta(a, b, "dropped_") for a, b in zip(after, before)),
        "connections_per_node": [s["peers"] for s in after],
        "mesh_rollouts_per_node": [s.get("mesh_rollouts") for s in after],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[16])
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--config", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    extra = {"peer_ttl_s": 30.0,
             **{k: json.loads(v) for k, v in (item.split("=", 1) for item in args.config)}}
    runs = []
    for n in args.nodes:
        t0 = time.monotonic()
        r = run(n, batches=args.batches, interval_s=args.interval_s, rollouts=args.rollouts,
                extra=extra)
        r["wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(r), flush=True)
        runs.append(r)
    atomic_write_bytes(Path(args.out), json.dumps({"runs": runs}, indent=2).encode())


if __name__ == "__main__":
    main()
