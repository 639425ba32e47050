"""The outer step with every peer behind NAT: through relays, or over punched connections.

bench/wan/collectives.py ``--nat relayed punched`` runs this (root only; never fails for
slowness). Bed: ``boot`` (public bootstrap peer, the relay) and ``n1``..``nK``, each behind its
own NAT gateway, every pair at the RTT, each host's upload at the rate. Each NATed host runs
a swarm process (swarm.tunnel carries the collective, as on a node) and a collective peer
(tests/collectives/peer_worker.py ``--clock``, as in collectives_bench.run_config). Peer a
reaches peer b's p2pd as a node's learner does (node/learner_process.py ``_tunnelled``): at
a local port of a's swarm process that tunnels to b's (``addrs/<a>/<b>.txt``).

- ``relayed``: ``masquerade`` gateways, hole punching off: every tunnel rides a relayed
  connection through boot.
- ``punched``: ``home`` gateways (port-preserving, unsolicited inbound dropped), hole punching
  on; the peers start once every NATed pair holds a direct connection and no relayed one, so
  the tunnels ride the punched connections.
- ``upnp``: ``upnp`` gateways (a home NAT plus Debian's miniupnpd; the bed's WAN is 11.213.x,
  bench.wan.bed): each swarm process maps its swarm port and, once announced, its peer's
  collective port (swarm.upnp), and is ``public``; peer a dials the mapped collective address
  b's swarm process announced, with no tunnel and no relay (node/learner_process.py
  ``_discover``: a public peer's announced address).

Baseline: raw TCP of the bytes a peer sent (median) from n1 to an echo-less sink on boot, one
way over the same RTT and upload limit (a NATed host cannot be dialled, so not n1 -> n2).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import collectives_bench as cb
from protocol import atomic_write_bytes

from .bed import WanBed, hosts
from .checks import ensure_iptables, ensure_miniupnpd
from .procs import WanProcs

__all__ = ["NAT_PATHS", "run_nat"]

NAT_PATHS = {"relayed": ("masquerade", False), "punched": ("home", True), "upnp": ("upnp", False)}
"""--nat value -> (gateway mode, hole punching on)."""


def raw_tcp_out(bed: WanBed, src: str, dst: str, nbytes: int) -> float:
    """Seconds to push ``nbytes`` over one TCP connection from ``src`` to a sink on ``dst``."""
    srv = bed.run_in(dst, [sys.executable, "-c", cb.RAW_SERVER, bed.addr(dst)],
                     stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())  # type: ignore[union-attr]
        out = bed.run(src, [sys.executable, "-c", cb.RAW_CLIENT, bed.addr(dst), str(port),
                            str(nbytes)], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"raw TCP client failed: {out.stderr[-500:]}")
        return float(out.stdout.strip())
    finally:
        srv.kill()
        srv.wait()


def _swarms(bed: WanBed, ps: WanProcs, names: list[str], punch: bool,
            upnp: bool) -> dict[str, Any]:
    """boot and the NATed nodes' swarm processes, once each pair is linked as asked."""
    from node.ipc_client import SocketBridge
    from tests.swarm.procs import wait_until

    boot = ps.nodes(["boot"], learner=False, bootstrap_only=True)[0]
    procs = ps.nodes(names, bootstrap=(boot.addr,), relay={"hole_punch": punch, "upnp": upnp})
    bridges = {p.name: SocketBridge.connect(p.ready["ipc"]) for p in procs}
    stat = "reachability_public" if upnp else "reachability_relayed"
    wait_until(lambda: all(b.stats().get(stat) for b in bridges.values()), timeout_s=90,
               interval_s=0.2, what="NATed nodes " + stat.split("_")[1])
    ids = {p.name: p.peer_id for p in procs}
    if upnp:  # the collective dials the mapped addresses, whatever the swarm links are
        return {"ids": ids, "bridges": bridges}
    want = "direct" if punch else "relayed"

    def linked() -> bool:
        return all(bridges[a].links().get(ids[b]) == want
                   for a in names for b in names if a != b)

    wait_until(linked, timeout_s=120 if punch else 60, interval_s=0.2,
               what=f"NATed pairs {want}")
    return {"ids": ids, "bridges": bridges}


def _mapped(bridge: Any, peer_id: str, gateway_ip: str) -> str | None:
    """The collective address ``peer_id`` announced on its gateway's public IP (its UPnP
    mapping), as ``bridge``'s swarm process heard it; None until then."""
    for p in bridge.peers():
        if p.peer_id == peer_id:
            return next((a for a in p.collective_addrs if a.startswith(f"/ip4/{gateway_ip}/")),
                        None)
    return None


def run_nat(path: str, rtt_ms: float, *, peers: int, size: int, codec: str, steps: int,
            rate_mbit: float, deadline: float) -> dict:
    """One row: ``peers`` NATed collective peers over ``path`` (a key of NAT_PATHS)."""
    from tests.collectives.harness import Swarm
    from tests.swarm.procs import short_tmpdir, wait_until

    mode, punch = NAT_PATHS[path]
    upnp = mode == "upnp"
    if upnp:
        reason = ensure_iptables() or ensure_miniupnpd()
        if reason:
            raise RuntimeError(f"the upnp gateway needs: {reason}")
    names = [f"n{i + 1}" for i in range(peers)]
    specs = hosts(["boot", *names], rtt_ms=rtt_ms, rate_mbit=rate_mbit, nat=names,
                  nat_mode=mode)
    root = short_tmpdir()
    coll = Path(root) / "coll"
    # the same period on both paths, long enough for a relayed step (fixed_period assumes
    # 100 Mbit/s and a direct path)
    period = 4 * cb.fixed_period(size, peers, codec, True)
    # miniupnpd 2.3.1 forwards nothing on a private WAN address (bench.wan.bed)
    with (WanBed(specs, subnet="11.213") if upnp else WanBed(specs)) as bed:
        ps = WanProcs(Path(root) / "swarm", bed)
        coll.mkdir(parents=True)  # Swarm.close() writes its stop file there
        workers = Swarm(coll)
        bridges: dict[str, Any] = {}
        try:
            t0 = time.monotonic()
            sw = _swarms(bed, ps, names, punch, upnp)
            bridges = sw["bridges"]
            linked_s = time.monotonic() - t0
            for i, n in enumerate(names):
                (coll / "addrs" / n).mkdir(parents=True, exist_ok=True)
                workers.spawn(n, seed=i + 1, steps=steps, peers=peers, compression=codec,
                              numel=size, no_save=True, deadline=deadline, join_window=3.0,
                              host=f"/ip4/{bed.addr(n)}/tcp/0", prefix=bed.prefix(n),
                              addrs_dir=str(coll / "addrs" / n), clock=True, round_s=0.05,
                              every_rounds=20, period=period,
                              duration=steps * (deadline + 10) + 60, trust="all")
            own = coll / "addrs"
            wait_until(lambda: all((own / f"{n}.txt").exists() for n in names), timeout_s=120,
                       interval_s=0.2, what="collective peers up")
            addrs = {n: (own / f"{n}.txt").read_text().split() for n in names}
            for n in names:  # the tunnel's far end forwards to the learner's announced p2pd
                bridges[n].announce(model="bench", collective_addrs=tuple(addrs[n]))
            for a in names:  # every view complete before any worker counts its peers
                for b in names:
                    if a == b:
                        continue
                    p2pd_id = addrs[b][0].rsplit("/p2p/", 1)[1]
                    if upnp:  # b's swarm process mapped b's collective port and announced it
                        gw = bed.public_addr(b)
                        mapped = wait_until(lambda: _mapped(bridges[a], sw["ids"][b], gw),
                                            timeout_s=60, interval_s=0.2,
                                            what=f"{b}'s mapped collective address at {a}")
                        addr = mapped.rsplit("/p2p/", 1)[0] + f"/p2p/{p2pd_id}"
                    else:
                        host, port = bridges[a].tunnel(sw["ids"][b])
                        addr = f"/ip4/{host}/tcp/{port}/p2p/{p2pd_id}"
                    atomic_write_bytes(coll / "addrs" / a / f"{b}.txt", addr.encode())
            for a in names:
                atomic_write_bytes(coll / "addrs" / a / f"{a}.txt", "\n".join(addrs[a]).encode())
            load0 = os.getloadavg()
            t = time.monotonic()
            workers.wait_done(names, timeout=steps * (deadline + 60) + 300)
            wall = time.monotonic() - t
            recs = [dict(r, peer=n) for n in names for r in workers.records(n).values()]
            links = {n: bridges[n].stats() for n in names}
        finally:
            workers.close()
            for b in bridges.values():
                b.close()
            ps.stop_all()
        ok = [r for r in recs if r["peers"] >= 2 and r["status"] == "ok"
              and r.get("step_s") is not None]
        out: dict[str, Any] = {
            "nat": path, "gateway_mode": mode, "hole_punch": punch, "rtt_ms": rtt_ms,
            "rate_mbit": rate_mbit, "size": size, "peers": peers, "codec": codec,
            "steps": steps, "period_s": period, "linked_s": round(linked_s, 1),
            "records": len(recs), "ok_records": len(ok), "wall_s": round(wall, 1),
            "loadavg_before": [round(x, 2) for x in load0],
            "links": {n: {k: v for k, v in s.items() if k.startswith(("peers_", "holepunch",
                                                                        "tunnels_", "upnp_"))}
                      for n, s in links.items()}}
        if ok:
            sent = statistics.median(r["bytes_sent"] for r in ok)
            ar = statistics.median(r["allreduce_seconds"] for r in ok)
            step = statistics.median(r["step_s"] for r in ok)
            raw = raw_tcp_out(bed, names[0], "boot", int(sent))
            out.update(allreduce_s_median=ar, allreduce_s_all=[r["allreduce_seconds"] for r in ok],
                       step_s_median=step, step_s_all=[r["step_s"] for r in ok],
                       hashes_equal=all(len({r["param_hash"] for r in ok if r["meet"] == m}) == 1
                                        for m in {r["meet"] for r in ok}),
                       bytes_sent_per_peer=sent, raw_tcp_s=raw,
                       fraction_of_raw=round(raw / ar, 3),
                       step_overhead_s=round(step - raw, 3))
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    shutil.rmtree(root, ignore_errors=True)
    return out
