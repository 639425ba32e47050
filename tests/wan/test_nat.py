"""Nodes behind NAT on the WAN bed take full part (issue 13; root only).

One public bootstrap host (it also runs a training node), one public node and two nodes each
behind its own NAT gateway; 80 ms RTT between any two hosts, 50 Mbit/s upload per host.

What happens, measured here: the NATed nodes learn they cannot be dialled (dial-back through
the bootstrap peer, swarm.reachability), reserve slots on the circuit relays that the public
nodes serve and report ``relayed`` (their own reachability: nobody can dial them first).
Between the two NATed nodes the relayed connection may be hole punched to a direct one
(swarm.holepunch; the bed's default ``masquerade`` gateways allow it): rollouts and the
collective's tunnel (swarm.tunnel) then take the direct connection, otherwise the relay; an
outer step has all four members with one state hash either way. tests/wan/test_holepunch.py
shows the punch itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.wan import WanBed, ensure_iptables, hosts, missing
from tests.rounds import due_senders, senders

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing()), reason="WAN bed needs: " + "; ".join(missing()))]

SWARM = "nat-test"
NAMES = ["boot", "pub", "n1", "n2"]
NATED = ["n1", "n2"]
ROUNDS = 10
DELIVERY_S = 10.0
"""Time a published batch may take to reach a subscriber's inbox (through a relay at 80 ms
RTT: well under a second; the rest is slack for a loaded 2-core box)."""
CONFIG = """
[learner]
# rounds of realistic length: the embedded model's rounds take 0.05-0.2 s, so 6 of them ended
# before a peer's rollouts could arrive (a learner started seconds after another, as on a
# loaded 2-core box, found everyone else done)
slowdown_for_tests = 10.0
[outer]
# one outer step, the run's last (collectives.finish: finished peers wait for every peer they
# discovered, then step together). Steps during the run grouped whoever was training then: two
# early learners stepped apart while a late one was still in its first round, which could then
# not adopt a version only a minority of its witnesses signed, and no step had all four
every_rounds = 1000
[outer.schedule]
# the least read window of a meeting: learners that finish their rounds apart keep attending
# meetings (collectives.finish), on the shortest period whose window holds this (16 s here;
# 25 s made it 64 s, so finished nodes waited a minute per meeting), wider than a rendezvous
# over tunnels at 80 ms RTT on a loaded 2-core box (1.7-2.7 s measured)
join_window_s = 8.0
deadline_s = 90.0
# learners that start far apart on a loaded box finish far apart: the first waits for the last
final_wait_s = 120.0
[gossip.announcements]
interval_s = 1.0
[gossip.peers]
ttl_s = 6.0
maintain_interval_s = 0.5
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "node", *args]


@pytest.fixture
def bed():
    reason = ensure_iptables()
    if reason:
        pytest.skip(f"NAT needs iptables: {reason}")
    with WanBed(hosts(NAMES, rtt_ms=80, rate_mbit=50, nat=NATED)) as b:
        yield b


def _bootstrap(bed: WanBed, base: Path) -> tuple[subprocess.Popen, str]:
    with open(base / "bootstrap.log", "wb") as log:  # the child keeps its own copy
        p = bed.run_in("boot", _cli("bootstrap", "--listen", f"/ip4/{bed.addr('boot')}/tcp/0",
                                    "--data-dir", str(base / "bootstrap"), "--swarm-id", SWARM),
                       stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    line = p.stdout.readline().decode().strip()
    assert "/p2p/12D3KooW" in line, line
    return p, line


def _join(bed: WanBed, base: Path, name: str, boot: str, *args: str) -> subprocess.Popen:
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "node.log", "ab") as log:  # the child keeps its own copy
        return bed.run_in(name, _cli(
            "join", "--bootstrap", boot, "--listen", f"/ip4/{bed.addr(name)}/tcp/0",
            "--data-dir", str(d), "--swarm-id", SWARM, "--plain", "--device", "cpu",
            "--config", str(base / "node.toml"), "--report", str(d / "report.json"), *args),
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def _tail(base: Path, name: str, n: int = 30) -> str:
    try:
        lines = (base / name / "node.log").read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return f"--- {name}\n" + "\n".join(lines[-n:])


def test_nated_nodes_train_gossip_and_average_with_everyone(bed, tmp_path):
    (tmp_path / "node.toml").write_text(CONFIG)
    t0 = time.monotonic()
    boot_proc, boot = _bootstrap(bed, tmp_path)
    procs = {n: _join(bed, tmp_path, n, boot, "--rounds", str(ROUNDS)) for n in NAMES}
    try:
        for name, p in procs.items():
            rc = p.wait(timeout=300)
            assert rc == 0, _tail(tmp_path, name)
    finally:
        boot_proc.terminate()
        boot_proc.wait(timeout=30)
        boot_proc.stdout.close()
    reports = {n: json.loads((tmp_path / n / "report.json").read_text()) for n in NAMES}
    logs = "\n".join(_tail(tmp_path, n) for n in NAMES)
    print(f"4 nodes, {ROUNDS} rounds behind NAT at 80 ms RTT: {time.monotonic() - t0:.0f} s")

    for name, r in reports.items():
        rounds = r["rounds"]
        assert len(rounds) == ROUNDS, name
        # reachability as the node learned it: public hosts were dialled back, NATed ones not
        want = "relayed" if name in NATED else "public"
        assert rounds[-1]["reachability"] == want, (name, [x.get("reachability") for x in rounds])
    # every node received rollouts from each of the others that published in time for its
    # rounds (tests.rounds: rounds never wait for the network), through relays where NATed;
    # at least one node was still training when all three others had published
    due = due_senders(list(reports.values()), delivery_s=DELIVERY_S)
    for name, r in reports.items():
        lacking = due[r["peer_id"]] - senders(r)
        assert not lacking, (name, sorted(lacking), logs)
    assert any(len(d) == len(NAMES) - 1 for d in due.values()), due

    # an outer step with all four members and one state hash
    steps = [{o["step"]: o for o in r["outer_steps"] if o.get("status") == "ok"}
             for r in reports.values()]
    common = set.intersection(*(set(s) for s in steps))
    full = [k for k in sorted(common) if all(s[k]["peers"] == 4 for s in steps)]
    assert full, ([[(o["step"], o.get("status"), o.get("peers")) for o in r["outer_steps"]]
                   for r in reports.values()], logs)
    hashes = {s[full[-1]]["param_hash"] for s in steps}
    assert len(hashes) == 1, hashes
