"""Where a swarm process spends its CPU per delivered rollout batch (cProfile, real processes).

Starts a bootstrap peer and N swarm processes on loopback like ``gossip_bench.py``; node 0
runs under cProfile. Every node publishes ``--batches`` batches, one per ``--interval-s``;
node 0 is then stopped (SIGTERM: it exits normally and writes its profile). Prints node 0's
deliveries, its profiled CPU per delivery split into stages by the module a function lives
in (Noise, yamux, pubsub/protobuf, our validation, envelope/msgpack, IPC, other), and the top
functions by own time. Writes ``bench/results/gossip_profile_<mode>.json`` atomically.

    PYTHONPATH=$PWD python bench/gossip_profile.py --mode flood feeds --nodes 8
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.ipc_client import SocketBridge  # noqa: E402
from protocol import atomic_write_bytes  # noqa: E402
from tests.swarm.conftest import Procs, batch  # noqa: E402
from tests.swarm.procs import SwarmProc, short_tmpdir, wait_until  # noqa: E402

STAGES = (  # first match wins: (stage, substring of the function's file path)
    ("noise", "libp2p/security"),
    ("yamux", "libp2p/stream_muxer"),
    ("pubsub", "libp2p/pubsub"),
    ("protobuf", "google/protobuf"),
    ("varint_framing", "libp2p/utils/varint"),
    ("validation", "swarm/validation"),
    ("feeds", "swarm/feeds"),
    ("envelope_msgpack_sign", "protocol/"),
    ("crypto", "cryptography/"),
    ("ipc", "swarm/ipc_server"),
    ("trio", "trio/"),
    ("other_libp2p", "libp2p/"),
)


def stage_of(path: str) -> str:
    for stage, needle in STAGES:
        if needle in path:
            return stage
    return "other"


def profile(mode: str, n: int, batches: int, interval_s: float, rollouts: int) -> dict:
    procs = Procs(short_tmpdir())
    prof_path = procs.root / f"node0-{mode}.prof"
    try:
        slow = {"interval_s": 5.0}  # announcements as in gossip_bench.py
        boot = procs.node("boot", learner=False, bootstrap_only=True, announcements=slow,
                          peers={"ttl_s": 30.0})
        names = [f"n{i}" for i in range(n)]
        peers = {"target": 4, "ttl_s": 30.0}
        first = procs.config("n0", bootstrap=(boot.addr,), peers=peers, rollout_mode=mode,
                             ipc_path=str(procs.root / "n0.sock"), announcements=slow)
        p0 = SwarmProc(first, "n0", python_args=("-m", "bench.cpu_profile", str(prof_path)))
        p0.start(expect_ready=False)
        procs.procs.append(p0)
        rest = procs.nodes(names[1:], bootstrap=(boot.addr,), peers=peers, rollout_mode=mode,
                           announcements=slow)
        p0.wait_ready(timeout_s=120)
        nodes = [p0, *rest]
        bridges = [SocketBridge.connect(p.ready["ipc"], wait_s=60) for p in nodes]
        wait_until(lambda: all(len(b.peers()) >= n for b in bridges), timeout_s=120,
                   what="discovery")
        if mode == "feeds":
            wait_until(lambda: bridges[0].stats().get("feed_sources", 0) >= min(4, n - 1) - 1,
                       timeout_s=120, what="node 0's feeds")
        for _ in range(batches):
            for i, b in enumerate(bridges):
                b.publish(batch(f"n{i}", int(time.time() * 1000), n=rollouts))
            time.sleep(interval_s)
        time.sleep(3.0)
        stats = bridges[0].stats()
        for b in bridges:
            b.close()
        p0.proc.terminate()
        p0.proc.wait(timeout=60)
    finally:
        procs.stop_all()
    delivered = stats.get("received_rollouts", 0)
    st = pstats.Stats(str(prof_path))
    total = sum(v[2] for v in st.stats.values())  # own time of every function
    by_stage: dict[str, float] = {}
    for (path, _line, _fn), v in st.stats.items():
        by_stage[stage_of(path)] = by_stage.get(stage_of(path), 0.0) + v[2]
    top = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:25]
    return {
        "mode": mode, "nodes": n, "batches_per_node": batches, "rollouts_per_batch": rollouts,
        "node0_delivered": delivered,
        "node0_inbound_rollout_msgs": delivered + stats.get("gossip_duplicates_rollouts", 0)
        if mode == "flood" else stats.get("feed_frames", 0),
        "profiled_cpu_s": round(total, 3),
        "note": "profiled time covers the whole process life (start-up and idle included)",
        "ms_per_delivery_by_stage": {k: round(1000 * v / max(1, delivered), 2)
                                     for k, v in sorted(by_stage.items(), key=lambda kv: -kv[1])},
        "top_own_time": [{"fn": f"{Path(p).name}:{ln}:{fn}", "own_s": round(v[2], 3),
                          "calls": v[1]} for (p, ln, fn), v in top],
        "load": list(os.getloadavg()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", nargs="+", default=["flood", "feeds"], choices=["flood", "feeds"])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    for mode in args.mode:
        r = profile(mode, args.nodes, args.batches, args.interval_s, args.rollouts)
        r["command"] = " ".join(sys.argv)
        print(json.dumps(r), flush=True)
        out = Path(args.out_dir) / f"gossip_profile_{mode}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, (json.dumps(r, indent=2) + "\n").encode())


if __name__ == "__main__":
    main()
