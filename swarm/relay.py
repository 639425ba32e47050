"""Circuit relay v2 (py-libp2p 0.8.1 ``libp2p.relay.circuit_v2``): serve as a relay, hold
reservations on relays, dial peers through them.

What works in 0.8.1 and what we route around (measured on loopback and in tests/wan):
- the hop (relay) side, reservations and relayed streams work: a node behind NAT that holds a
  reservation on relay R is reachable at ``<R's addr>/p2p/<R>/p2p-circuit/p2p/<node>``;
- ``host.connect`` can never use such an address: ``Swarm.dial_peer`` drops every
  ``p2p-circuit`` address before choosing a transport ("All addresses ... are unusable
  (relay-only ...)"), even with the circuit transport registered. ``RelayHub.dial`` calls
  ``CircuitV2Transport.dial`` directly; the resulting connection is registered with the
  host like any other (pubsub sees it);
- relayed connections between two NATed peers are upgraded to direct ones where their NATs
  allow it (swarm.holepunch, DCUtR); the relay then carries only what could not be punched.

Limits of the relay we serve (``RelayLimits``): reservations, circuits, bytes and seconds per
circuit (``GossipConfig.relay``); beyond them the relay refuses or resets a circuit and the
peers' dialers try again later.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service

from swarm.config import GossipConfig

__all__ = ["RelayHub", "is_circuit"]

logger = logging.getLogger(__name__)

REFRESH_MARGIN_S = 60.0
"""Refresh a reservation this long before it expires."""


def is_circuit(addr: multiaddr.Multiaddr | str) -> bool:
    return "/p2p-circuit" in str(addr)


class _CountingRelay(CircuitV2Protocol):
    """The relay protocol, counting the bytes it relays (``relay_circuit_bytes``)."""

    circuit_bytes = 0

    async def _read_stream_with_retry(  # type: ignore[no-untyped-def]
            self, stream, max_retries=None):
        # py-libp2p 0.8.1 reads every relayed chunk (and nothing else) through this method
        data = await (super()._read_stream_with_retry(stream) if max_retries is None
                      else super()._read_stream_with_retry(stream, max_retries))
        if data:
            self.circuit_bytes += len(data)
        return data


@dataclass
class RelayHub:
    """The relay protocol of one host: hop service (once enabled), reservations, relay dials."""

    host: IHost
    config: GossipConfig
    reservations: dict[ID, float] = field(default_factory=dict)
    """Relay -> expiry (unix seconds) of our reservation there."""
    hop_enabled: bool = False

    def __post_init__(self) -> None:
        c = self.config.relay
        limits = RelayLimits(duration=int(c.circuit_s), data=c.circuit_bytes,
                             max_circuit_conns=c.max_circuits,
                             max_reservations=c.max_reservations,
                             reservation_ttl=int(c.reservation_ttl_s))
        self.protocol = _CountingRelay(self.host, limits=limits, allow_hop=False)
        self.transport = CircuitV2Transport(
            self.host, self.protocol,
            RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the STOP side (accept relayed connections) until cancelled."""
        async with background_trio_service(self.protocol):
            await self.protocol.event_started.wait()
            task_status.started()
            await trio.sleep_forever()

    def enable_hop(self) -> None:
        """Act as a relay for others (bootstrap peers and publicly reachable nodes)."""
        if self.hop_enabled or not self.config.relay.service:
            return
        self.protocol.allow_hop = True
        self.host.set_stream_handler(HOP_PROTOCOL, self.protocol._handle_hop_stream)
        self.hop_enabled = True
        logger.info("serving as a circuit relay (at most %d reservations, %d circuits)",
                    self.config.relay.max_reservations, self.config.relay.max_circuits)

    def serving(self) -> dict[str, int]:
        rm = self.protocol.resource_manager
        return {"relay_serving": int(self.hop_enabled),
                "relay_served_reservations": len(getattr(rm, "_reservations", {}) or {}),
                "relay_circuit_bytes": self.protocol.circuit_bytes}

    # -- client side ---------------------------------------------------------------------
    def held(self) -> list[ID]:
        """Relays we hold a live reservation on (and are still connected to)."""
        now = time.time()
        connected = set(self.host.get_connected_peers())
        return [r for r, exp in self.reservations.items() if r in connected and exp > now]

    def prune(self) -> list[ID]:
        """Forget reservations on relays we lost (disconnected or expired); return those."""
        live = set(self.held())
        lost = [r for r in self.reservations if r not in live]
        for relay in lost:
            del self.reservations[relay]
        return lost

    async def reserve(self, relay: ID) -> bool:
        """Reserve (or refresh) a slot on ``relay``; False when refused or unreachable."""
        try:
            with trio.fail_after(self.config.peers.dial_timeout_s):
                stream = await self.host.new_stream(relay, [HOP_PROTOCOL])
                try:
                    # the public reserve() also starts a refresher task in a nursery of its
                    # own choosing; we refresh from RelayHub.maintain instead
                    ok = await self.transport._make_reservation(stream, relay)
                finally:
                    await stream.close()
        except Exception as e:  # noqa: BLE001 - no hop protocol, refused, gone
            logger.debug("reservation on %s failed: %s: %s", relay, type(e).__name__, e)
            return False
        if not ok:
            return False
        expires = float(self.transport._reservations.get(relay, 0) or 0)
        self.reservations[relay] = expires if expires > time.time() else time.time() + 60
        return True

    def needs_refresh(self, relay: ID) -> bool:
        return self.reservations.get(relay, 0.0) - time.time() < REFRESH_MARGIN_S

    def circuit_addrs(self) -> list[str]:
        """``<relay addr>/p2p/<relay>/p2p-circuit/p2p/<me>`` for each relay we hold."""
        me = self.host.get_id()
        out = []
        for relay in self.held():
            for addr in self._relay_addrs(relay):
                out.append(f"{addr}/p2p/{relay}/p2p-circuit/p2p/{me}")
        return out

    def _relay_addrs(self, relay: ID) -> list[str]:
        """Addresses we reach the relay at: the remote end of our connection to it."""
        out = []
        for conn in self.host.get_network().get_connections(relay):
            for a in conn.get_transport_addresses():
                text = str(a)
                if not is_circuit(text) and "/tcp/" in text:
                    out.append(text.split("/p2p/")[0])
        return list(dict.fromkeys(out))[:2]

    async def dial(self, info: PeerInfo) -> None:
        """Connect to ``info.peer_id`` through one of its circuit addresses."""
        errors = []
        for addr in info.addrs:
            if not is_circuit(addr):
                continue
            full = addr if "/p2p-circuit/p2p/" in str(addr) else \
                multiaddr.Multiaddr(f"{addr}/p2p/{info.peer_id}")
            try:
                await self.transport.dial(full)
                return
            except Exception as e:  # noqa: BLE001 - relay gone, refused, no reservation
                errors.append(f"{type(e).__name__}: {e}")
        raise ConnectionError(f"no relay path to {info.peer_id}: {'; '.join(errors) or 'none'}")
