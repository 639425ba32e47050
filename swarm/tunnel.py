"""Collective tunnels: carry the collective's (hivemind p2pd) TCP connections to a peer that
nobody can dial over this swarm's libp2p connection to it, which may be relayed.

Why: a node behind NAT cannot be dialled on its collective port either, and p2pd's own relay
path did not work in our measurements (hivemind 1.1.12's p2pd on the WAN bed, one public
relay forced public, the target behind NAT with ``use_auto_relay`` and the relay as trusted
relay: after 75 s it still advertised no ``p2p-circuit`` address; a ``connect`` to
``<relay>/p2p-circuit/p2p/<target>`` returned OK in 0.1 s, yet ``list_peers`` never showed the
target and 15 stream opens over 30 s all failed with "protocols not supported"; the same
handler answered at once over a direct connection; with ``auto_nat`` (which also turns on
p2pd's hole punching) on both ends, the same). The swarm process already reaches every peer (directly, or through a circuit relay,
swarm.relay), so it forwards bytes:

    learner's p2pd ──TCP──> 127.0.0.1:P (TunnelHub listener for peer X, in our swarm process)
        ──libp2p stream /swarm-node/collective-tunnel/1.0.0──> X's swarm process
        ──TCP──> X's p2pd (the address X's learner announced)

p2pd's own security handshake runs end to end inside the tunnel, so the peer id is checked by
p2pd as on a direct connection; the swarm processes only move opaque bytes. Costs a peer can
trigger are bounded: at most ``MAX_TUNNELS`` open tunnels into this node and
``MAX_TUNNELS_PER_PEER`` per peer; a relay bounds bytes and time per circuit (swarm.relay).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

__all__ = ["TUNNEL_PROTOCOL", "TunnelHub", "p2pd_target"]

logger = logging.getLogger(__name__)

TUNNEL_PROTOCOL = TProtocol("/swarm-node/collective-tunnel/1.0.0")
MAX_TUNNELS = 64
MAX_TUNNELS_PER_PEER = 16
MAX_LISTENERS = 64
CHUNK = 1 << 16


@dataclass
class TunnelHub:
    """Serves tunnels into our p2pd and opens local listeners that tunnel to a peer's."""

    host: IHost
    local_target: Callable[[], tuple[str, int] | None]
    """Where our own p2pd listens (from the learner's announced collective addresses)."""
    ensure_connected: Callable[[ID], Awaitable[bool]]
    """Connect to a peer (directly or through a relay) if not connected yet."""
    bind_host: str = "127.0.0.1"
    nursery: trio.Nursery | None = None
    listeners: dict[str, tuple[int, trio.CancelScope]] = field(default_factory=dict)
    """Peer id -> local port of its tunnel listener and the scope that serves it."""
    opened: int = 0
    refused: int = 0
    _inbound: dict[ID, int] = field(default_factory=dict)
    _last_io: dict[INetStream, float] = field(default_factory=dict)
    """Open tunnel streams (both directions) -> trio time they last moved a byte."""

    def install(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.host.set_stream_handler(TUNNEL_PROTOCOL, self._serve)

    def stats(self) -> dict[str, int]:
        return {"tunnels_open": sum(self._inbound.values()), "tunnels_opened": self.opened,
                "tunnels_refused": self.refused, "tunnel_listeners": len(self.listeners)}

    def last_io(self, stream: INetStream) -> float | None:
        """When ``stream`` last moved a byte if it is an open tunnel, else None (a relayed
        connection is drained only once its tunnels are idle: swarm.holepunch)."""
        return self._last_io.get(stream)

    # -- server: a peer's p2pd reaching ours ----------------------------------------------
    async def _serve(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        target = self.local_target()
        total = sum(self._inbound.values())
        if target is None or total >= MAX_TUNNELS \
                or self._inbound.get(peer, 0) >= MAX_TUNNELS_PER_PEER:
            self.refused += 1
            await _reset(stream)
            return
        self._inbound[peer] = self._inbound.get(peer, 0) + 1
        try:
            tcp = await trio.open_tcp_stream(*target)
        except OSError as e:
            logger.debug("tunnel from %s: our p2pd at %s refused: %s", peer, target, e)
            self._drop(peer)
            self.refused += 1
            await _reset(stream)
            return
        self.opened += 1
        try:
            await _pipe(tcp, stream, self._last_io)
        finally:
            self._drop(peer)

    def _drop(self, peer: ID) -> None:
        n = self._inbound.get(peer, 0) - 1
        if n > 0:
            self._inbound[peer] = n
        else:
            self._inbound.pop(peer, None)

    # -- client: our p2pd reaching a peer's ------------------------------------------------
    async def port_for(self, peer_id: str) -> int:
        """A local TCP port whose connections are tunnelled to ``peer_id``'s p2pd."""
        if peer_id in self.listeners:
            return self.listeners[peer_id][0]
        if self.nursery is None:
            raise RuntimeError("TunnelHub.install was not called")
        if len(self.listeners) >= MAX_LISTENERS:
            self._evict()
        try:
            peer = ID.from_base58(peer_id)
        except Exception:  # noqa: BLE001 - base58/multihash errors of several types
            raise ValueError(f"not a peer id: {peer_id[:64]!r}") from None
        listeners = await trio.open_tcp_listeners(0, host=self.bind_host)
        port = listeners[0].socket.getsockname()[1]
        scope = trio.CancelScope()
        self.listeners[peer_id] = (port, scope)

        async def handle(tcp: trio.SocketStream) -> None:
            try:
                if not await self.ensure_connected(peer):
                    raise ConnectionError("no connection")
                with trio.fail_after(30):
                    stream = await self.host.new_stream(peer, [TUNNEL_PROTOCOL])
            except Exception as e:  # noqa: BLE001 - peer gone, no relay, refused
                logger.info("collective tunnel to %s failed: %s: %s", peer_id, type(e).__name__, e)
                await tcp.aclose()
                return
            await _pipe(tcp, stream, self._last_io)

        async def serve() -> None:
            with scope:
                await trio.serve_listeners(handle, listeners)

        self.nursery.start_soon(serve)
        logger.info("collective tunnel to %s on %s:%d", peer_id, self.bind_host, port)
        return port

    def _evict(self) -> None:
        """Close the listener of a peer we are no longer connected to (oldest first)."""
        connected = {str(p) for p in self.host.get_connected_peers()}
        for peer_id, (_, scope) in list(self.listeners.items()):
            if peer_id not in connected:
                scope.cancel()
                del self.listeners[peer_id]
                return
        raise ValueError(f"{MAX_LISTENERS} tunnel listeners to connected peers already")


def p2pd_target(collective_addrs: tuple[str, ...] | list[str]) -> tuple[str, int] | None:
    """(ip, port) of the first direct ip4/tcp address among our own collective addrs."""
    for text in collective_addrs:
        if "/p2p-circuit" in text:
            continue
        try:
            m = multiaddr.Multiaddr(text)
            return m.value_for_protocol("ip4"), int(m.value_for_protocol("tcp"))
        except Exception:  # noqa: BLE001 - not ip4/tcp
            continue
    return None


async def _pipe(tcp: trio.SocketStream, stream: INetStream,
                last_io: dict[INetStream, float]) -> None:
    """Copy both ways until both sides ended; reset everything on the first error.
    ``last_io[stream]`` is the time a byte last went either way while the pipe is open."""
    last_io[stream] = trio.current_time()

    async def up() -> None:  # TCP -> libp2p
        while data := await tcp.receive_some(CHUNK):
            last_io[stream] = trio.current_time()
            await stream.write(data)
        # libp2p's INetStream lacks close_write; both its streams (NetStream, QUIC) have it
        await stream.close_write()  # type: ignore[attr-defined]

    async def down() -> None:  # libp2p -> TCP
        while data := await stream.read(CHUNK):
            last_io[stream] = trio.current_time()
            await tcp.send_all(data)
        await tcp.send_eof()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(up)
            nursery.start_soon(down)
    except Exception as e:  # noqa: BLE001 - either end went away
        logger.debug("tunnel closed: %s: %s", type(e).__name__, e)
        await _reset(stream)
    finally:
        last_io.pop(stream, None)
        await tcp.aclose()


async def _reset(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception:  # noqa: BLE001
        pass
