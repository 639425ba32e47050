"""The outer-step bench's rate-limited link (bench/collectives_bench.py, root only): its
``--cc`` really sets the congestion control of TCP through the link, and the row says which."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from bench import collectives_bench as cb

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="the bench's link needs root, ip and tc")

CLIENT = "import socket,sys,time;c=socket.create_connection((sys.argv[1],int(sys.argv[2])));" \
         "time.sleep(30)"
"""Holds one connection to the bench's raw TCP server (``cb.RAW_SERVER``: prints its port)."""


def _connection_cc(ns: str) -> str:
    """The congestion control ``ss`` reports for the established connection in ``ns``."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tinH", "state", "established"],
                         capture_output=True, text=True, check=True).stdout.split()
    return next((w for w in out if w in ("cubic", "bbr", "reno")), "")


@pytest.fixture()
def prefix(monkeypatch):
    monkeypatch.setattr(cb, "PREFIX", f"tl{os.getpid() % 10000}")
    yield cb.PREFIX
    cb.netns_down(2)


@pytest.mark.parametrize("cc", ["cubic", "reno"])
def test_cc_is_the_congestion_control_of_tcp_through_the_link(prefix, cc):
    ns = cb.netns_up(2, cc)
    assert cb.congestion_control(ns) == cc
    server = subprocess.Popen(["ip", "netns", "exec", ns[1], sys.executable, "-c", cb.RAW_SERVER,
                               f"{cb.SUBNET}.2"], stdout=subprocess.PIPE, text=True)
    procs = [server]
    try:
        port = server.stdout.readline().strip()  # printed once it listens
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns[0], sys.executable, "-c",
                                       CLIENT, f"{cb.SUBNET}.2", port]))
        seen = ""
        for _ in range(50):
            seen = _connection_cc(ns[0])
            if seen:
                break
            time.sleep(0.1)
        assert seen == cc
    finally:
        for p in procs:
            p.kill()
            p.wait()
        server.stdout.close()


def test_without_cc_the_row_reports_the_hosts_default(prefix):
    ns = cb.netns_up(2)
    host = subprocess.run(["sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert cb.congestion_control(ns) == host != ""
