"""Outer-step benchmark: the whole step and its all-reduce vs raw TCP of the same bytes.

Runs real peer processes (tests/collectives/peer_worker.py) for each (size, peers, codec)
config, on loopback and optionally through a rate-limited link (one network namespace per
peer, veth into a bridge, ``tc qdisc ... tbf rate 100mbit`` on each peer's egress; needs
root). In the same run it times a raw TCP transfer of the same number of bytes per peer
over the same path. Per row: ``fraction_of_raw`` = raw TCP s / all-reduce s (medians) and
``step_overhead_s`` = whole step s − raw TCP s (the issue's metric: raw TCP one way, peer 0
to peer 1). The exchange sends and receives at once, so each host's egress also carries the
reverse flow's ACKs: ``raw_tcp_bidir_s`` times the same bytes sent both ways at the same
time (one connection each way), with ``fraction_of_raw_bidir`` and ``step_overhead_bidir_s``
against it.

``--cc`` sets the TCP congestion control on the namespaces' routes (default: what the host
gives a new namespace; the row's ``tcp_congestion_control`` says which ran). It matters past
10 s of transfer: with BBR, each direction's ACKs queue behind the other direction's data in
the tbf, so neither side sees its minimum RTT again and BBR's PROBE_RTT (cwnd 4 packets for
200 ms once the minimum is 10 s old) stalls each side's egress every ~10 s; one-way raw TCP
never triggers it (measured at 100M: stalls of 0.18-0.2 s at 9-10 s, ~19 s, ~24-30 s per
direction; none with cubic).

What "whole step" means depends on ``--mode`` (STEP_DEFINITION, also in the JSON):

- ``clock`` (default; how nodes run it): each peer trains in inner rounds of ``--round-s``
  (sleeps) and calls ``OuterLoop.after_round``; the peers meet on the clock (schedule.py;
  by default at a fixed period longer than a step, ``fixed_period``; ``--period 0`` adapts
  it as nodes do, which lets the second meeting open before the first step ends). A step counts from the meeting's opening (DHT time)
  to the result applied to that peer's params: rendezvous, exchange, apply, vote, commit
  and the rebase; not the wait for the next round boundary after it finished (training goes
  on meanwhile). Once the period is agreed (a fixed one is) the attempt starts up to
  ``OuterConfig.prepare_s`` before the opening (snapshot, catch-up, join record, local
  delta: ``before_meet_s`` per record); the group is read and the exchange starts no
  earlier than the opening. The first meeting also dials peers and warms the DHT
  (``step_s_later_median`` leaves it out). ``--every-rounds`` is large so that the window
  (1.5 x period / H, at least ``--join-window``) is the join window.
- ``blocking``: a file barrier, then ``maybe_outer_step`` (the record's ``seconds``).

    PYTHONPATH=$PWD python bench/collectives_bench.py --sizes 10000000 --peers 2,4 \\
        --codecs none,fp16,int8 [--netns | --netns-only] [--ns-prefix sb] [--cc cubic] \\
        [--churn-trials 50]

Never fails for slowness; writes bench/results/collectives.json (``--out``) atomically, with
the command, the load average at the start and end and per row, and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from protocol import atomic_write_bytes  # noqa: E402
from tests.collectives.harness import Swarm, run_churn  # noqa: E402

RATE = "100mbit"
PREFIX = "coll"
"""Names of our namespaces (PREFIX<i>), veths (vPREFIX<i>) and bridge (brPREFIX): --ns-prefix."""
SUBNET = "10.77.0"


def _bridge() -> str:
    return f"br{PREFIX}"


# --- rate-limited link ------------------------------------------------------------------
def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def netns_up(n: int, cc: str = "") -> list[str]:
    """``n`` namespaces on the bridge; ``cc``: the TCP congestion control of their links'
    route ("": what a new namespace gets from the host)."""
    netns_down(n)
    sh("ip", "link", "add", _bridge(), "type", "bridge")
    sh("ip", "link", "set", _bridge(), "up")
    names = []
    for i in range(n):
        ns, veth = f"{PREFIX}{i}", f"v{PREFIX}{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "b")
        sh("ip", "link", "set", veth + "b", "master", _bridge())
        sh("ip", "link", "set", veth + "b", "up")
        sh("ip", "link", "set", veth, "netns", ns)
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", veth)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", veth, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate",
           RATE, "burst", "256kb", "latency", "50ms")
        if cc:  # on the route: a namespace's default may only be one the host allows
            sh("ip", "netns", "exec", ns, "ip", "route", "replace", f"{SUBNET}.0/24", "dev", veth,
               "proto", "kernel", "scope", "link", "src", f"{SUBNET}.{i + 1}", "congctl", cc)
        names.append(ns)
    return names


def congestion_control(netns: list[str] | None) -> str:
    """The TCP congestion control of peer 0's link: its route's ``congctl``, else the
    namespace's (or our) default."""
    pre = ["ip", "netns", "exec", netns[0]] if netns else []
    if netns:
        route = subprocess.run([*pre, "ip", "route", "show", f"{SUBNET}.0/24"],
                               capture_output=True, text=True).stdout.split()
        if "congctl" in route:
            return route[route.index("congctl") + 1]
    return subprocess.run([*pre, "sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                          capture_output=True, text=True).stdout.strip()


def netns_down(n: int) -> None:
    for i in range(max(n, 8)):
        subprocess.run(["ip", "netns", "del", f"{PREFIX}{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"v{PREFIX}{i}b"], capture_output=True)
    subprocess.run(["ip", "link", "del", _bridge()], capture_output=True)
    for _ in range(50):  # veth pairs of a deleted namespace disappear asynchronously
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        if f"v{PREFIX}" not in links and _bridge() not in links:
            return
        time.sleep(0.1)


# --- raw TCP baseline -------------------------------------------------------------------
RAW_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
c.sendall(b"k"); c.close()
"""

RAW_CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = b"x" * (1 << 20)
n = int(sys.argv[3])
if len(sys.argv) > 4:
    time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
t = time.perf_counter()
while n > 0:
    k = min(n, len(buf)); c.sendall(buf[:k]); n -= k
c.shutdown(socket.SHUT_WR); c.recv(1); print(time.perf_counter() - t)
"""
"""Sends argv[3] bytes to argv[1]:argv[2] and prints the seconds until the server read them
all; with a 4th argument, first waits for that wall-clock time (connected already)."""


def raw_tcp_seconds(nbytes: int, *, netns: list[str] | None) -> float:
    """Seconds to push ``nbytes`` over one TCP connection (peer 0 -> peer 1 path)."""
    host = f"{SUBNET}.2" if netns else "127.0.0.1"
    pre_srv = ["ip", "netns", "exec", netns[1]] if netns else []
    srv = subprocess.Popen(pre_srv + [sys.executable, "-c", RAW_SERVER, host],
                           stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())  # type: ignore[union-attr]
    pre_cli = ["ip", "netns", "exec", netns[0]] if netns else []
    out = subprocess.run(pre_cli + [sys.executable, "-c", RAW_CLIENT, host, str(port),
                                    str(nbytes)], capture_output=True, text=True, check=True)
    srv.wait(30)
    return float(out.stdout.strip())


def raw_tcp_bidir_seconds(nbytes: int, *, netns: list[str] | None) -> float:
    """Seconds until ``nbytes`` crossed both ways at once between peer 0 and peer 1: one
    TCP connection each way, started together, as the exchange sends and receives at the
    same time (each host's egress then also carries the ACKs of the reverse flow). The
    larger of the two one-way times."""
    hosts = [f"{SUBNET}.{i + 1}" if netns else "127.0.0.1" for i in (0, 1)]
    pre = [["ip", "netns", "exec", netns[i]] if netns else [] for i in (0, 1)]
    servers = [subprocess.Popen(pre[i] + [sys.executable, "-c", RAW_SERVER, hosts[i]],
                                stdout=subprocess.PIPE, text=True) for i in (0, 1)]
    ports = [int(srv.stdout.readline()) for srv in servers]  # type: ignore[union-attr]
    start = time.time() + 3.0  # both start sending on the same wall-clock instant (after
    # their interpreters started and connected, on a loaded machine too)
    clients = [subprocess.Popen(pre[i] + [sys.executable, "-c", RAW_CLIENT, hosts[1 - i],
                                          str(ports[1 - i]), str(nbytes), repr(start)],
                                stdout=subprocess.PIPE, text=True) for i in (0, 1)]
    times = []
    for c in clients:
        out, _ = c.communicate(timeout=600)
        if c.returncode != 0:
            raise RuntimeError(f"raw bidirectional client failed ({c.returncode})")
        times.append(float(out.strip()))
    for srv in servers:
        srv.wait(30)
    return max(times)


# --- one all-reduce config --------------------------------------------------------------
STEP_DEFINITION = {
    "clock": "peers train in inner rounds of round_s seconds (sleeps) and meet on the clock "
             "(OuterLoop.after_round, as nodes do); step_s = from the meeting's opening (DHT "
             "time) to the result applied to the params on that peer: the wait for the "
             "group (rendezvous: head read, join record, group read, freeze), the exchange, "
             "apply, vote, version commit and head stored in the DHT, and the rebase of the "
             "params (apply_s); it excludes the wait until the peer's next round boundary "
             "after the attempt finished (training goes on meanwhile), and the preparation "
             "before the opening: once the period is agreed an attempt starts up to "
             "OuterConfig.prepare_s before it (snapshot, head read, join record, local "
             "delta; before_meet_s per record, start_after_meet_s_median < 0), while the "
             "group read and the exchange start no earlier than the opening. The first meeting "
             "also dials the peers and warms the DHT; step_s_later_median leaves it out.",
    "blocking": "peers meet at a file barrier and call maybe_outer_step (waits for the step); "
                "step_s = the record's seconds: catch-up, join window, freeze, exchange, "
                "apply, vote, commit.",
}


TRAINING_MODEL = (
    "inner rounds are sleeps of round_s: training on an accelerator, which leaves the host's "
    "CPU to the exchange (a CPU-trained node's rounds would compete with it for the cores). "
    "The params drift once per collected step (a fixed random delta added on the training "
    "thread before the next attempt's snapshot), never while an attempt runs. Per round the "
    "training thread calls OuterLoop.poll/after_round (a few microseconds without a "
    "finished attempt).")
"""What the clock mode's simulated training stands for (in every clock row of the JSON)."""

BYTES_PER_VALUE = {"none": 4.0, "fp16": 2.0, "int8": 1.004, "sparse": 0.06}


def codec_cpu_seconds(size: int, peers: int, codec: str) -> dict[str, float]:
    """CPU seconds one member spends in the codec per step (one thread, a random vector of
    ``size``), by part: encoding its contribution (every chunk), decoding the ``peers``
    contributions to its shard, encoding its shard's mean, decoding every shard's mean and,
    for ``sparse``, the error feedback's encode + decode of its payload."""
    import torch

    from collectives.codec import get_codec
    from collectives.group import GroupInfo

    torch.set_num_threads(1)
    c = get_codec(codec)
    down = c.for_mean(peers)
    group = GroupInfo(step=0, members=tuple(f"{i:03d}" for i in range(peers)), nonce="")
    chunks = group.wire_chunks(size)
    lo, hi = group.shards(size)[0]
    x = torch.randn(size, generator=torch.Generator().manual_seed(0)) * 1e-3
    out: dict[str, float] = {}
    t = time.process_time()
    sent = [c.encode(x[a:b]) for a, b in chunks]
    out["encode_contribution"] = time.process_time() - t
    t = time.process_time()
    mine = [(a, b, d) for (a, b), d in zip(chunks, sent) if lo <= a < hi]
    parts = torch.empty(hi - lo)
    for _ in range(peers):
        for a, b, d in mine:
            c.decode_into(d, parts[a - lo:b - lo])
    out["decode_contributions"] = time.process_time() - t
    t = time.process_time()
    means = [down.encode(parts[a - lo:b - lo]) for a, b, _ in mine]
    out["encode_mean"] = time.process_time() - t
    t = time.process_time()
    dst = torch.empty(size)
    for _ in range(peers):
        for (a, b, _), d in zip(mine, means):
            down.decode_into(d, dst[a - lo:b - lo])
    out["decode_means"] = time.process_time() - t
    if codec == "sparse":
        t = time.process_time()
        for a, b in chunks:
            x[a:b].sub_(c.decode(c.encode(x[a:b]), b - a))
        out["error_feedback"] = time.process_time() - t
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}


def fixed_period(size: int, peers: int, codec: str, netns: bool) -> float:
    """A period on the clock's ladder (2 s x 2^j) at least 1.5 x the step's expected time:
    the wire time of the payload at 100 Mbit/s (12 MB/s) + 2 s. With the adaptive period
    the second meeting of a run can open while the first step still runs (the period learns
    the exchange time from that step), and a peer that finishes it later than the window
    joins the next meeting alone: a start-up effect of the schedule, not a step's cost."""
    wire = 2 * (peers - 1) / peers * size * BYTES_PER_VALUE[codec] / (12e6 if netns else 1e9)
    period = 2.0
    while period < 1.5 * (wire + 2.0):
        period *= 2
    return period


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_config(size: int, peers: int, codec: str, steps: int, netns: list[str] | None,
               args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="collbench-"))
    load_before = [round(x, 2) for x in os.getloadavg()]
    swarm = Swarm(root)
    names = [f"b{i}" for i in range(peers)]
    clock = args.mode == "clock"
    # trust: a peer that missed a meeting adopts the others' version (as a node adopts
    # peers it exchanged rollouts with) instead of staying alone at genesis
    period = fixed_period(size, peers, codec, bool(netns)) if args.period == "fixed" \
        else float(args.period)
    opts: dict = dict(clock=True, round_s=args.round_s, every_rounds=args.every_rounds,
                      period=period, duration=steps * (args.deadline + 10) + 60,
                      trust="all") \
        if clock else dict(barrier_timeout=600)
    try:
        for i, n in enumerate(names):
            host = f"/ip4/{SUBNET}.{i + 1}/tcp/0" if netns else "/ip4/127.0.0.1/tcp/0"
            swarm.spawn(n, seed=i + 1, steps=steps, peers=peers, compression=codec,
                        numel=size, no_save=True, deadline=args.deadline,
                        join_window=args.join_window, host=host,
                        prefix=["ip", "netns", "exec", netns[i]] if netns else None, **opts)
        swarm.wait_done(names, timeout=steps * (args.deadline + 60) + 300)
        swarm_records = {n: list(swarm.records(n).values()) for n in names}
        recs = [r for n in names for r in swarm_records[n]]
    finally:
        swarm.close()
    key = "meet" if clock else "i"
    grouped = [r for r in recs if r["peers"] >= 2]
    ok = [r for r in grouped if r["status"] == "ok" and "allreduce_seconds" in r
          and (not clock or r.get("step_s") is not None)]
    meets = sorted({r[key] for r in grouped})
    hashes_equal = all(len({r["param_hash"] for r in grouped if r[key] == m}) == 1
                       for m in meets)
    out = {"size": size, "peers": peers, "codec": codec, "netns": bool(netns),
           "mode": args.mode, "steps": steps, "records": len(recs),
           "grouped_records": len(grouped), "ok_records": len(ok), "meetings": len(meets),
           "hashes_equal": hashes_equal, "join_window_s": args.join_window,
           "tcp_congestion_control": congestion_control(netns),
           "load_before": load_before}
    if clock:
        out.update(round_s=args.round_s, every_rounds=args.every_rounds,
                   period_s=period or "adaptive",
                   windows_s=sorted({r.get("window") for r in ok if r.get("window")}))
    if ok:
        step_of = (lambda r: r["step_s"]) if clock else (lambda r: r["seconds"])
        ar = [r["allreduce_seconds"] for r in ok]
        sent = statistics.median(r["bytes_sent"] for r in ok)
        gather = statistics.median(r.get("bytes_sent_gather", 0) for r in ok)
        raw = raw_tcp_seconds(int(sent), netns=netns)
        raw_bidir = raw_tcp_bidir_seconds(int(sent), netns=netns)
        step = statistics.median(step_of(r) for r in ok)
        later = [step_of(r) for r in ok if r[key] != meets[0]]
        phases = sorted({p for r in ok for p in r.get("phase_seconds", {})})
        out.update(allreduce_s_median=statistics.median(ar), allreduce_s_all=ar,
                   step_s_median=step, step_s_all=[step_of(r) for r in ok],
                   step_s_later_median=_median(later), bytes_sent_per_peer=sent,
                   bytes_per_param_up=round(sent / size, 4),
                   scatter_bytes_per_param=round((sent - gather) / size, 4),
                   gather_bytes_per_param=round(gather / size, 4),
                   bytes_received_per_peer=statistics.median(r["bytes_received"] for r in ok),
                   codec_cpu_s=codec_cpu_seconds(size, peers, codec),
                   achieved_bytes_per_s=sent / statistics.median(ar), raw_tcp_s=raw,
                   raw_tcp_bytes_per_s=sent / raw,
                   fraction_of_raw=round(raw / statistics.median(ar), 3),
                   raw_tcp_bidir_s=raw_bidir,
                   fraction_of_raw_bidir=round(raw_bidir / statistics.median(ar), 3),
                   step_overhead_bidir_s=round(step - raw_bidir, 3),
                   step_overhead_s=round(step - raw, 3),
                   step_overhead_later_s=None if not later else round(_median(later) - raw, 3),
                   phase_seconds_median={p: _median([r["phase_seconds"][p] for r in ok
                                                     if p in r.get("phase_seconds", {})])
                                         for p in phases})
        if clock:
            out.update(apply_s_median=_median([r["apply_s"] for r in ok]),
                       start_after_meet_s_median=_median(
                           [r["done_at"] - r["meet"] - r["seconds"] for r in ok]))
    if clock:
        out["training_model"] = TRAINING_MODEL
    meet0 = meets[0] if meets else None
    out["records_detail"] = [
        {k: r.get(k) for k in ("i", "status", "peers", "allreduce_seconds", "step_s", "apply_s",
                               "phase_seconds", "seconds", "before_meet_s", "exchange_marks",
                               "exchange_start_wall")}
        | {"peer": n, "meeting": None if r.get(key) is None or meet0 is None
           else round(r[key] - meet0, 3)}
        for n in names for r in swarm_records[n]]
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    global PREFIX
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000000")
    ap.add_argument("--peers", default="2,4")
    ap.add_argument("--codecs", default="none,fp16,int8")
    ap.add_argument("--steps", type=int, default=3, help="grouped steps per config")
    ap.add_argument("--mode", choices=sorted(STEP_DEFINITION), default="clock",
                    help="how the peers meet (see STEP_DEFINITION)")
    ap.add_argument("--round-s", type=float, default=0.05, help="clock: inner round time")
    ap.add_argument("--every-rounds", type=int, default=20,
                    help="clock: H (with --round-s it sets the period the peers propose)")
    ap.add_argument("--period", default="fixed", help="clock: period_s; 0: adaptive (as "
                    "nodes), 'fixed': a period longer than the step (fixed_period)")
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--join-window", type=float, default=3.0)
    ap.add_argument("--ns-prefix", default="coll", help="names of our namespaces/links")
    ap.add_argument("--netns", action="store_true", help="also through a 100mbit tbf link")
    ap.add_argument("--netns-only", action="store_true")
    ap.add_argument("--cc", default="", help="TCP congestion control in the namespaces (e.g. "
                    "cubic); default: what a new namespace gets from the host")
    ap.add_argument("--churn-trials", type=int, default=0,
                    help="SIGKILL trials on the clock path (tests/collectives/harness.py)")
    ap.add_argument("--churn-peers", type=int, default=4)
    ap.add_argument("--churn-codec", default="int8", help="the churn trials' codec")
    ap.add_argument("--out", default="bench/results/collectives.json")
    ap.add_argument("--append", action="store_true", help="add to an existing --out file")
    args = ap.parse_args()
    PREFIX = args.ns_prefix
    out_path = Path(args.out)
    t_start = time.monotonic()
    results: dict = {"host": platform.node(), "cpus": os.cpu_count(), "started": time.time(),
                     "allreduce": [], "churn": None}
    if args.append and out_path.exists():
        results = json.loads(out_path.read_text())
    results.update(command=" ".join(["python", "bench/collectives_bench.py", *sys.argv[1:]]),
                   step_definition=STEP_DEFINITION[args.mode],
                   loadavg_start=[round(x, 2) for x in os.getloadavg()])

    def save() -> None:
        atomic_write_bytes(out_path, json.dumps(results, indent=1).encode())

    modes = ([] if args.netns_only else [False]) + ([True] if args.netns or args.netns_only
                                                      else [])
    for netns_mode in modes:
        for size in [int(x) for x in args.sizes.split(",") if x]:
            for peers in map(int, args.peers.split(",")):
                ns = netns_up(peers, args.cc) if netns_mode else None
                try:
                    for codec in args.codecs.split(","):
                        t = time.monotonic()
                        r = run_config(size, peers, codec, args.steps, ns, args)
                        r["wall_s"] = round(time.monotonic() - t, 1)
                        print(json.dumps(r), flush=True)
                        key = (size, peers, codec, netns_mode, args.mode)  # a rerun replaces it
                        results["allreduce"] = [
                            x for x in results["allreduce"]
                            if (x["size"], x["peers"], x["codec"], x["netns"],
                                x.get("mode", "blocking")) != key] + [r]
                        results.update(wall_s=round(time.monotonic() - t_start, 1),
                                       loadavg_end=[round(x, 2) for x in os.getloadavg()])
                        save()
                finally:
                    if netns_mode:
                        netns_down(peers)
    if args.churn_trials:
        root = Path(tempfile.mkdtemp(prefix="collchurn-"))
        swarm = Swarm(root)
        t = time.monotonic()
        load = [round(x, 2) for x in os.getloadavg()]
        try:
            trials = run_churn(swarm, trials=args.churn_trials, seed=int(time.time()),
                               peers=args.churn_peers,
                               opts={"compression": args.churn_codec})
        finally:
            swarm.close()
        done = [r for r in trials if "error" not in r]
        results["churn"] = {
            "path": "clock (peer_worker --clock: after_round/collect, as nodes)",
            "trials": args.churn_trials, "completed": len(done), "peers": args.churn_peers,
            "codec": args.churn_codec,
            "wall_s": round(time.monotonic() - t, 1),
            "kill_step_equal_hashes": sum(r["kill_ok"] for r in done),
            "retry_equal_hashes": sum(r["retry_hashes"] == 1 for r in done),
            "retry_progress": sum(r["retry_ok"] for r in done),
            "joiner_grouped": sum(r["joiner_grouped"] for r in done),
            "kill_status_counts": dict(Counter(s for r in done
                                               for s in r["kill_status"].values())),
            "seconds_per_trial": round((time.monotonic() - t) / max(1, len(trials)), 1),
            "load_before": load, "load_after": [round(x, 2) for x in os.getloadavg()],
            "detail": trials}
        print(json.dumps({k: v for k, v in results["churn"].items() if k != "detail"}))
        save()

if __name__ == "__main__":
    main()
