"""UPnP port mapping against a real router on the WAN bed (issue 33; root only, slow).

A public bootstrap peer ``boot``, ``n1`` behind a ``upnp`` gateway (a home router's NAT plus
Debian's miniupnpd, bench.wan.bed.NAT_MODES) and ``n2`` behind a plain ``home`` gateway; 80 ms
RTT, 50 Mbit/s; swarm processes only (the test is the learner, through IPC; an echo server
stands in for n1's p2pd). The bed's WAN is 11.213.x: miniupnpd 2.3.1 forwards nothing on a
private WAN address.

- n1's PortMapper (swarm.upnp) maps its swarm port, the dial-back from boot comes in through
  the mapping, and n1 is ``public`` with no relay reservation; n2, whose router has no UPnP,
  falls back to a relay as before.
- Once n1's learner announces its collective address, that port is mapped too, and n1's
  announcement carries both mapped addresses first.
- From behind n2's NAT: a 1 MiB echo to n1's mapped collective address (no tunnel, no relay),
  a fresh libp2p host that dials n1's mapped swarm address (Noise proves n1's id), and n2's
  swarm process links to n1 ``direct``.
- The router (miniupnpd's own table, read with miniupnpc from n1's LAN) holds both entries,
  pointing at n1 with the lease asked for, still there after more than one lease (renewed),
  and none once n1 stops.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.wan import WanBed, ensure_iptables, ensure_miniupnpd, hosts, missing
from bench.wan.holepunch import NAMES, NATED, start, tcp_peers
from bench.wan.nat_tunnel import _ECHO_SERVER, echo
from tests.swarm.procs import short_tmpdir, wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing()), reason="WAN bed needs: " + "; ".join(missing()))]

REPO = Path(__file__).resolve().parents[2]
LEASE_S = 20
ECHO_BYTES = 1 << 20
_MAPPINGS = """
import json, miniupnpc
u = miniupnpc.UPnP(); u.discoverdelay = 1000; u.discover(); u.selectigd()
out = []
while True:
    try:
        e = u.getgenericportmapping(len(out))
    except Exception:  # SpecifiedArrayIndexInvalid: past the last entry
        e = None
    if e is None:
        break
    out.append({"external_port": e[0], "client": e[2][0], "internal_port": e[2][1],
                "description": e[3], "lease_left_s": e[6]})
print(json.dumps(out))
"""


def _bed() -> WanBed:
    for ensure in (ensure_iptables, ensure_miniupnpd):
        reason = ensure()
        if reason:
            pytest.skip(f"the upnp gateway needs: {reason}")
    specs = [dataclasses.replace(s, nat_mode="upnp") if s.name == "n1" else s
             for s in hosts(NAMES, rtt_ms=80, rate_mbit=50, nat=NATED, nat_mode="home")]
    return WanBed(specs, subnet="11.213")


def _router_mappings(bed: WanBed) -> list[dict]:
    """The entries of n1's router, as any client on its LAN can list them."""
    out = bed.run("n1", [sys.executable, "-c", _MAPPINGS], capture_output=True, text=True,
                  timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


_MAP = """
import miniupnpc, sys
u = miniupnpc.UPnP(); u.discoverdelay = 1000; u.discover(); u.selectigd()
port = int(sys.argv[1])
try:
    u.addportmapping(port, "TCP", sys.argv[2], port, "bed test", "", 60); print("mapped")
except Exception as e:
    print(e)
"""
_SYN = """
import socket, sys
s = socket.socket(); s.settimeout(3.0)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(16).decode())
except (TimeoutError, socket.timeout):
    print("dropped")
"""
_HELLO = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hello"); c.close()
"""


def test_the_upnp_gateway_forwards_what_a_host_behind_it_maps():
    """The bed mode itself: a home NAT (unsolicited SYNs dropped) until the host maps the
    port with miniupnpc; secure mode refuses a mapping to another LAN address."""
    with pytest.raises(ValueError, match="private"):  # miniupnpd would forward nothing
        WanBed(hosts(["pub", "n"], nat=["n"], nat_mode="upnp"))
    for ensure in (ensure_iptables, ensure_miniupnpd):
        reason = ensure()
        if reason:
            pytest.skip(f"the upnp gateway needs: {reason}")
    with WanBed(hosts(["pub", "n"], rtt_ms=10, nat=["n"], nat_mode="upnp"),
                subnet="11.213") as bed:
        srv = bed.run_in("n", [sys.executable, "-c", _HELLO, bed.addr("n")],
                         stdout=subprocess.PIPE, text=True)
        port = srv.stdout.readline().strip()

        def knock() -> str:
            return bed.run("pub", [sys.executable, "-c", _SYN, bed.public_addr("n"), port],
                           capture_output=True, text=True, timeout=30).stdout.strip()

        def map_to(client: str) -> str:
            return bed.run("n", [sys.executable, "-c", _MAP, port, client],
                           capture_output=True, text=True, timeout=30).stdout.strip()

        assert knock() == "dropped"
        assert map_to("192.168.1.77") == "ConflictInMappingEntry"  # not our address
        assert knock() == "dropped"
        assert map_to(bed.addr("n")) == "mapped"
        assert knock() == "hello"


def test_a_upnp_router_makes_a_nated_node_public_and_directly_reachable():
    with _bed() as bed:
        root = short_tmpdir()
        nodes = None
        try:
            t0 = time.monotonic()
            nodes = start(bed, root, relay={"upnp_lease_s": LEASE_S})
            started = time.monotonic() - t0
            b1, b2, n1 = nodes.bridges["n1"], nodes.bridges["n2"], nodes.n1
            gw1 = bed.public_addr("n1")
            wait_until(lambda: b1.stats().get("reachability_public") == 1, timeout_s=30,
                       what="n1 public through its UPnP mapping")
            public_s = time.monotonic() - t0
            s1 = b1.stats()
            assert s1["upnp_ports"] == 1 and s1["relay_reservations"] == 0, s1
            mapped_at = time.monotonic()
            # n2's router has no UPnP: n2 carries on as before (a relay), after the bound
            wait_until(lambda: b2.stats().get("reachability_relayed") == 1, timeout_s=60,
                       what="n2 relayed")
            relayed_s = time.monotonic() - t0
            assert b2.stats()["upnp_ports"] == 0

            srv = bed.run_in("n1", [sys.executable, "-c", _ECHO_SERVER, bed.addr("n1")],
                             stdout=subprocess.PIPE, text=True)
            cport = int(srv.stdout.readline())
            b1.announce(model="bench", collective_addrs=(
                f"/ip4/{bed.addr('n1')}/tcp/{cport}/p2p/{n1.peer_id}",))
            wait_until(lambda: b1.stats()["upnp_ports"] == 2, timeout_s=15,
                       what="the collective port mapped")

            def seen_by_n2():
                return next((p for p in b2.peers() if p.peer_id == n1.peer_id
                             and p.collective_addrs
                             and p.collective_addrs[0].startswith(f"/ip4/{gw1}/")), None)

            ann = wait_until(seen_by_n2, timeout_s=30, what="n1's mapped addresses at n2")
            assert ann.addrs[0].startswith(f"/ip4/{gw1}/tcp/"), ann.addrs
            m = re.match(r"/ip4/([\d.]+)/tcp/(\d+)/p2p/", ann.collective_addrs[0])
            assert m and m[1] == gw1, ann.collective_addrs

            # n2, behind its own NAT, reaches n1's collective port directly: no tunnel
            result = echo(bed, "n2", m[1], int(m[2]), ECHO_BYTES)
            assert result["ok"], result
            # and its swarm port: a fresh libp2p host dials the mapped address
            out = bed.run("n2", [sys.executable, "-m", "tests.swarm.plain_dialer", ann.addrs[0],
                                 "noise"], capture_output=True, text=True, timeout=60, cwd=REPO)
            assert json.loads(out.stdout or "{}").get("connected"), (out.stdout, out.stderr[-2000:])
            # the swarm processes: n2's link to n1 is direct, its kernel holds a TCP
            # connection to n1's gateway
            wait_until(lambda: b2.links().get(n1.peer_id) == "direct", timeout_s=30,
                       what="n2's link to n1 direct")
            assert gw1 in tcp_peers(bed, "n2"), tcp_peers(bed, "n2")

            entries = _router_mappings(bed)
            ports = {int(re.search(r"/tcp/(\d+)", ann.addrs[0])[1]): "swarm", int(m[2]): "collective"}
            assert {e["external_port"] for e in entries} == set(ports), entries
            for e in entries:
                assert e["client"] == bed.addr("n1"), e
                assert e["description"] == f"swarm-node {ports[e['external_port']]}", e
                assert 0 < e["lease_left_s"] <= LEASE_S, e
            # renewed: still there more than a lease after the first mapping
            time.sleep(max(0.0, mapped_at + LEASE_S + 3 - time.monotonic()))
            s1 = b1.stats()
            assert s1["upnp_renewed"] >= 2 and s1["upnp_failed"] == 0, s1
            assert s1["reachability_public"] == 1, s1
            later = _router_mappings(bed)
            assert {e["external_port"] for e in later} == set(ports), later
            assert all(0 < e["lease_left_s"] <= LEASE_S for e in later), later

            # a clean stop removes both mappings
            assert n1.stop() == 0
            assert _router_mappings(bed) == []
            assert "UPnP: removed the mapping" in n1.log()
            print(f"upnp: n1 public {public_s:.1f} s after start (processes up in "
                  f"{started:.1f} s), n2 (no UPnP) relayed at {relayed_s:.1f} s; "
                  f"1 MiB echo to the mapped collective port {result['seconds']:.2f} s; "
                  f"{s1['upnp_renewed']} renewals; n1 punches {s1.get('holepunch_attempts')}, "
                  f"n2 punches {b2.stats().get('holepunch_attempts')}")
        finally:
            if nodes is not None:
                nodes.stop()
            shutil.rmtree(root, ignore_errors=True)
