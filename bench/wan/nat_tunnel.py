"""What a NATed node's collective traffic costs: bytes through a swarm tunnel over a relayed
libp2p connection vs raw TCP over the same WAN bed (root only; never fails for slowness).

Bed: boot (public bootstrap, a relay), pub (public), n1 and n2 each behind its own NAT; every
pair at --rtt-ms, --rate-mbit upload per host. Swarm processes only. Measured, as an echo of
--mib MiB (so each byte crosses twice):
- raw:      TCP from pub to an echo server on boot (direct, same RTT);
- tunnel:   pub -> n2's echo server through pub's swarm tunnel (n2 only reachable relayed);
- nat2nat:  n1 -> n2's echo server through n1's tunnel (both NATed: via a relay), with hole
            punching off (``relay.hole_punch = false``);
- with ``--punch``: hole punching on, the gateways in ``home`` mode, and nat2nat measured once
            n1 and n2 hold a direct (punched) connection: the tunnel runs over it (``ss -tin``
            of that connection before and after, ``n1_tcp_to_n2_*``).
``--repeat N``: N echoes per row one after the other, the row's seconds their median.

    PYTHONPATH=$PWD python -m bench.wan.nat_tunnel --rtt-ms 80 --rate-mbit 50 --mib 2 [--punch]
Writes bench/results/wan_nat_tunnel.json atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from protocol import atomic_write_bytes

from .bed import WanBed, hosts
from .procs import WanProcs

_ECHO_SERVER = """
import socket, sys, threading
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True)
def h(c):
    while d := c.recv(65536): c.sendall(d)
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=h, args=(c,), daemon=True).start()
"""
_ECHO_CLIENT = """
import json, socket, sys, threading, time
t = time.monotonic(); c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=300)
data = bytes(range(256)) * (int(sys.argv[3]) // 256)
threading.Thread(target=c.sendall, args=(data,), daemon=True).start()
got = 0
while got < len(data):
    d = c.recv(65536)
    if not d: break
    got += len(d)
print(json.dumps({"ok": got == len(data), "seconds": time.monotonic() - t}))
"""


def echo(bed: WanBed, src: str, host: str, port: int, nbytes: int) -> dict:
    out = bed.run(src, [sys.executable, "-c", _ECHO_CLIENT, host, str(port), str(nbytes)],
                  capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout) if out.returncode == 0 else {"ok": False, "error": out.stderr[-500:]}


def echoes(bed: WanBed, src: str, host: str, port: int, nbytes: int, repeat: int) -> dict:
    """``repeat`` echoes one after the other: ``seconds`` is their median, ``all`` each one
    (the first over a fresh connection's slow start, as a new exchange would be)."""
    runs = [echo(bed, src, host, port, nbytes) for _ in range(repeat)]
    times = [r["seconds"] for r in runs if r.get("ok")]
    return {"ok": len(times) == repeat, "seconds": statistics.median(times) if times else None,
            "all": times, **({"error": runs[-1]["error"]} if "error" in runs[-1] else {})}


def tcp_info(bed: WanBed, name: str, peer_ip: str) -> list[str]:
    """``ss -tin`` of host ``name``'s established connections to ``peer_ip`` (cwnd, rtt,
    retransmissions): what a punched connection starts with."""
    out = bed.run(name, ["ss", "-tinH", "state", "established", "dst", peer_ip],
                  capture_output=True, text=True, timeout=10).stdout
    return [" ".join(line.split()) for line in out.splitlines() if line.strip()]


def run(rtt_ms: float, rate_mbit: float, mib: float, *, punch: bool = False,
        repeat: int = 1) -> dict:
    from node.ipc_client import SocketBridge
    from tests.swarm.procs import short_tmpdir, wait_until

    nbytes = int(mib * (1 << 20))
    specs = hosts(["boot", "pub", "n1", "n2"], rtt_ms=rtt_ms, rate_mbit=rate_mbit,
                  nat=["n1", "n2"], nat_mode="home" if punch else "masquerade")
    with WanBed(specs) as bed:
        root = short_tmpdir()
        ps = WanProcs(root, bed)
        bridges: list[SocketBridge] = []
        try:
            boot = ps.nodes(["boot"], learner=False, bootstrap_only=True)[0]
            pub, n1, n2 = ps.nodes(["pub", "n1", "n2"], bootstrap=(boot.addr,),
                                   relay={"hole_punch": punch})
            b = {p.name: SocketBridge.connect(p.ready["ipc"]) for p in (pub, n1, n2)}
            bridges += b.values()
            wait_until(lambda: all(x.stats().get("reachability_relayed") for x in (b["n1"], b["n2"])),
                       timeout_s=60, what="NATed nodes relayed")
            servers = {}
            for h in ("boot", "n2"):
                srv = bed.run_in(h, [sys.executable, "-c", _ECHO_SERVER, bed.addr(h)],
                                 stdout=subprocess.PIPE, text=True)
                servers[h] = int(srv.stdout.readline())
            b["n2"].announce(model="bench", collective_addrs=(
                f"/ip4/{bed.addr('n2')}/tcp/{servers['n2']}/p2p/{n2.peer_id}",))
            wait_until(lambda: any(p.peer_id == n2.peer_id and p.collective_addrs
                                   for p in b["pub"].peers()), timeout_s=30, what="announce")
            if punch:  # n1's peers: boot, pub and n2, all direct
                wait_until(lambda: b["n1"].stats().get("peers_direct", 0) >= 3
                           and not b["n1"].stats().get("peers_relayed"), timeout_s=90,
                           what="n1 and n2 punched")
            load = os.getloadavg()
            result: dict = {}
            if punch:  # the punched connection's TCP state before any tunnel ran over it
                result["n1_tcp_to_n2_before"] = tcp_info(bed, "n1", bed.public_addr("n2"))
            result["raw"] = echoes(bed, "pub", bed.addr("boot"), servers["boot"], nbytes, repeat)
            for name, src in (("tunnel", "pub"), ("nat2nat", "n1")):
                host, port = b[src].tunnel(n2.peer_id)
                result[name] = echoes(bed, src, host, port, nbytes, repeat)
            if punch:
                result["n1_tcp_to_n2_after"] = tcp_info(bed, "n1", bed.public_addr("n2"))
            raw = result["raw"].get("seconds")
            for name in ("tunnel", "nat2nat"):
                s = result[name].get("seconds")
                result[name]["fraction_of_raw_tcp"] = raw / s if raw and s else None
            return {"rtt_ms": rtt_ms, "rate_mbit": rate_mbit, "echo_mib": mib, "punch": punch,
                    "repeat": repeat,
                    "loadavg_before": load, "loadavg_after": os.getloadavg(), **result}
        finally:
            for x in bridges:
                x.close()
            ps.stop_all()
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rtt-ms", type=float, default=80.0)
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--mib", type=float, default=2.0)
    ap.add_argument("--punch", action="store_true", help="hole punching on (home NATs)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="echoes per row, one after the other (the row says their median)")
    ap.add_argument("--out", default="bench/results/wan_nat_tunnel.json")
    args = ap.parse_args()
    t = time.monotonic()
    if args.repeat < 1:
        ap.error(f"--repeat: {args.repeat} must be >= 1")
    result = run(args.rtt_ms, args.rate_mbit, args.mib, punch=args.punch, repeat=args.repeat)
    result["command"] = " ".join(sys.argv)
    result["wall_s"] = time.monotonic() - t
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, (json.dumps(result, indent=2) + "\n").encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
