"""Hole punching: turn a relayed connection between two NATed peers into a direct one.

py-libp2p 0.8.1's DCUtR (``libp2p.relay.circuit_v2.dcutr``) does the protocol: over the
relayed connection both peers send CONNECT with their predicted public address (the IP an
identify observer saw, with the *listen* port, since dials leave from the listen port with
SO_REUSEPORT), the initiator measures the RTT and sends SYNC, then both dial at once (a TCP
simultaneous open through both NATs), in up to 3 rounds of 5 s. ``HolePuncher`` subclasses it
for three things it does not do the way we need (shared/notes/holepunch.md §1.4):

- **one side drives**: the library's loop makes *both* peers initiate every 2 s; two sessions
  then dial the same 4-tuple from the same port and spoil each other's round. Here only the
  peer with the lower peer id drives; the other answers (its handler is the library's).
- **draining the relayed connection**: the library closes it 60 s after the upgrade, whatever
  it carries. Here it is closed once none of its collective-tunnel streams moved a byte for
  ``idle_s`` (``last_io``): new streams already go direct (the host picks a direct
  connection over a relayed one), so p2pd's next connection through the tunnel does too, and
  a running exchange is never cut; other streams (gossip) are re-opened by their owners.
- **counts**: punches tried, succeeded and failed (both sides), for ``stats()``.

A failed punch changes nothing: the relayed connection stays and carries on; attempts per
peer are bounded by the library (``MAX_HOLE_PUNCH_ATTEMPTS`` = 3, reset when the peer
disconnects). Symmetric NATs (a new port per destination) defeat the port prediction: those
peers stay relayed.

The private methods overridden or called here are pinned by tests/swarm/test_holepunch.py
(libp2p==0.8.1 in pyproject.toml): an upgrade that changes them fails there, not in the field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from libp2p.abc import IHost, INetConn, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2 import dcutr
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from multiaddr import Multiaddr

__all__ = ["DIRECT", "RELAYED", "HolePuncher", "is_relayed_conn", "link_of"]

logger = logging.getLogger(__name__)

DIRECT, RELAYED = "direct", "relayed"
DRIVE_INTERVAL_S = 2.0
"""How often the driving side looks for relayed-only peers (the library's period)."""
DRAIN_POLL_S = 1.0


def is_relayed_conn(conn: INetConn) -> bool:
    """A connection all of whose transport addresses go through a circuit relay."""
    try:
        addrs = conn.get_transport_addresses()
    except Exception:  # noqa: BLE001 - a closing connection
        return False
    return bool(addrs) and all("/p2p-circuit" in str(a) for a in addrs)


def link_of(host: IHost, peer: ID) -> str | None:
    """``direct`` when some connection to ``peer`` is not relayed, ``relayed`` when all are,
    None when not connected."""
    conns = host.get_network().get_connections(peer)
    if not conns:
        return None
    return RELAYED if all(is_relayed_conn(c) for c in conns) else DIRECT


class HolePuncher(DCUtRProtocol):
    """DCUtR with one driving side, tunnel-aware draining of the relayed connection and
    counters (see the module docstring). Run it with ``background_trio_service``."""

    def __init__(self, host: IHost, *, dial_timeout_s: float, idle_s: float = 10.0,
                 max_drain_s: float = 600.0,
                 last_io: Callable[[INetStream], float | None] | None = None) -> None:
        """dial_timeout_s: one hole-punch dial (and the unilateral dial before a punch).
        idle_s: a tunnel stream idle this long no longer holds the relayed connection open.
        max_drain_s: close the relayed connection after this long even if a tunnel is busy.
        last_io: when (trio time) a stream last moved a byte if it is a collective tunnel,
        else None (swarm.tunnel.TunnelHub.last_io); None: no stream holds the relayed
        connection."""
        if dial_timeout_s <= 0:
            raise ValueError(f"dial_timeout_s: {dial_timeout_s} must be > 0")
        if idle_s < 0 or max_drain_s < idle_s:
            raise ValueError(f"idle_s: {idle_s} and max_drain_s: {max_drain_s} need "
                             "0 <= idle_s <= max_drain_s")
        # the library takes whole seconds (it only passes them to trio.fail_after)
        super().__init__(host, dial_timeout=dial_timeout_s)  # type: ignore[arg-type]
        self.idle_s = idle_s
        self.max_drain_s = max_drain_s
        self.last_io = last_io
        self.attempts = 0
        self.succeeded = 0
        self.failed = 0
        self.unilateral = 0
        self.relays_closed = 0

    # -- what the node reads -------------------------------------------------------------
    def links(self) -> dict[ID, str]:
        """Every connected peer's link: ``direct`` or ``relayed``."""
        out = {}
        for peer in self.host.get_connected_peers():
            link = link_of(self.host, peer)
            if link is not None:
                out[peer] = link
        return out

    def stats(self) -> dict[str, int]:
        links = list(self.links().values())
        return {"peers_direct": links.count(DIRECT), "peers_relayed": links.count(RELAYED),
                "holepunch_attempts": self.attempts, "holepunch_direct": self.succeeded,
                "holepunch_failed": self.failed, "holepunch_unilateral": self.unilateral,
                "holepunch_relays_closed": self.relays_closed}

    def drives(self, peer: ID) -> bool:
        """Whether we initiate towards ``peer`` (the lower peer id does)."""
        return self.host.get_id().to_bytes() < peer.to_bytes()

    # -- overrides of py-libp2p 0.8.1's DCUtRProtocol --------------------------------------
    async def _auto_drive_loop(self) -> None:
        """Initiate towards relayed-only peers that we drive (one at a time, in order)."""
        while True:
            await trio.sleep(DRIVE_INTERVAL_S)
            for peer in list(self.host.get_connected_peers()):
                if (not self.drives(peer) or peer in self._in_progress
                        or self._hole_punch_attempts.get(peer, 0) >= dcutr.MAX_HOLE_PUNCH_ATTEMPTS
                        or link_of(self.host, peer) != RELAYED):
                    continue
                logger.debug("hole punch to %s (attempt %d)", peer,
                             self._hole_punch_attempts.get(peer, 0) + 1)
                await self.initiate_hole_punch(peer)

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        ok = await super()._try_unilateral_upgrade(peer_id)
        if ok:
            self.unilateral += 1
            logger.info("link to %s: direct (dialled it directly: %s)", peer_id,
                        self._direct_addr(peer_id))
            self._schedule_relay_close(peer_id)
        return ok

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr],
                                  as_responder: bool = False) -> bool:
        self.attempts += 1
        start = trio.current_time()
        ok = await super()._perform_hole_punch(peer_id, addrs, as_responder)
        if ok:
            self.succeeded += 1
            logger.info("link to %s: direct (hole punched in %.1f s, at %s)", peer_id,
                        trio.current_time() - start, self._direct_addr(peer_id))
        else:
            self.failed += 1
            logger.info("link to %s: still relayed (hole punch failed after %.1f s; "
                        "dialled %s)", peer_id, trio.current_time() - start,
                        ", ".join(map(str, addrs)) or "no address")
        return ok

    def _schedule_relay_close(self, peer_id: ID) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._drain_relayed, peer_id)

    # -- draining --------------------------------------------------------------------------
    async def _drain_relayed(self, peer_id: ID) -> None:
        """Close ``peer_id``'s relayed connections once no tunnel stream on them is busy and
        a direct connection still exists (else keep them: the peer stays reachable)."""
        deadline = trio.current_time() + self.max_drain_s
        while True:
            if link_of(self.host, peer_id) != DIRECT:
                return
            relayed = [c for c in self.host.get_network().get_connections(peer_id)
                       if is_relayed_conn(c)]
            if not relayed:
                return
            late = trio.current_time() >= deadline
            for conn in relayed:
                if late or not self._busy(conn):
                    logger.info("closing the relayed connection to %s (the direct one carries "
                                "its streams now%s)", peer_id,
                                "; a tunnel was still busy" if late else "")
                    self.relays_closed += 1
                    await conn.close()
            await trio.sleep(DRAIN_POLL_S)

    def _busy(self, conn: INetConn) -> bool:
        if self.last_io is None:
            return False
        try:
            streams = conn.get_streams()
        except Exception:  # noqa: BLE001 - a closing connection has none
            return False
        now = trio.current_time()
        return any(t is not None and now - t < self.idle_s for t in map(self.last_io, streams))

    def _direct_addr(self, peer: ID) -> str:
        for conn in self.host.get_network().get_connections(peer):
            if not is_relayed_conn(conn):
                return ", ".join(str(a) for a in conn.get_transport_addresses())
        return "?"
