"""UPnP port mapping: ask the home router to forward the swarm and collective ports to us.

``PortMapper`` is the one component of a node that touches router mappings (p2pd runs with
``nat_port_map=False``, collectives.transport). ``NatManager`` (swarm.nat) runs it and asks for
the swarm port at start and the collective (p2pd) port once the learner announces it; with a
mapping in place the dial-back check (swarm.reachability) finds the node ``public``, and the
node announces the mapped addresses: peers then dial it directly, no relay, no tunnel.

What one ``run`` does:

1. **Discover** an Internet Gateway Device on the LAN (UPnP-IGD, via miniupnpc: SSDP, then the
   device's description) in a worker thread, for at most ``discover_timeout_s``. Nothing
   found, or anything below failing: one log line, no mapping, and the node carries on as it
   would without UPnP (relays, hole punching). Nothing waits on this but the first
   reachability check.
2. **Check what the router says.** Every value it returns is untrusted: the LAN address it
   saw us at must be a unicast IPv4 (the one we listen on, when we listen on one); its
   external address must be a *global* IPv4 (a private or carrier-grade one means another NAT
   in front of the router, where no mapping can help). An entry the router reports back must
   point at us, at the port we asked for.
3. **Map** each wanted port: the external port equal to the internal one if free, else up to
   ``ALTERNATES`` others; lease ``lease_s`` (a router that only grants permanent leases gets a
   permanent mapping, removed at exit like the others).
4. **Renew** every ``lease_s / 2`` by adding the entry again (which refreshes it) and re-read
   the external address; a failed renewal drops the mapping (logged) and it is tried again at
   the next renewal; every change calls ``on_change``.
5. **Remove** every mapping it holds when cancelled (the process stops cleanly), shielded and
   bounded by ``call_timeout_s`` per mapping.

The blocking router I/O sits behind the small ``Igd`` protocol (``MiniupnpcIgd`` is the real
one), so the logic here is tested with fake gateways (tests/swarm/test_upnp.py) and the real
thing against Debian's miniupnpd on the WAN bed (tests/wan/test_upnp.py). Imports neither
libp2p nor torch.
"""

from __future__ import annotations

import ipaddress
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

import multiaddr
import trio

from swarm.config import GossipConfig

__all__ = ["ALTERNATES", "CALL_TIMEOUT_S", "DISCOVER_TIMEOUT_S", "Igd", "Mapping", "MiniupnpcIgd",
           "PortMapper", "UpnpError", "check_external_ip", "check_lan_addr", "collective_port",
           "port_mapper"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DISCOVER_TIMEOUT_S = 2.0
"""Longest wait for a router on the LAN: SSDP (``SSDP_WAIT_MS``) and its description. Where
none answers, miniupnpc goes on searching for other device types (8 s at a 2 s wait, measured
on the WAN bed); its thread is left to finish alone."""
SSDP_WAIT_MS = 1000
"""How long miniupnpc collects SSDP answers (it waits all of it: 1.05 s with miniupnpd on the
WAN bed); routers answer an M-SEARCH with MX = 1 within a second."""
CALL_TIMEOUT_S = 5.0
"""Longest wait for one request to the router (add, read back, delete)."""
ALTERNATES = 3
"""External ports tried besides the internal one when the router has that one taken."""
ALTERNATE_RANGE = (20000, 60000)
PROTO = "TCP"
MAX_TEXT = 64
"""Longest address text taken from the router."""


class UpnpError(Exception):
    """The router is absent, refused, timed out or answered something we do not trust. Never
    leaves ``PortMapper.run``: it is logged and the node goes on without that mapping."""


class Igd(Protocol):
    """The blocking calls ``PortMapper`` makes on a gateway (run in worker threads). Each
    raises on failure; the message names the router's error (e.g. ConflictInMappingEntry)."""

    def discover(self, timeout_ms: int) -> str:
        """Find and select a gateway; returns its LAN address for us (raises if none)."""
        ...

    def external_ip(self) -> str: ...

    def add(self, external_port: int, internal_client: str, internal_port: int,
            description: str, lease_s: int) -> None: ...

    def get(self, external_port: int) -> tuple[str, int, bool, int] | None:
        """(internal client, internal port, enabled, lease left in s; 0: permanent) or None."""
        ...

    def delete(self, external_port: int) -> None: ...


class MiniupnpcIgd:
    """``Igd`` over miniupnpc 2.3.3 (a py-libp2p dependency; libp2p.discovery.upnp wraps it
    too, with permanent leases and the external port always equal to the internal one)."""

    def __init__(self, *, multicast_if: str | None = None) -> None:
        import miniupnpc

        self._u = miniupnpc.UPnP(multicastif=multicast_if)

    def discover(self, timeout_ms: int) -> str:
        self._u.discoverdelay = timeout_ms
        try:
            found = self._u.discover()
        except Exception as e:  # miniupnpc raises a bare Exception with upnp's message
            if str(e) != "Success":  # a quirk of some builds: success raised as an error
                raise
            found = 1
        if not found:
            raise UpnpError("no UPnP device answered")
        self._u.selectigd()  # raises "No UPnP device discovered" when none is a gateway
        return str(self._u.lanaddr)

    def external_ip(self) -> str:
        return str(self._u.externalipaddress())

    def add(self, external_port: int, internal_client: str, internal_port: int,
            description: str, lease_s: int) -> None:
        self._u.addportmapping(external_port, PROTO, internal_client, internal_port,
                               description, "", lease_s)

    def get(self, external_port: int) -> tuple[str, int, bool, int] | None:
        entry = self._u.getspecificportmapping(external_port, PROTO)
        if entry is None:
            return None
        client, port, _desc, enabled, lease = entry
        return client, port, bool(enabled), lease

    def delete(self, external_port: int) -> None:
        self._u.deleteportmapping(external_port, PROTO)


@dataclass(frozen=True)
class Mapping:
    """One port the router forwards to us."""

    name: str
    """What it is for: ``swarm`` or ``collective``."""
    internal_port: int
    external_port: int
    external_ip: str
    """The router's external address (checked: a global IPv4)."""
    lease_s: int
    """What we asked for; 0: the router only grants permanent mappings."""


def check_external_ip(text: object) -> str:
    """The router's external address, normalized; UpnpError unless a global unicast IPv4."""
    ip = _ipv4(text, "external address")
    if not ip.is_global or ip.is_multicast:
        raise UpnpError(f"the router's external address {ip} is not a public one: another NAT "
                        "in front of it (carrier-grade NAT, a second router), where a port "
                        "mapping cannot help")
    return str(ip)


def check_lan_addr(text: object, bind_ip: str | None) -> str:
    """Our address as the router sees it, normalized; UpnpError unless a unicast IPv4 that is
    ``bind_ip`` when we listen on one address only."""
    ip = _ipv4(text, "LAN address")
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_link_local or \
            ip == ipaddress.IPv4Address("255.255.255.255"):
        raise UpnpError(f"the router sees us at {ip}, which is no LAN address")
    if bind_ip is not None and str(ip) != bind_ip:
        raise UpnpError(f"the router sees us at {ip} but we listen on {bind_ip} only")
    return str(ip)


def _ipv4(text: object, what: str) -> ipaddress.IPv4Address:
    if not isinstance(text, str) or not 0 < len(text) <= MAX_TEXT:
        raise UpnpError(f"the router gave no usable {what} ({str(text)[:MAX_TEXT]!r})")
    try:
        return ipaddress.IPv4Address(text.strip())
    except ValueError:
        raise UpnpError(f"the router's {what} {text[:MAX_TEXT]!r} is no IPv4 address") from None


def _port(value: int, what: str) -> int:
    if type(value) is not int or not 1 <= value <= 65535:
        raise ValueError(f"{what}: {value!r} must be a TCP port (1..65535)")
    return value


class PortMapper:
    """Holds the router's mappings for this node (see the module docstring); run ``run`` in a
    nursery, ask for ports with ``want``. ``settled`` is set once discovery and the mappings
    asked for before it are done (or failed)."""

    def __init__(self, *, lease_s: float, bind_ip: str | None = None,
                 igd: Callable[[], Igd] | None = None,
                 discover_timeout_s: float = DISCOVER_TIMEOUT_S,
                 call_timeout_s: float = CALL_TIMEOUT_S,
                 on_change: Callable[[], None] = lambda: None,
                 run_sync: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None) -> None:
        """lease_s: lease asked for each mapping (renewed at half of it). bind_ip: the one
        address we listen on, None for a wildcard. igd: makes the gateway client (default
        miniupnpc's, multicasting from ``bind_ip``). on_change: called when a mapping or the
        external address changed. run_sync: how a blocking gateway call runs (default: in a
        worker thread, abandoned at its timeout)."""
        if not lease_s >= 10:
            raise ValueError(f"lease_s: {lease_s} must be >= 10")
        if not discover_timeout_s > 0 or not call_timeout_s > 0:
            raise ValueError(f"discover_timeout_s: {discover_timeout_s} and call_timeout_s: "
                             f"{call_timeout_s} must be > 0")
        self.lease_s = int(lease_s)
        self.bind_ip = bind_ip
        self._make = igd or partial(MiniupnpcIgd, multicast_if=bind_ip)
        self.discover_timeout_s = discover_timeout_s
        self.call_timeout_s = call_timeout_s
        self.on_change = on_change
        self._run_sync = run_sync or _in_thread
        self.settled = trio.Event()
        self.mappings: dict[str, Mapping] = {}
        self.wanted: dict[str, int] = {}
        self.lan_addr = ""
        self.renewed = 0
        self.failed = 0
        self._igd: Igd | None = None
        self._wake = trio.Event()
        self._logged: set[str] = set()

    # -- what NatManager reads and asks --------------------------------------------------
    def want(self, name: str, port: int) -> None:
        """Map ``port`` (internal) as ``name``; replaces that name's earlier port."""
        _port(port, "port")
        if self.wanted.get(name) != port:
            self.wanted[name] = port
            self._wake.set()

    def get(self, name: str) -> Mapping | None:
        return self.mappings.get(name)

    def stats(self) -> dict[str, int]:
        return {"upnp_ports": len(self.mappings), "upnp_renewed": self.renewed,
                "upnp_failed": self.failed}

    # -- the task --------------------------------------------------------------------------
    async def run(self) -> None:
        """Discover, map, renew until cancelled; then remove our mappings."""
        try:
            try:
                self._igd = await self._discover()
            except UpnpError as e:
                self._log_once("discover", logging.INFO, "UPnP: no port mapping (%s); peers "
                               "reach this node as they would without UPnP ([gossip.relay] "
                               "upnp = false stops asking)", e)
                return
            finally:
                if self._igd is None:
                    self.settled.set()
            self._wake = trio.Event()  # what was wanted so far is mapped now
            await self._reconcile()
            self.settled.set()
            renew_at = trio.current_time() + self.lease_s / 2
            while True:
                with trio.move_on_at(renew_at):
                    await self._wake.wait()
                self._wake = trio.Event()  # a want() from here on wakes the next wait
                if trio.current_time() >= renew_at:
                    await self._renew()
                    renew_at = trio.current_time() + self.lease_s / 2
                await self._reconcile()  # new ports at once, failed ones at each renewal
        finally:
            with trio.CancelScope(shield=True):
                await self._remove_all()

    async def _discover(self) -> Igd:
        try:
            igd = self._make()
        except Exception as e:  # noqa: BLE001 - miniupnpc missing or refusing its options
            raise UpnpError(f"no UPnP client ({_text(e)})") from None
        wait_ms = min(SSDP_WAIT_MS, int(self.discover_timeout_s * 500))
        with trio.move_on_after(self.discover_timeout_s) as timer:
            try:
                lan = await self._run_sync(partial(igd.discover, wait_ms))
            except UpnpError:
                raise
            except Exception as e:  # noqa: BLE001 - miniupnpc's errors are bare Exceptions
                raise UpnpError(f"no gateway on the LAN answered ({_text(e)})") from None
        if timer.cancelled_caught:
            raise UpnpError(f"no gateway on the LAN answered within "
                            f"{self.discover_timeout_s:g} s")
        self.lan_addr = check_lan_addr(lan, self.bind_ip)
        check_external_ip(await self._call(igd, "external_ip"))
        return igd

    async def _call(self, igd: Igd, method: str, *args: Any) -> Any:
        """One blocking router call in a thread, under ``call_timeout_s`` (a router that
        hangs is left to its thread); its failures become UpnpError."""
        with trio.move_on_after(self.call_timeout_s) as timer:
            try:
                return await self._run_sync(partial(getattr(igd, method), *args))
            except UpnpError:
                raise
            except Exception as e:  # noqa: BLE001 - bare Exceptions from miniupnpc
                raise UpnpError(f"{method}: {_text(e)}") from None
        assert timer.cancelled_caught
        raise UpnpError(f"{method}: the router did not answer within {self.call_timeout_s:g} s")

    # -- mapping ---------------------------------------------------------------------------
    async def _reconcile(self) -> None:
        """Map every wanted port we do not hold (a port asked anew replaces the old one)."""
        assert self._igd is not None
        for name, port in list(self.wanted.items()):
            held = self.mappings.get(name)
            if held is not None and held.internal_port == port:
                continue
            if held is not None:
                await self._remove(held)
            try:
                mapping = await self._map(self._igd, name, port)
            except UpnpError as e:
                self.failed += 1
                self._log_once(f"map {name} {e}", logging.WARNING,
                               "UPnP: the router did not forward the %s port %d: %s (retried "
                               "every %d s; peers reach this node as without UPnP)", name, port,
                               e, self.lease_s // 2)
                continue
            self.mappings[name] = mapping
            logger.info("UPnP: the router forwards TCP %s:%d to %s:%d (%s port, %s)",
                        mapping.external_ip, mapping.external_port, self.lan_addr, port, name,
                        f"lease {mapping.lease_s} s, renewed every {self.lease_s // 2} s"
                        if mapping.lease_s else "a permanent mapping, removed when we stop")
            self.on_change()

    async def _map(self, igd: Igd, name: str, port: int) -> Mapping:
        external_ip = check_external_ip(await self._call(igd, "external_ip"))
        taken = {m.external_port for m in self.mappings.values()}
        candidates = [port, *random.sample(range(*ALTERNATE_RANGE), ALTERNATES)]
        last: UpnpError | None = None
        for external in candidates:
            if external in taken:
                continue
            try:
                lease = await self._add(igd, name, external, port)
            except UpnpError as e:
                if "Conflict" not in str(e):  # ConflictInMappingEntry (718): try another port
                    raise
                last = e
                continue
            return Mapping(name=name, internal_port=port, external_port=external,
                           external_ip=external_ip, lease_s=lease)
        raise last or UpnpError("every external port tried was taken")

    async def _add(self, igd: Igd, name: str, external: int, port: int) -> int:
        """Add (or refresh) one entry and read it back; the lease granted (0: permanent)."""
        lease = self.lease_s
        try:
            await self._call(igd, "add", external, self.lan_addr, port, f"swarm-node {name}",
                             lease)
        except UpnpError as e:
            if "OnlyPermanentLeasesSupported" not in str(e):  # 725: IGDv1 routers
                raise
            lease = 0
            await self._call(igd, "add", external, self.lan_addr, port, f"swarm-node {name}", 0)
        self._check_entry(await self._call(igd, "get", external), external, port)
        return lease

    def _check_entry(self, entry: object, external: int, port: int) -> None:
        """The router's record of our entry must forward ``external`` to us at ``port``."""
        if not (isinstance(entry, tuple) and len(entry) == 4):
            raise UpnpError(f"the router keeps no entry for external port {external} after "
                            f"adding it ({str(entry)[:MAX_TEXT]!r})")
        client, internal, enabled, lease = entry
        if not isinstance(client, str) or client.strip() != self.lan_addr or internal != port \
                or enabled is not True or type(lease) is not int or lease < 0:
            raise UpnpError(f"the router's entry for external port {external} is "
                            f"{str(entry)[:2 * MAX_TEXT]!r}, not {self.lan_addr}:{port}")

    async def _renew(self) -> None:
        """Refresh every mapping; one the router no longer takes is dropped (and re-asked for
        at the next round); a changed external address updates them all."""
        assert self._igd is not None
        changed = False
        for name, mapping in list(self.mappings.items()):
            try:
                ip = check_external_ip(await self._call(self._igd, "external_ip"))
                if mapping.lease_s:
                    await self._add(self._igd, name, mapping.external_port,
                                    mapping.internal_port)
                else:  # permanent: only check that it is still there
                    self._check_entry(await self._call(self._igd, "get",
                                                       mapping.external_port),
                                      mapping.external_port, mapping.internal_port)
            except UpnpError as e:
                self.failed += 1
                del self.mappings[name]
                changed = True
                logger.warning("UPnP: lost the mapping of the %s port (%s:%d): %s; peers "
                               "reach this node as without UPnP until the router takes it "
                               "again", name, mapping.external_ip, mapping.external_port, e)
                continue
            self.renewed += 1
            if ip != mapping.external_ip:
                logger.info("UPnP: the router's external address changed from %s to %s",
                            mapping.external_ip, ip)
                self.mappings[name] = Mapping(name=name, internal_port=mapping.internal_port,
                                              external_port=mapping.external_port,
                                              external_ip=ip, lease_s=mapping.lease_s)
                changed = True
        if changed:
            self.on_change()

    # -- removal ---------------------------------------------------------------------------
    async def _remove_all(self) -> None:
        for mapping in list(self.mappings.values()):
            await self._remove(mapping)

    async def _remove(self, mapping: Mapping) -> None:
        self.mappings.pop(mapping.name, None)
        if self._igd is None:
            return
        try:
            await self._call(self._igd, "delete", mapping.external_port)
        except UpnpError as e:
            logger.warning("UPnP: could not remove the mapping of %s:%d (%s): it lapses %s",
                           mapping.external_ip, mapping.external_port, e,
                           f"within {mapping.lease_s} s" if mapping.lease_s
                           else "only when the router forgets it")
            return
        logger.info("UPnP: removed the mapping of %s:%d (%s port)", mapping.external_ip,
                    mapping.external_port, mapping.name)

    def _log_once(self, key: str, level: int, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.log(level, msg, *args)


async def _in_thread(fn: Callable[[], T]) -> T:
    """A blocking call in a worker thread; when cancelled (timed out) the thread is left to
    finish alone, its result dropped."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def _text(e: BaseException) -> str:
    return (str(e) or type(e).__name__)[:2 * MAX_TEXT]


def collective_port(addrs: tuple[str, ...] | list[str]) -> int | None:
    """The TCP port of the first non-loopback, direct ip4 address among collective addrs."""
    for text in addrs:
        if "/p2p-circuit" in text:
            continue
        try:
            m = multiaddr.Multiaddr(text)
            ip, port = m.value_for_protocol("ip4"), int(m.value_for_protocol("tcp"))
        except Exception:  # noqa: BLE001 - not ip4/tcp
            continue
        if not ip.startswith("127.") and 0 < port < 65536:
            return port
    return None


def port_mapper(config: GossipConfig, *, on_change: Callable[[], None]) -> PortMapper | None:
    """A PortMapper unless UPnP is off, ``announce`` says how peers reach us already, or we
    listen on loopback only (nobody on the LAN could reach a mapping's target)."""
    if not config.relay.upnp or config.announce:
        return None
    ips = set()
    for text in config.listen:
        try:
            ips.add(multiaddr.Multiaddr(text).value_for_protocol("ip4"))
        except Exception:  # noqa: BLE001 - not ip4 (UPnP-IGD maps IPv4 only)
            continue
    if not ips or all(ip.startswith("127.") for ip in ips):
        return None
    bind_ip = ips.pop() if len(ips) == 1 and "0.0.0.0" not in ips else None
    return PortMapper(lease_s=config.relay.upnp_lease_s, bind_ip=bind_ip, on_change=on_change)
