"""`swarm-node doctor` on a NATed host of the WAN bed says what the node would learn: relayed
(root only).

One public bootstrap peer (it serves a circuit relay, as every bootstrap peer does) and one
host behind its own NAT gateway. The doctor's probe listens on the NATed host's swarm address
and asks the bootstrap peer to dial it back; the bootstrap peer dials the address it saw the
request from, the gateway's, where nothing is forwarded, so the verdict is ``relayed``, with
the gateway's address in the advice (tests/wan/test_nat.py: the node itself reports
``relayed`` there). The public verdict is tests/node/test_doctor.py's, on loopback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.wan import WanBed, ensure_iptables, hosts, missing

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing()), reason="WAN bed needs: " + "; ".join(missing()))]

SWARM = "doctor-nat"


@pytest.fixture
def bed():
    reason = ensure_iptables()
    if reason:
        pytest.skip(f"NAT needs iptables: {reason}")
    with WanBed(hosts(["boot", "n1"], rtt_ms=20, rate_mbit=50, nat=["n1"])) as b:
        yield b


def _bootstrap(bed: WanBed, base: Path) -> str:
    with open(base / "bootstrap.log", "wb") as log:  # the child keeps its own copy
        p = bed.run_in("boot", [sys.executable, "-m", "node", "bootstrap", "--listen",
                                f"/ip4/{bed.addr('boot')}/tcp/0", "--data-dir",
                                str(base / "bootstrap"), "--swarm-id", SWARM],
                       stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    line = p.stdout.readline().decode().strip()  # the bed stops it on close
    assert "/p2p/12D3KooW" in line, (base / "bootstrap.log").read_text()[-2000:]
    return line


def test_doctor_behind_nat_says_relayed_and_how_to_be_dialled_directly(bed, tmp_path):
    boot = _bootstrap(bed, tmp_path)
    out = bed.run("n1", [sys.executable, "-m", "node", "doctor", "--bootstrap", boot,
                         "--listen", f"/ip4/{bed.addr('n1')}/tcp/0", "--swarm-id", SWARM,
                         "--data-dir", str(tmp_path / "n1"), "--device", "cpu"],
                  capture_output=True, text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stdout + out.stderr  # a warning, not a failure
    assert [line.split()[1] for line in lines][-3:] == ["bootstrap", "reachable", "clock"], lines
    assert lines[-3].startswith("ok    bootstrap"), lines  # dialling out works through NAT
    gateway, peer = bed.public_addr("n1"), boot.rsplit("/p2p/", 1)[1]
    assert lines[-2].startswith(f"warn  reachable  relayed: {peer[:16]}… could not dial us back "
                                f"at {gateway}:"), lines
    assert lines[-1].startswith(f"ok    clock      this clock agrees with {peer[:16]}…'s"), lines
    assert lines[-2].endswith(
        "(NAT or firewall) but serves a circuit relay: peers will reach this node through it; "
        "fix: this node can train as it is; to be dialled directly (faster outer steps), listen "
        "on a fixed port (--listen /ip4/0.0.0.0/tcp/4001), forward TCP ports 4001 and 4002 on "
        f"your router to this machine and add --announce /ip4/{gateway}/tcp/4001"), lines
