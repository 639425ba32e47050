"""Gossip benchmark: per-node inbound rollout messages, latency and CPU per delivery, on loopback.

Starts a bootstrap peer and N swarm processes (``python -m swarm``), each with a learner-side
SocketBridge; every node publishes ``--batches`` RolloutBatches, one every ``--interval-s``.
Each N runs once per ``--modes`` entry, in the same session, so the modes compare as ratios
on the same (shared, noisy) machine:

- ``flood``: every batch to every node on the rollouts gossip topic (the old path);
- ``feeds``: each node receives from ``--sources`` peers it picked and rotates (swarm.feeds).

A batch's ``round`` carries its publish time (ms), so latency = receipt time at the swarm
process − publish time (one clock), over every delivered batch: a batch a new feed backfills
counts too, with its age when the feed opened (``LATENCY_MEANS``). The tail is split into a
feed's first batch (the receiver did not get the sender's previous batch: a backfill or the
first live batch of a new feed) and the rest (``latency_first_on_feed`` /
``latency_steady``); ``superseded_on_arrival`` counts batches that arrived after their sender
had published the next one, and the deliveries over 1 s are listed (``slow``). ``cpu_ms_per_delivery`` is the CPU time (user + system,
from /proc) of the N node processes and the bootstrap from the first publish to the last
receipt, divided by the deliveries; ``cpu_ms_per_delivery_net`` first subtracts the idle
CPU rate (measured for ``IDLE_S`` before publishing) over that time.
``inbound_per_node_round`` is the rollout messages a node read per publish round: deliveries
plus duplicate copies (flood) or feed frames (feeds).
Load averages (``os.getloadavg``) are recorded before and after each row. Writes
``bench/results/gossip.json`` atomically. Never fails for slowness.

    PYTHONPATH=$PWD python bench/gossip_bench.py --nodes 8 16 32 --batches 10 --interval-s 1.0
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
from protocol import atomic_write_bytes  # noqa: E402
from tests.swarm.conftest import Procs, batch  # noqa: E402
from tests.swarm.procs import short_tmpdir, wait_until  # noqa: E402
from tests.swarm.test_swarm import wait_stable  # noqa: E402

FEED_COUNTERS = ("feed_opened", "feed_failed", "feed_refused", "feed_rotated",
                 "feed_busy", "feed_backfilled", "dropped_feed_slow", "rejected_feed_bad_request")
IDLE_S = 6.0
"""CPU of the swarm with no rollouts is measured for this long before the first publish
(heartbeats, announcements); ``cpu_ms_per_delivery_net`` subtracts it."""
QUIET_S = 3.0
"""Feeds mode: the run ends when no node received anything for this long after the last
publish (a node receives only its sources' batches, so there is no fixed expected count)."""


LATENCY_MEANS = ("receipt at the receiving swarm process minus publish time (one clock), "
                 "over every delivered batch, backfilled ones included")
SLOW_MS = 1000.0
"""Deliveries slower than this are listed in a row's ``slow`` (the issue's p99 bound)."""


def _pcts(lat: list[float]) -> dict:
    lat = sorted(lat)
    if not lat:
        return {"count": 0}
    return {"count": len(lat), "p50": round(statistics.median(lat), 1),
            "p99": round(lat[int(0.99 * (len(lat) - 1))], 1), "max": round(lat[-1], 1)}


def split_latency(records: list[tuple[int, str, int, int]], published: dict[str, list[int]],
                  start_ms: float) -> dict:
    """``records``: (receiver, sender's model name, publish ms, receipt ms); ``published``:
    each sender's publish times in order. A feed's first batch: the receiver did not get the
    sender's previous batch (a new feed: its backfill or first live batch). ``superseded``:
    the batch arrived after its sender had published the next one (older than a round)."""
    first, steady, slow = [], [], []
    superseded = 0
    got_set = {(rcv, snd, pub) for rcv, snd, pub, _ in records}
    index = {(snd, pub): i for snd, pubs in published.items() for i, pub in enumerate(pubs)}
    for rcv, snd, pub, got in records:
        i = index.get((snd, pub))
        pubs = published.get(snd, [])
        is_first = i is None or i == 0 or (rcv, snd, pubs[i - 1]) not in got_set
        late = i is not None and i + 1 < len(pubs) and got > pubs[i + 1]
        superseded += late
        (first if is_first else steady).append(got - pub)
        if got - pub > SLOW_MS:
            slow.append({"receiver": rcv, "sender": snd, "latency_ms": got - pub,
                         "first_on_feed": is_first, "superseded": late,
                         "published_s": round((pub - start_ms) / 1000, 2),
                         "received_s": round((got - start_ms) / 1000, 2)})
    return {"latency_first_on_feed": _pcts(first), "latency_steady": _pcts(steady),
            "superseded_on_arrival": superseded,
            "slow": sorted(slow, key=lambda r: -r["latency_ms"])[:40], "slow_count": len(slow)}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(n: int, mode: str, *, batches: int, interval_s: float, rollouts: int,
        sources: int, procs: Procs | None = None) -> dict:
    """One swarm of ``n`` nodes; ``procs`` starts them (default: on loopback)."""
    procs = procs or Procs(short_tmpdir())
    load_before = _load()
    wall0 = time.monotonic()
    try:
        # announcements at the default period (the tests' 1 s would dominate the CPU)
        slow = {"interval_s": 5.0}
        boot = procs.node("boot", learner=False, bootstrap_only=True, announcements=slow,
                          peers={"ttl_s": 30.0})
        nodes = procs.nodes([f"n{i}" for i in range(n)], bootstrap=(boot.addr,),
                            peers={"target": 4, "ttl_s": 30.0}, rollout_mode=mode,
                            feeds={"sources": sources}, announcements=slow)
        bridges = [SocketBridge.connect(p.ready["ipc"], wait_s=60) for p in nodes]
        try:
            wait_until(lambda: all(len(b.peers()) >= n for b in bridges), timeout_s=120,
                       what="discovery")
        except TimeoutError:  # recorded (known_peers_at_start), not fatal on a loaded box
            pass
        known_at_start = [len(b.peers()) for b in bridges]
        if mode == "feeds":
            # one feed per node may be between rotation and re-opening at any time
            want = max(1, min(sources, n - 1) - 1)
            try:
                wait_until(lambda: all(b.stats().get("feed_sources", 0) >= want
                                       for b in bridges), timeout_s=120, what="feeds")
            except TimeoutError:  # recorded (feeds_at_start), not fatal: a loaded box is slow
                pass
        feeds_at_start = [b.stats().get("feed_sources", 0) for b in bridges]
        try:  # connections settle (in feeds mode rotation keeps changing them: best effort)
            wait_stable(bridges)
        except TimeoutError:
            pass
        startup_s = time.monotonic() - wall0
        pids = [p.proc.pid for p in procs.procs if p.proc is not None]
        idle0, t_idle = sum(cpu_s(pid) for pid in pids), time.monotonic()
        time.sleep(IDLE_S)
        cpu0 = sum(cpu_s(pid) for pid in pids)
        idle_rate = (cpu0 - idle0) / (time.monotonic() - t_idle)  # CPU-s per s with no rollouts
        start_ms = time.time() * 1000
        published: dict[str, list[int]] = {f"n{i}": [] for i in range(n)}
        for _ in range(batches):
            for i, b in enumerate(bridges):
                ts = int(time.time() * 1000)
                published[f"n{i}"].append(ts)
                b.publish(batch(f"n{i}", ts, n=rollouts))
            time.sleep(interval_s)
        expected = batches * (n - 1)
        lat: list[float] = []
        records: list[tuple[int, str, int, int]] = []
        counts = [0] * n
        senders: list[set[str]] = [set() for _ in range(n)]
        deadline = time.monotonic() + 60
        last_new, last_new_ms, cpu_last = time.monotonic(), start_ms, cpu0
        while time.monotonic() < deadline:
            if mode == "flood" and min(counts) >= expected:
                break
            if mode == "feeds" and time.monotonic() - last_new >= QUIET_S:
                break
            before = sum(counts)
            for i, b in enumerate(bridges):
                for r in b.receive("rollouts", max_items=1024):
                    counts[i] += 1
                    senders[i].add(r.sender)
                    lat.append(r.received_ms - r.message.round)
                    records.append((i, r.message.model, r.message.round, r.received_ms))
            if sum(counts) > before:
                last_new, last_new_ms = time.monotonic(), time.time() * 1000
                cpu_last = sum(cpu_s(pid) for pid in pids)
            time.sleep(0.05)
        end_ms = max(last_new_ms, start_ms + 1)  # the last receipt
        cpu = cpu_last - cpu0  # first publish to last receipt
        stats = [b.stats() for b in bridges]
        for b in bridges:
            b.close()
    finally:
        procs.stop_all()
    lat.sort()
    delivered = sum(counts)
    inbound = [s.get("feed_frames", 0) if mode == "feeds" else
               s.get("received_rollouts", 0) + s.get("gossip_duplicates_rollouts", 0)
               for s in stats]
    announce_in = [s.get("received_announce", 0) + s.get("gossip_duplicates_announce", 0)
                   for s in stats]
    row = {
        "mode": mode, "nodes": n, "batches_per_node": batches, "rollouts_per_batch": rollouts,
        "interval_s": interval_s, "sources": sources if mode == "feeds" else None,
        "rotation": "make_before_break" if mode == "feeds" else None,
        "startup_s": round(startup_s, 1),
        "delivered": delivered,
        "latency_ms_min": round(lat[0], 1) if lat else None,
        "latency_ms_p10": round(lat[int(0.1 * (len(lat) - 1))], 1) if lat else None,
        "latency_ms_p50": round(statistics.median(lat), 1) if lat else None,
        "latency_ms_p99": round(lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
        "latency_ms_max": round(lat[-1], 1) if lat else None,
        "latency_means": LATENCY_MEANS,
        **split_latency(records, published, start_ms),
        "delivered_per_s": round(delivered / ((end_ms - start_ms) / 1000), 1),
        "cpu_ms_per_delivery": round(1000 * cpu / max(1, delivered), 2),
        "cpu_ms_per_delivery_net": round(
            1000 * max(0.0, cpu - idle_rate * (end_ms - start_ms) / 1000) / max(1, delivered), 2),
        "idle_cpu_per_s": round(idle_rate, 3),
        "cpu_s_total": round(cpu, 2),
        "inbound_per_node_round": round(statistics.mean(inbound) / batches, 2),
        "inbound_per_node_round_max": round(max(inbound) / batches, 2),
        "deliveries_per_node_round": round(delivered / n / batches, 2),
        "announce_in_per_node": round(statistics.mean(announce_in), 1),
        "distinct_senders_per_node_min": min(len(s) for s in senders),
        "duplicates": sum(s.get("gossip_duplicates_rollouts", 0) for s in stats),
        "rejected": sum(v for s in stats for k, v in s.items() if k.startswith("rejected_")),
        "dropped": sum(v for s in stats for k, v in s.items() if k.startswith("dropped_")),
        "connections_per_node": [s["peers"] for s in stats],
        "known_peers_at_start_min": min(known_at_start),
        "feeds_at_start": feeds_at_start if mode == "feeds" else None,
        "feed_counters": {k: sum(s.get(k, 0) for s in stats) for k in FEED_COUNTERS}
        if mode == "feeds" else None,
        "load_before": load_before, "load_after": _load(),
        "wall_s": round(time.monotonic() - wall0, 1),
    }
    if mode == "flood":
        row["expected_deliveries"] = expected * n
        row["lost"] = expected * n - delivered
    else:  # a batch queued for a subscriber that never arrived
        row["feed_sent"] = sum(s.get("feed_sent", 0) + s.get("feed_backfilled", 0) for s in stats)
        row["lost"] = row["feed_sent"] - sum(s.get("feed_frames", 0) for s in stats)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--modes", nargs="+", default=["feeds", "flood"], choices=["feeds", "flood"])
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--sources", type=int, default=4, help="[gossip.feeds] sources in feeds mode")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gossip.json"))
    args = ap.parse_args()
    results = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for n in args.nodes:
        for mode in args.modes:
            r = run(n, mode, batches=args.batches, interval_s=args.interval_s,
                    rollouts=args.rollouts, sources=args.sources)
            print(json.dumps(r), flush=True)
            results.append(r)
            doc = {"machine": f"{os.cpu_count()} cores shared, loopback",
                   "command": " ".join(sys.argv), "runs": results}
            atomic_write_bytes(out, (json.dumps(doc, indent=2) + "\n").encode())  # per row
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
