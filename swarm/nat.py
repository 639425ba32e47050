"""NatManager: learn whether peers can dial us, and when not, stay reachable through relays.

Loop (one task, ``run``): ask bootstrap peers (then others) to dial us back
(swarm.reachability); if they reached us, serve as a relay for others; if not, hold
reservations on up to ``relay.reservations`` relays (bootstrap peers first) and advertise
``p2p-circuit`` addresses instead of our private ones. Alongside, ``HolePuncher``
(swarm.holepunch) turns relayed connections into direct ones where both NATs allow it;
``stats()`` counts peers by link (``peers_direct``, ``peers_relayed``) and the punches.
Before the first check, ``PortMapper`` (swarm.upnp) asks the router on the LAN to forward
the swarm port (and the collective port once the learner announces it): where it does, the
dial-back reaches us at the mapped port, we are ``public`` and announce the mapped addresses
(the collective one too), so peers dial us directly; the first check waits for it at most
``UPNP_SETTLE_S``, and a mapping gained or lost triggers a check at once.
Every change of state or addresses is logged once with what it means and what to do, and
handed to ``on_addrs`` (the service re-announces). Re-checks every
``relay.reachability_interval_s``, and at once when a relay is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.abc import INetStream
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service

from swarm.config import GossipConfig
from swarm.holepunch import HolePuncher
from swarm.reachability import (
    REFUSED,
    DialBackServer,
    Reachability,
    Verdict,
    ask_dial_back,
    decide,
)
from swarm.relay import RelayHub
from swarm.upnp import CALL_TIMEOUT_S, DISCOVER_TIMEOUT_S, collective_port, port_mapper

__all__ = ["NatManager"]

logger = logging.getLogger(__name__)

MAX_ASKED = 4
"""Peers asked per check besides the bootstrap peers."""
PUNCH_DIAL_TIMEOUT_S = 5.0
"""Upper bound of one hole-punch dial (a round lasts 5 s in py-libp2p 0.8.1)."""
UPNP_SETTLE_S = DISCOVER_TIMEOUT_S + CALL_TIMEOUT_S
"""Longest the first reachability check waits for the UPnP mapping: without a router on the
LAN, discovery's bound (2 s); with one, until it mapped the swarm port or failed to."""


class NatManager:
    def __init__(self, *, host: IHost, config: GossipConfig, bootstrap: list[ID],
                 on_addrs: Callable[[list[str]], None]) -> None:
        self.host = host
        self.config = config
        self.bootstrap = bootstrap
        self.on_addrs = on_addrs
        self.state = Reachability()
        self.relay = RelayHub(host, config)
        self.server = DialBackServer(host, dial_timeout_s=config.peers.dial_timeout_s)
        self.direct_addrs: list[str] = []
        self.lost_relays = 0
        self._addrs: list[str] = []
        self.puncher = HolePuncher(
            host, dial_timeout_s=min(PUNCH_DIAL_TIMEOUT_S, config.peers.dial_timeout_s),
            idle_s=config.relay.hole_punch_idle_s) if config.relay.hole_punch else None
        self.mapper = port_mapper(config, on_change=self._mapping_changed)
        self._check_soon = False
        self._unmapped_logged = False
        self.want_collective(config.collective_addrs)

    def watch_tunnels(self, last_io: Callable[[INetStream], float | None]) -> None:
        """Keep a punched peer's relayed connection while its tunnels are busy (swarm.tunnel)."""
        if self.puncher is not None:
            self.puncher.last_io = last_io

    def stats(self) -> dict[str, int]:
        return {**self.state.stats(), **self.relay.serving(),
                "relay_reservations": len(self.relay.held()), "relay_lost": self.lost_relays,
                "dialback_served": self.server.served, "dialback_refused": self.server.refused,
                **(self.puncher.stats() if self.puncher is not None else {}),
                **(self.mapper.stats() if self.mapper is not None else {})}

    # -- UPnP ------------------------------------------------------------------------------
    def want_collective(self, collective_addrs: tuple[str, ...] | list[str]) -> None:
        """The learner announced its collective (p2pd) addresses: map that port too."""
        port = collective_port(collective_addrs)
        if self.mapper is not None and port is not None:
            self.mapper.want("collective", port)

    def collective_addrs(self, addrs: tuple[str, ...] | list[str]) -> list[str]:
        """The learner's collective addresses, behind the router's mapping of that port while
        peers can dial us (what to announce)."""
        mapping = self.mapper.get("collective") if self.mapper is not None else None
        if mapping is None or self.state.state != "public" or \
                mapping.internal_port != collective_port(addrs):
            return list(addrs)
        ip = self.state.observed_ip if "." in self.state.observed_ip else mapping.external_ip
        mapped = f"/ip4/{ip}/tcp/{mapping.external_port}/p2p/{self.host.get_id()}"
        return [mapped, *(a for a in addrs if a != mapped)]

    def _mapping_changed(self) -> None:
        self._check_soon = True  # the dial-back says whether the mapping works
        self.on_addrs(self._addrs)  # re-announced: the collective's mapped address too

    async def run(self, direct_addrs: list[str], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve dial-backs and the relay's STOP side; check reachability until cancelled."""
        self.direct_addrs = direct_addrs
        self._addrs = direct_addrs
        self.server.install()
        async with AsyncExitStack() as stack:
            if self.puncher is not None:
                await stack.enter_async_context(background_trio_service(self.puncher))
                await self.puncher.event_started.wait()
            nursery = await stack.enter_async_context(trio.open_nursery())
            await nursery.start(self.relay.run)
            if self.config.bootstrap_only:  # the operator publishes its address: a relay
                self.relay.enable_hop()
            if self.mapper is not None:
                nursery.start_soon(self.mapper.run)
                if self._listen_port():
                    self.mapper.want("swarm", self._listen_port())
            task_status.started()
            if self.mapper is not None:  # the first check finds a mapping in place
                with trio.move_on_after(UPNP_SETTLE_S):
                    await self.mapper.settled.wait()
            next_check = 0.0
            while True:
                now = trio.current_time()
                if now >= next_check or self._check_soon:
                    self._check_soon = False
                    await self.check()
                    decided = self.state.state != "unknown"
                    next_check = now + (self.config.relay.reachability_interval_s if decided
                                        else 4 * self.config.peers.maintain_interval_s)
                await self._keep_relays()
                await trio.sleep(self.config.peers.maintain_interval_s)

    # -- reachability ----------------------------------------------------------------------
    def _port(self) -> int:
        """The swarm port peers dial: the router's mapping of it, else ours."""
        mapping = self.mapper.get("swarm") if self.mapper is not None else None
        if mapping is not None:
            return mapping.external_port
        return self._listen_port()

    def _listen_port(self) -> int:
        for text in (*self.config.announce, *map(str, self.host.get_transport_addrs())):
            try:
                return int(multiaddr.Multiaddr(text).value_for_protocol("tcp"))
            except Exception:  # noqa: BLE001 - no tcp part
                continue
        return 0

    async def _ask(self, peers: list[ID]) -> list[Verdict]:
        out: list[Verdict] = []
        port = self._port()

        async def one(peer: ID) -> None:
            try:
                out.append(await ask_dial_back(self.host, peer, port,
                                               timeout_s=self.config.peers.dial_timeout_s + 5))
            except Exception as e:  # noqa: BLE001 - peer without the protocol, gone, slow
                logger.debug("dial-back request to %s failed: %s: %s", peer, type(e).__name__, e)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(one, peer)
        return out

    async def check(self) -> None:
        connected = set(self.host.get_connected_peers())
        boot = [p for p in self.bootstrap if p in connected]
        verdicts = await self._ask(boot)
        others: list[Verdict] = []
        if not any(v.status != REFUSED for v in verdicts):
            direct = [p for p in connected if p not in boot and not self._relayed(p)]
            others = await self._ask(direct[:MAX_ASKED])
        public = decide(verdicts, others)
        seen = [v.observed_ip for v in (*verdicts, *others) if v.observed_ip]
        observed = seen[0] if seen else self.state.observed_ip
        if public is None:
            if self.state.state == "unknown":
                self.state.reason = "no peer answered a dial-back request yet"
            return
        self.state.observed_ip = observed
        self.state.checked_at = time.time()
        mapping = self.mapper.get("swarm") if self.mapper is not None else None
        if public:
            self._set("public", f"peers dialled us back at {observed}:{self._port()}"
                      + (" (the router forwards it: UPnP)" if mapping is not None else ""))
            self.relay.enable_hop()
            self._publish(self._with_observed(observed))
        else:
            if mapping is not None and not self._unmapped_logged:
                self._unmapped_logged = True
                logger.warning("UPnP: the router forwards %s:%d to us, yet no peer could dial "
                               "%s:%d: another NAT or a firewall in front of the router",
                               mapping.external_ip, mapping.external_port, observed,
                               mapping.external_port)
            await self._keep_relays(force=True)

    def _relayed(self, peer: ID) -> bool:
        return any("p2p-circuit" in str(a) for c in self.host.get_network().get_connections(peer)
                   for a in c.get_transport_addresses())

    def _with_observed(self, ip: str) -> list[str]:
        """Our direct addresses plus the one peers reached us at (a port-forwarded NAT)."""
        if not ip or self.config.announce or any(f"/{ip}/" in a for a in self.direct_addrs):
            return self.direct_addrs
        proto = "ip6" if ":" in ip else "ip4"
        return [f"/{proto}/{ip}/tcp/{self._port()}/p2p/{self.host.get_id()}", *self.direct_addrs]

    # -- relays ----------------------------------------------------------------------------
    async def _keep_relays(self, *, force: bool = False) -> None:
        if self.state.state == "public" or (self.state.state == "unknown" and not force):
            return
        for relay in self.relay.prune():
            self.lost_relays += 1
            logger.warning("lost the relay %s (disconnected or reservation expired): peers "
                           "that reached us through it lose us until we reserve elsewhere",
                           relay)
        held = set(self.relay.held())
        for relay in list(held):
            if self.relay.needs_refresh(relay) and not await self.relay.reserve(relay):
                held.discard(relay)
                self.relay.reservations.pop(relay, None)
        connected = set(self.host.get_connected_peers())
        candidates = [p for p in self.bootstrap if p in connected and p not in held]
        candidates += [p for p in connected if p not in held and p not in candidates
                       and not self._relayed(p)][:MAX_ASKED]
        for relay in candidates:
            if len(held) >= self.config.relay.reservations:
                break
            if await self.relay.reserve(relay):
                held.add(relay)
                logger.info("reserved a relay slot on %s", relay)
        port = self._port()
        ip = self.state.observed_ip or "<your public IP>"
        if held:
            self._set("relayed", f"no peer could dial {ip}:{port}; reachable through "
                      f"{len(held)} relay(s)")
        else:
            self._set("unreachable", f"no peer could dial {ip}:{port} and no relay accepted a "
                      "reservation: peers cannot reach this node first. Forward TCP ports "
                      f"{port} and {port + 1} on your router to this machine and start with "
                      f"--announce /ip4/{ip}/tcp/{port}")
        self._publish(self.relay.circuit_addrs() or self.direct_addrs)

    def _set(self, state: str, reason: str) -> None:
        if (state, reason) != (self.state.state, self.state.reason):
            log = logger.warning if state == "unreachable" else logger.info
            log("reachability %s: %s", state, reason)
        self.state.state = state
        self.state.reason = reason

    def _publish(self, addrs: list[str]) -> None:
        if addrs != self._addrs:
            self._addrs = addrs
            self.on_addrs(addrs)
