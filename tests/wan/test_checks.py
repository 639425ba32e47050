"""What the bed reports as missing (runs anywhere, root or not)."""

from __future__ import annotations

import pytest

from bench.wan import BedUnavailable, HostSpec, WanBed, hosts, missing


def test_missing_tools_are_named_with_their_fix(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda tool: None if tool == "iptables" else "/x")
    miss = missing(nat=True)
    assert any("apt-get install iptables" in m for m in miss)
    assert not any("iptables" in m for m in missing(nat=False))
    with pytest.raises(BedUnavailable, match="apt-get install iptables"):
        WanBed(hosts(2, nat=["h1"])).up()


def test_specs_are_checked_early():
    with pytest.raises(ValueError, match="name"):
        HostSpec(name="Bad-Name")
    with pytest.raises(ValueError, match="jitter_ms"):
        hosts(2, rtt_ms=0, jitter_ms=10)
    with pytest.raises(ValueError, match="nat"):
        hosts(["a", "b"], nat=["c"])
    with pytest.raises(ValueError, match="specs"):
        WanBed(hosts(["a", "a"]))
