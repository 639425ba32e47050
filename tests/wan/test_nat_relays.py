"""Relays killed mid-run, on the WAN bed (root only): what a node behind NAT does.

Swarm processes only (the learner side is the test, through the IPC bridge): a public
bootstrap peer and a public node (both circuit relays), two nodes each behind its own NAT,
80 ms RTT, 50 Mbit/s. Stated behaviour, asserted here:
- with the relays up, the NATed nodes say ``relayed`` and get each other's rollouts;
- both relays SIGKILLed: the NATed nodes stay responsive (no hang: every IPC call answers
  within seconds), log "lost the relay <id>" and switch to ``unreachable`` with a reason
  that says what to do;
- the bootstrap relay comes back (same identity and address): they reserve on it again,
  say ``relayed`` and exchange rollouts again.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest

from bench.wan import WanBed, ensure_iptables, hosts, missing
from bench.wan.procs import NsSwarmProc, WanProcs
from node.ipc_client import SocketBridge
from tests.swarm.conftest import batch
from tests.swarm.procs import short_tmpdir, wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing()), reason="WAN bed needs: " + "; ".join(missing()))]

NATED = ("n1", "n2")


@pytest.fixture
def bed():
    reason = ensure_iptables()
    if reason:
        pytest.skip(f"NAT needs iptables: {reason}")
    with WanBed(hosts(["boot", "pub", *NATED], rtt_ms=80, rate_mbit=50, nat=list(NATED))) as b:
        yield b


def _state(bridge: SocketBridge) -> str:
    stats = bridge.stats()
    return next((k[len("reachability_"):] for k, v in stats.items()
                 if k.startswith("reachability_") and v), "?")


def _free_port() -> int:
    """A port for the bootstrap peer, fixed so that it comes back at the same address (the
    bed's namespace is fresh: any port is free there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exchange(bridges: dict[str, SocketBridge], ids: dict[str, str], *, timeout_s: float) -> None:
    """Publish until each NATed node received a batch from the other one."""
    got: dict[str, set[str]] = {n: set() for n in bridges}
    deadline = time.monotonic() + timeout_s
    k = int(time.time())
    while time.monotonic() < deadline:
        k += 1
        for n, b in bridges.items():
            b.publish(batch(n, k))
        time.sleep(1.0)
        for n, b in bridges.items():
            got[n] |= {r.sender for r in b.receive("rollouts")}
        if all(ids[o] in got[n] for n in bridges for o in bridges if o != n):
            return
    raise AssertionError(f"no exchange in {timeout_s} s: {got}")


def test_relays_killed_then_one_returns(bed):
    root = short_tmpdir()
    ps = WanProcs(root, bed)
    bridges: dict[str, SocketBridge] = {}
    try:
        port = _free_port()
        boot_cfg = ps.config("boot", listen=(f"/ip4/{bed.addr('boot')}/tcp/{port}",),
                             bootstrap_only=True)
        boot = NsSwarmProc(boot_cfg, "boot", prefix=tuple(bed.prefix("boot"))).start()
        ps.procs.append(boot)
        pub, *nated = ps.nodes(["pub", *NATED], bootstrap=(boot.addr,))
        bridges.update({p.name: SocketBridge.connect(p.ready["ipc"]) for p in nated})
        ids = {p.name: p.peer_id for p in nated}
        wait_until(lambda: all(_state(b) == "relayed" for b in bridges.values()),
                   timeout_s=60, what="NATed nodes relayed")
        _exchange(bridges, ids, timeout_s=60)

        boot.kill()
        pub.kill()
        t = time.monotonic()
        wait_until(lambda: all(_state(b) == "unreachable" for b in bridges.values()),
                   timeout_s=60, what="NATed nodes unreachable after the relays died")
        lost_after = time.monotonic() - t
        for p in nated:
            t = time.monotonic()
            stats = bridges[p.name].stats()
            assert time.monotonic() - t < 5.0, "IPC stalled"
            assert stats["relay_lost"] >= 1 and stats["relay_reservations"] == 0, stats
            log = Path(p.log_path).read_text(errors="replace")
            assert "lost the relay" in log and "reachability unreachable" in log, log[-3000:]
            assert "Forward TCP ports" in log, log[-3000:]

        back = NsSwarmProc(boot_cfg, "boot2", prefix=tuple(bed.prefix("boot"))).start()
        ps.procs.append(back)
        assert back.peer_id == boot.peer_id and back.addr == boot.addr
        t = time.monotonic()
        wait_until(lambda: all(_state(b) == "relayed" for b in bridges.values()),
                   timeout_s=60, what="NATed nodes relayed again")
        _exchange(bridges, ids, timeout_s=60)
        print(f"relays killed: unreachable after {lost_after:.1f} s; relay back: relayed and "
              f"exchanging again after {time.monotonic() - t:.1f} s")
    finally:
        for b in bridges.values():
            b.close()
        ps.stop_all()
        shutil.rmtree(root, ignore_errors=True)
