"""swarm.upnp without a router: PortMapper against fake gateways (leases, renewal, conflicts,
permanent-only routers, untrusted answers, a silent or hanging router, removal at exit), and
when a node tries UPnP at all. The real thing, against Debian's miniupnpd in a gateway
namespace, is tests/wan/test_upnp.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from swarm.config import GossipConfig, RelayConfig
from swarm.upnp import (
    ALTERNATE_RANGE,
    CALL_TIMEOUT_S,
    Mapping,
    PortMapper,
    UpnpError,
    check_external_ip,
    check_lan_addr,
    collective_port,
    port_mapper,
)

LAN, WAN = "192.168.1.20", "203.0.113.7"
PUBLIC_WAN = "11.213.0.2"  # 203.0.113/24 is documentation space: not global for ipaddress


class FakeIgd:
    """A router's port-mapping table; ``fail`` maps a method name to the error it raises
    (a callable: raised only when it returns one), ``hang`` names methods that never answer."""

    def __init__(self, *, lan: object = LAN, external: object = PUBLIC_WAN,
                 taken: dict[int, str] | None = None, permanent_only: bool = False) -> None:
        self.lan, self.external = lan, external
        self.table: dict[int, tuple[str, int, bool, int]] = {
            port: (client, port, True, 0) for port, client in (taken or {}).items()}
        self.permanent_only = permanent_only
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, Callable[[tuple[Any, ...]], Exception | None]] = {}
        self.hang: set[str] = set()
        self.entry_override: Callable[[int], object] | None = None

    def _enter(self, *call: Any) -> None:
        self.calls.append(call)
        rule = self.fail.get(call[0])
        error = rule(call) if rule else None
        if error is not None:
            raise error

    def discover(self, timeout_ms: int) -> object:
        self._enter("discover", timeout_ms)
        return self.lan

    def external_ip(self) -> object:
        self._enter("external_ip")
        return self.external

    def add(self, external_port: int, client: str, port: int, desc: str, lease_s: int) -> None:
        self._enter("add", external_port, client, port, desc, lease_s)
        if self.permanent_only and lease_s:
            raise Exception("OnlyPermanentLeasesSupported")
        held = self.table.get(external_port)
        if held is not None and held[0] != client:
            raise Exception("ConflictInMappingEntry")
        self.table[external_port] = (client, port, True, lease_s)

    def get(self, external_port: int) -> object:
        self._enter("get", external_port)
        if self.entry_override is not None:
            return self.entry_override(external_port)
        return self.table.get(external_port)

    def delete(self, external_port: int) -> None:
        self._enter("delete", external_port)
        self.table.pop(external_port, None)

    def adds(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "add"]


def _runner(igd: FakeIgd):
    """run_sync for the fake: inline, or forever for a method in ``igd.hang``."""
    async def run_sync(fn: Any) -> Any:
        if getattr(fn.func, "__name__", "") in igd.hang:
            await trio.sleep_forever()
        return fn()
    return run_sync


def _mapper(igd: FakeIgd, **kw: Any) -> PortMapper:
    kw.setdefault("lease_s", 60)
    return PortMapper(igd=lambda: igd, run_sync=_runner(igd), **kw)


def _run(body: Callable[[PortMapper, FakeIgd, trio.testing.MockClock], Any], igd: FakeIgd,
         **kw: Any) -> PortMapper:
    """Run a mapper on a mock clock (sleeps jump), ``body`` beside it, then cancel it."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    mapper = _mapper(igd, **kw)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mapper.run)
            await body(mapper, igd, clock)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    return mapper


def test_maps_both_ports_with_a_lease_renews_at_half_and_removes_them_at_exit():
    changes: list[int] = []

    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        assert mapper.get("swarm") == Mapping(name="swarm", internal_port=4001,
                                              external_port=4001, external_ip=PUBLIC_WAN,
                                              lease_s=60)
        assert igd.table[4001] == (LAN, 4001, True, 60)
        mapper.want("collective", 4002)  # the learner announced its p2pd later
        await trio.sleep(0.1)
        assert igd.table[4002] == (LAN, 4002, True, 60)
        assert mapper.stats() == {"upnp_ports": 2, "upnp_renewed": 0, "upnp_failed": 0}
        assert len(changes) == 2
        adds = len(igd.adds())
        await trio.sleep(29)  # renewals are due at half the lease, from the first mapping
        assert len(igd.adds()) == adds
        await trio.sleep(2)
        assert len(igd.adds()) == adds + 2 and mapper.renewed == 2
        await trio.sleep(30)
        assert mapper.renewed == 4 and set(igd.table) == {4001, 4002}
        assert len(changes) == 2  # renewing changed nothing

    igd = FakeIgd()
    mapper = _run(body, igd, on_change=lambda: changes.append(1))
    assert igd.calls[0] == ("discover", 1000)  # SSDP answers collected for 1 s
    assert igd.table == {} and mapper.mappings == {}
    assert [c[1] for c in igd.calls if c[0] == "delete"] == [4001, 4002]


def test_a_taken_external_port_gets_another_one_that_points_at_us():
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        m = mapper.get("swarm")
        assert m is not None and m.external_port != 4001
        assert ALTERNATE_RANGE[0] <= m.external_port < ALTERNATE_RANGE[1]
        assert igd.table[m.external_port] == (LAN, 4001, True, 60)
        assert igd.table[4001][0] == "192.168.1.99"  # the other machine's entry untouched

    igd = FakeIgd(taken={4001: "192.168.1.99"})
    _run(body, igd)
    assert set(igd.table) == {4001}


def test_a_permanent_only_router_gets_a_permanent_mapping_checked_not_re_added():
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        assert mapper.get("swarm").lease_s == 0 and igd.table[4001][3] == 0
        adds = len(igd.adds())
        await trio.sleep(31)
        assert len(igd.adds()) == adds and mapper.renewed == 1
        assert mapper.get("swarm") is not None

    igd = FakeIgd(permanent_only=True)
    _run(body, igd)
    assert igd.table == {}  # removed at exit all the same


@pytest.mark.parametrize("external", [
    "10.0.0.1", "100.64.3.4", "192.168.0.1", "0.0.0.0", "127.0.0.1", "224.0.0.1", "",
    "not an address", "1.2.3.4 ; rm -rf", "::1", "2001:db8::1", 5, None, "1" * 200])
def test_an_external_address_that_is_not_a_public_ipv4_means_no_mapping(external, caplog):
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        await trio.sleep(100)

    igd = FakeIgd(external=external)
    with caplog.at_level(logging.INFO, logger="swarm.upnp"):
        mapper = _run(body, igd)
    assert mapper.mappings == {} and igd.adds() == []
    assert caplog.text.count("UPnP: no port mapping") == 1


@pytest.mark.parametrize("lan, bind_ip", [
    ("127.0.0.1", None), ("0.0.0.0", None), ("169.254.1.2", None), ("239.255.255.250", None),
    ("192.168.1.20", "192.168.1.30"), ("fe80::1", None), ("", None), (b"192.168.1.20", None)])
def test_a_lan_address_that_cannot_be_ours_means_no_mapping(lan, bind_ip):
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()

    igd = FakeIgd(lan=lan)
    mapper = _run(body, igd, bind_ip=bind_ip)
    assert mapper.mappings == {} and igd.adds() == []


@pytest.mark.parametrize("entry", [
    None, ("192.168.1.21", 4001, True, 60), (LAN, 4002, True, 60), (LAN, 4001, False, 60),
    (LAN, 4001, True, -1), (LAN, 4001, True, "60"), ("x" * 500, 4001, True, 60), (LAN, 4001)])
def test_an_entry_the_router_reports_back_must_forward_to_us(entry, caplog):
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        await trio.sleep(95)  # retried at each renewal (every 30 s), logged once

    igd = FakeIgd()
    igd.entry_override = lambda port: entry
    with caplog.at_level(logging.INFO, logger="swarm.upnp"):
        mapper = _run(body, igd)
    assert mapper.mappings == {} and mapper.failed == 4
    assert caplog.text.count("did not forward the swarm port") == 1


def test_no_router_on_the_lan_settles_within_the_bound_and_logs_once(caplog):
    took: list[float] = []

    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        start = trio.current_time()
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        took.append(trio.current_time() - start)

    igd = FakeIgd()
    igd.hang = {"discover"}  # SSDP: nobody answers
    with caplog.at_level(logging.INFO, logger="swarm.upnp"):
        mapper = _run(body, igd, discover_timeout_s=2.0)
    assert mapper.mappings == {} and igd.adds() == [] and took == [pytest.approx(2.0)]
    assert caplog.text.count("UPnP: no port mapping (no gateway on the LAN answered within 2 s)") == 1

    igd = FakeIgd()
    igd.fail["discover"] = lambda call: Exception("No UPnP device discovered")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="swarm.upnp"):
        _run(body, igd)
    assert "no gateway on the LAN answered (No UPnP device discovered)" in caplog.text
    assert took[1] == 0


def test_a_router_that_hangs_on_a_request_costs_one_call_timeout():
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        start = trio.current_time()
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        assert trio.current_time() - start == pytest.approx(CALL_TIMEOUT_S)

    igd = FakeIgd()
    igd.hang = {"add"}
    mapper = _run(body, igd)
    assert mapper.mappings == {} and mapper.failed == 1


def test_a_lost_mapping_is_dropped_then_taken_again_and_an_address_change_is_followed(caplog):
    changes: list[int] = []

    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        igd.table.clear()  # the router rebooted and now refuses for a while
        igd.fail["add"] = lambda call: Exception("ActionFailed")
        await trio.sleep(31)
        assert mapper.get("swarm") is None and mapper.failed >= 1 and len(changes) == 2
        del igd.fail["add"]
        igd.external = "11.213.0.9"  # and came back with another address
        await trio.sleep(30)
        m = mapper.get("swarm")
        assert m is not None and m.external_ip == "11.213.0.9" and len(changes) == 3
        igd.external = "11.213.0.10"
        await trio.sleep(30)
        assert mapper.get("swarm").external_ip == "11.213.0.10" and len(changes) == 4

    with caplog.at_level(logging.INFO, logger="swarm.upnp"):
        _run(body, FakeIgd(), on_change=lambda: changes.append(1))
    assert caplog.text.count("lost the mapping of the swarm port") == 1
    assert "external address changed from 11.213.0.9 to 11.213.0.10" in caplog.text


def test_a_new_port_for_a_name_replaces_its_mapping():
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("collective", 4002)
        await mapper.settled.wait()
        mapper.want("collective", 4102)  # p2pd restarted elsewhere
        await trio.sleep(0.1)
        assert set(igd.table) == {4102} and mapper.get("collective").internal_port == 4102

    _run(body, FakeIgd())


def test_removal_at_exit_that_fails_is_logged_and_does_not_raise(caplog):
    async def body(mapper: PortMapper, igd: FakeIgd, clock: Any) -> None:
        mapper.want("swarm", 4001)
        await mapper.settled.wait()
        igd.hang = {"delete"}

    igd = FakeIgd()
    with caplog.at_level(logging.INFO, logger="swarm.upnp"):
        _run(body, igd)
    assert "could not remove the mapping of 11.213.0.2:4001" in caplog.text
    assert "lapses within 60 s" in caplog.text


def test_checks_of_router_addresses():
    assert check_external_ip(" 11.213.0.2 ") == "11.213.0.2"
    assert check_lan_addr("10.0.0.5", None) == "10.0.0.5"
    assert check_lan_addr("10.0.0.5", "10.0.0.5") == "10.0.0.5"
    with pytest.raises(UpnpError, match="another NAT"):
        check_external_ip("100.64.0.1")
    with pytest.raises(UpnpError, match="no IPv4 address"):
        check_external_ip("example.org")
    with pytest.raises(ValueError, match="lease_s"):
        PortMapper(lease_s=5)
    with pytest.raises(ValueError, match="port"):
        PortMapper(lease_s=60).want("swarm", 0)


def test_which_nodes_try_upnp_and_the_collective_port_they_map():
    def mapper(**kw: Any) -> PortMapper | None:
        return port_mapper(GossipConfig(data_dir="/d", **kw), on_change=lambda: None)

    assert mapper() is not None and mapper().bind_ip is None  # 0.0.0.0:4001, the default
    assert mapper(listen=("/ip4/192.168.1.20/tcp/4001",)).bind_ip == "192.168.1.20"
    assert mapper(listen=("/ip4/127.0.0.1/tcp/0",)) is None  # the test swarms: no SSDP
    assert mapper(announce=("/ip4/11.213.0.2/tcp/4001",)) is None  # forwarded by hand
    assert mapper(relay=RelayConfig(upnp=False)) is None
    assert mapper(relay=RelayConfig(upnp_lease_s=120)).lease_s == 120
    assert collective_port(["/ip4/127.0.0.1/tcp/4002/p2p/Qm", "/ip4/192.168.1.20/tcp/4002"]) \
        == 4002
    assert collective_port(["/ip4/127.0.0.1/tcp/4002", "/ip6/::1/tcp/4002",
                            "/ip4/1.2.3.4/tcp/1/p2p/R/p2p-circuit/p2p/T", "junk"]) is None
    with pytest.raises(ValueError, match="upnp_lease_s"):
        RelayConfig(upnp_lease_s=5)
    with pytest.raises(ValueError, match="upnp"):
        RelayConfig(upnp="yes")  # type: ignore[arg-type]
