"""Outer-step benchmark: time and bytes/s of the all-reduce vs raw TCP of the same bytes.

Runs real peer processes (tests/collectives/peer_worker.py) for each (size, peers, codec)
config, on loopback and optionally through a rate-limited link (one network namespace per
peer, veth into a bridge, ``tc qdisc ... tbf rate 100mbit`` on each peer's egress; needs
root). In the same run it times a raw TCP transfer of the same number of bytes per peer
over the same path and reports the ratio. Also runs the randomized churn trials.

    PYTHONPATH=$PWD python bench/collectives_bench.py --sizes 10000000 --peers 2,4 \\
        --codecs none,fp16,int8 [--netns] [--churn-trials 50]

Never fails for slowness; writes bench/results/collectives.json.
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


def netns_up(n: int) -> list[str]:
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
        names.append(ns)
    return names


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


def raw_tcp_seconds(nbytes: int, *, netns: list[str] | None) -> float:
    """Seconds to push ``nbytes`` over one TCP connection (peer 0 -> peer 1 path)."""
    host = f"{SUBNET}.2" if netns else "127.0.0.1"
    pre_srv = ["ip", "netns", "exec", netns[1]] if netns else []
    srv = subprocess.Popen(pre_srv + [sys.executable, "-c", RAW_SERVER, host],
                           stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())  # type: ignore[union-attr]
    client = (
        "import socket,sys,time\n"
        "c=socket.create_connection((sys.argv[1],int(sys.argv[2])));buf=b'x'*(1<<20)\n"
        "n=int(sys.argv[3]);t=time.perf_counter()\n"
        "while n>0:\n    k=min(n,len(buf));c.sendall(buf[:k]);n-=k\n"
        "c.shutdown(socket.SHUT_WR);c.recv(1);print(time.perf_counter()-t)\n")
    pre_cli = ["ip", "netns", "exec", netns[0]] if netns else []
    out = subprocess.run(pre_cli + [sys.executable, "-c", client, host, str(port), str(nbytes)],
                         capture_output=True, text=True, check=True)
    srv.wait(30)
    return float(out.stdout.strip())


# --- one all-reduce config --------------------------------------------------------------
def run_config(size: int, peers: int, codec: str, steps: int, netns: list[str] | None,
               deadline: float, join_window: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="collbench-"))
    load_before = [round(x, 2) for x in os.getloadavg()]
    swarm = Swarm(root)
    names = [f"b{i}" for i in range(peers)]
    try:
        for i, n in enumerate(names):
            host = f"/ip4/{SUBNET}.{i + 1}/tcp/0" if netns else "/ip4/127.0.0.1/tcp/0"
            swarm.spawn(n, seed=i + 1, steps=steps, peers=peers, compression=codec,
                        numel=size, no_save=True, deadline=deadline, join_window=join_window,
                        barrier_timeout=600, host=host,
                        prefix=["ip", "netns", "exec", netns[i]] if netns else None)
        swarm.wait_done(names, timeout=steps * (deadline + 60) + 300)
        recs = [r for n in names for r in swarm.records(n).values()]
    finally:
        swarm.close()
    ok = [r for r in recs if r["status"] == "ok" and "allreduce_seconds" in r]
    hashes_equal = all(len({r["param_hash"] for r in recs if r["i"] == i}) == 1
                       for i in {r["i"] for r in recs})
    out = {"size": size, "peers": peers, "codec": codec, "netns": bool(netns),
           "steps": steps, "ok_records": len(ok), "records": len(recs),
           "hashes_equal": hashes_equal, "join_window_s": join_window,
           "load_before": load_before}
    if ok:
        ar = [r["allreduce_seconds"] for r in ok]
        sent = statistics.median(r["bytes_sent"] for r in ok)
        raw = raw_tcp_seconds(int(sent), netns=netns)
        step = statistics.median(r["seconds"] for r in ok)
        out.update(allreduce_s_median=statistics.median(ar), allreduce_s_all=ar,
                   step_s_median=step, bytes_sent_per_peer=sent,
                   achieved_bytes_per_s=sent / statistics.median(ar), raw_tcp_s=raw,
                   raw_tcp_bytes_per_s=sent / raw,
                   fraction_of_raw=round(raw / statistics.median(ar), 3),
                   step_overhead_s=round(step - raw, 3))
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    global PREFIX
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000000")
    ap.add_argument("--peers", default="2,4")
    ap.add_argument("--codecs", default="none,fp16,int8")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--join-window", type=float, default=3.0)
    ap.add_argument("--ns-prefix", default="coll", help="names of our namespaces/links")
    ap.add_argument("--netns", action="store_true", help="also through a 100mbit tbf link")
    ap.add_argument("--netns-only", action="store_true")
    ap.add_argument("--churn-trials", type=int, default=0)
    ap.add_argument("--out", default="bench/results/collectives.json")
    ap.add_argument("--append", action="store_true", help="add to an existing --out file")
    args = ap.parse_args()
    PREFIX = args.ns_prefix
    out_path = Path(args.out)
    results: dict = {"host": platform.node(), "cpus": os.cpu_count(), "started": time.time(),
                     "allreduce": [], "churn": None}
    if args.append and out_path.exists():
        results = json.loads(out_path.read_text())

    def save() -> None:
        atomic_write_bytes(out_path, json.dumps(results, indent=1).encode())

    modes = ([] if args.netns_only else [False]) + ([True] if args.netns or args.netns_only
                                                      else [])
    for netns_mode in modes:
        for size in [int(x) for x in args.sizes.split(",") if x]:
            for peers in map(int, args.peers.split(",")):
                ns = netns_up(peers) if netns_mode else None
                try:
                    for codec in args.codecs.split(","):
                        t = time.monotonic()
                        r = run_config(size, peers, codec, args.steps, ns, args.deadline,
                                       args.join_window)
                        r["wall_s"] = round(time.monotonic() - t, 1)
                        print(json.dumps(r), flush=True)
                        key = (size, peers, codec, netns_mode)  # a rerun replaces a row
                        results["allreduce"] = [
                            x for x in results["allreduce"]
                            if (x["size"], x["peers"], x["codec"], x["netns"]) != key] + [r]
                        save()
                finally:
                    if netns_mode:
                        netns_down(peers)
    if args.churn_trials:
        root = Path(tempfile.mkdtemp(prefix="collchurn-"))
        swarm = Swarm(root)
        t = time.monotonic()
        try:
            trials = run_churn(swarm, trials=args.churn_trials, seed=int(time.time()))
        finally:
            swarm.close()
        results["churn"] = {
            "trials": len(trials), "wall_s": round(time.monotonic() - t, 1),
            "kill_step_equal_hashes": sum(r["kill_hashes"] == 1 for r in trials),
            "retry_equal_hashes": sum(r["retry_hashes"] == 1 for r in trials),
            "retry_all_ok": sum(all(v == "ok" for n, v in r["retry_status"].items()
                                    if n != r["joiner"]) for r in trials),
            "retry_progress": sum([r["retry_status"][n] for n in r["survivors"]].count("ok") >= 2
                                  for r in trials),
            "seconds_per_trial": round((time.monotonic() - t) / max(1, len(trials)), 1),
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "detail": trials}
        print(json.dumps({k: v for k, v in results["churn"].items() if k != "detail"}))
        save()


if __name__ == "__main__":
    main()
