"""The WAN bed on this machine: RTT, upload limit, NAT and cleanup (root only)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from bench.wan import WanBed, ensure_iptables, hosts, instances, missing, stale

RTT_MS = 60.0
RATE_MBIT = 8.0

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing()), reason="WAN bed needs: " + "; ".join(missing()))]


def probe(bed: WanBed, host: str, *args: object) -> dict:
    out = bed.run(host, [sys.executable, "-m", "bench.wan.probe", *map(str, args)],
                  capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def server(bed: WanBed, host: str) -> int:
    p = bed.run_in(host, [sys.executable, "-m", "bench.wan.probe", "serve", bed.addr(host)],
                   stdout=subprocess.PIPE, text=True)
    return int(p.stdout.readline())


@pytest.fixture(scope="module")
def bed():
    reason = ensure_iptables(timeout_s=60)  # Debian CI without iptables: install it once
    specs = hosts(["a", "b", "c"], rtt_ms=RTT_MS, rate_mbit=RATE_MBIT,
                  nat=[] if reason else ["c"])
    with WanBed(specs) as b:
        b.iptables_missing = reason
        yield b


def test_rtt_matches_the_configured_one(bed):
    port = server(bed, "b")
    rtts = probe(bed, "a", "rtt", bed.addr("b"), port, 8)["rtt_ms"]
    med = statistics.median(rtts)
    assert bed.rtt_ms("a", "b") == RTT_MS
    # the router never delivers early; scheduling on a loaded 2-core box adds a little, but
    # twice the delay (each direction counted twice) or none at all both fail
    assert RTT_MS * 0.97 <= med <= RTT_MS * 1.25 + 20, rtts


def test_upload_is_limited_by_tbf(bed):
    port = server(bed, "b")
    nbytes = int(RATE_MBIT * 1e6 / 8 * 1.2)  # ~1.2 s at the limit
    r = probe(bed, "a", "send", bed.addr("b"), port, nbytes)
    assert RATE_MBIT * 0.4 <= r["mbit_s"] <= RATE_MBIT * 1.1, r


def test_nat_allows_outbound_and_blocks_inbound(bed):
    if bed.iptables_missing:
        pytest.skip(bed.iptables_missing)
    port_a = server(bed, "a")
    out = probe(bed, "c", "dial", bed.addr("a"), port_a)
    assert out["ok"] and out["seen_as"].split(":")[0] == bed.public_addr("c") != bed.addr("c")
    port_c = server(bed, "c")
    for target in (bed.public_addr("c"), bed.addr("c")):
        r = probe(bed, "a", "dial", target, port_c)
        assert not r["ok"], (target, r)


def test_close_removes_everything_it_started():
    b = WanBed(hosts(2))
    b.up()
    p = b.run_in("h0", ["sleep", "600"])
    ns = b.ns("h0")
    assert b.tag in instances()
    b.close()
    assert p.poll() is not None
    assert b.tag not in instances()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns not in listed and f"swnw{b.tag}-" not in listed


def test_cli_up_status_down():
    tag = f"c{os.getpid() % 10**5}"
    cli = [sys.executable, "-m", "bench.wan"]
    up = subprocess.run([*cli, "up", "--tag", tag, "--hosts", "2", "--rtt-ms", "20"],
                        capture_output=True, text=True, timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout[:up.stdout.rindex("}") + 1])["h1"]["addr"] == "10.213.0.2"
        status = json.loads(subprocess.run([*cli, "status"], capture_output=True, text=True,
                                           check=True, timeout=60).stdout)
        assert status["beds"][tag]["router_alive"]  # it outlived the `up` command
    finally:
        subprocess.run([*cli, "down", "--tag", tag], capture_output=True, timeout=60)
    assert tag not in instances()


def test_a_bed_whose_owner_died_goes_stale_and_down_removes_it():
    owner = subprocess.Popen(["sleep", "600"])
    b = WanBed(hosts(2), owner_pid=owner.pid)
    b.up()
    try:
        assert b.tag not in stale()
        owner.kill()
        owner.wait()
        wait = time.monotonic() + 10
        while b.tag not in stale() and time.monotonic() < wait:  # the router polls each 1 s
            time.sleep(0.1)
        assert b.tag in stale()
    finally:
        b.close()
    assert b.tag not in instances()
