"""Bootstrap and connection maintenance.

``Dialer.bootstrap`` dials the bootstrap peers with exponential backoff until one answers
(BootstrapError after ``peers.bootstrap_timeout_s``). ``Dialer.maintain`` then runs forever: it
expires peers whose announcements stopped, re-dials lost bootstrap peers, and dials peers
learned from announcements while fewer than ``peers.target`` are connected.

Dial rule: of two peers that learned of each other, only the one with the smaller peer id
dials, and a bootstrap-only peer dials nobody it learned of. Measured with py-libp2p 0.8.1:
when two peers dial each other at once they keep two connections, and gossip between them is
then lost silently (8 processes on loopback: nodes holding a duplicate connection missed up
to 20 of 35 batches; with this rule none were missed).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
import multiaddr

from swarm.config import GossipConfig
from swarm.errors import BootstrapError
from swarm.peers import PeerTable

__all__ = ["Dialer"]

logger = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 8.0


@dataclass(kw_only=True)
class Dialer:
    host: IHost
    config: GossipConfig
    bootstrap_peers: list[PeerInfo]
    table: PeerTable
    is_banned: Callable[[ID], bool] = lambda _peer: False
    """Peers not to dial (swarm.pubsub bans graylisted peers)."""
    relay_dial: Callable[[PeerInfo], Awaitable[None]] | None = None
    """Dials a peer through its ``p2p-circuit`` addresses (swarm.relay); ``host.connect``
    drops such addresses in py-libp2p 0.8.1."""
    _retry_at: dict[ID, tuple[float, float]] = field(default_factory=dict, repr=False)

    def connected(self) -> set[ID]:
        return set(self.host.get_connected_peers())

    async def dial(self, info: PeerInfo, *, force: bool = False) -> bool:
        """One dial under peers.dial_timeout_s; failures set a per-peer backoff (``force``: dial
        even while backing off)."""
        now = trio.current_time()
        at, delay = self._retry_at.get(info.peer_id, (0.0, BACKOFF_START_S / 2))
        if now < at and not force:
            return False
        try:
            with trio.fail_after(self.config.peers.dial_timeout_s):
                # py-libp2p refuses any dial to a peer for 60 s after one failed (its
                # negative cache): a restarted relay or bootstrap peer would stay unreachable
                # that long. Our own per-peer backoff (at most BACKOFF_MAX_S) decides instead.
                unblock = getattr(self.host.get_network(), "unblock_peer", None)
                if unblock is not None:
                    unblock(info.peer_id)
                direct = [a for a in info.addrs if "/p2p-circuit" not in str(a)]
                if direct or self.relay_dial is None:
                    await self.host.connect(PeerInfo(info.peer_id, direct or info.addrs))
                else:
                    await self.relay_dial(info)
        except Exception as e:  # py-libp2p raises many unrelated types for one failed dial
            delay = min(BACKOFF_MAX_S, delay * 2)
            self._retry_at[info.peer_id] = (now + delay * random.uniform(0.8, 1.2), delay)
            logger.debug("dial %s failed: %s: %s", info.peer_id, type(e).__name__, e)
            return False
        self._retry_at.pop(info.peer_id, None)
        return True

    async def bootstrap(self) -> None:
        """Return once a bootstrap peer is connected; raise BootstrapError at the deadline."""
        if not self.bootstrap_peers:
            return
        deadline = trio.current_time() + self.config.peers.bootstrap_timeout_s
        delay = BACKOFF_START_S
        attempt = 0
        while True:
            attempt += 1
            for info in self.bootstrap_peers:
                self._retry_at.pop(info.peer_id, None)
                if info.peer_id in self.connected() or await self.dial(info):
                    logger.info("connected to bootstrap peer %s", info.peer_id)
                    return
            left = deadline - trio.current_time()
            if left <= 0:
                addrs = ", ".join(f"{a}/p2p/{i.peer_id}" for i in self.bootstrap_peers for a in i.addrs)
                raise BootstrapError(f"no bootstrap peer reachable after "
                                     f"{self.config.peers.bootstrap_timeout_s:g} s "
                                     f"({attempt} attempts): {addrs}")
            logger.warning("bootstrap attempt %d failed; retrying in %.1f s (giving up in %.0f s)",
                           attempt, min(delay, left), left)
            await trio.sleep(min(delay, left))
            delay = min(BACKOFF_MAX_S, delay * 2)

    async def maintain(self, self_id: ID) -> None:
        while True:
            await trio.sleep(self.config.peers.maintain_interval_s)
            for pid in self.table.expire(trio.current_time()):
                logger.info("forgot peer %s: no announcement within its TTL", pid)
            await self._top_up(self_id)

    async def _top_up(self, self_id: ID) -> None:
        connected = self.connected()
        wanted: list[PeerInfo] = [i for i in self.bootstrap_peers if i.peer_id not in connected]
        room = self.config.peers.target - len(connected)  # config: peers.target <= peers.max
        # Only the peer with the smaller id dials: py-libp2p loses gossip silently between two
        # peers that hold two connections to each other (both dialed at once); see
        # tests/swarm/test_swarm.py and the module docstring.
        candidates = [] if self.config.bootstrap_only else [
            i for i in self._announced()
            if i.peer_id not in connected and str(self_id) < str(i.peer_id)
            and not self.is_banned(i.peer_id)]
        random.shuffle(candidates)
        wanted += candidates[:max(0, room)]
        if not wanted:
            return
        async with trio.open_nursery() as nursery:
            for info in wanted:
                nursery.start_soon(self.dial, info)

    def announced(self) -> list[PeerInfo]:
        """Dialable infos of live announced peers (bootstrap-only peers we know excluded)."""
        return self._announced()

    def _announced(self) -> list[PeerInfo]:
        out = []
        for ann in self.table.live():
            if ann.bootstrap_only and any(ann.peer_id == str(i.peer_id) for i in self.bootstrap_peers):
                continue
            addrs = []
            for text in ann.addrs:
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(text))
                except Exception:
                    continue
                if str(info.peer_id) == ann.peer_id:
                    addrs.extend(info.addrs)
            if addrs:
                out.append(PeerInfo(ID.from_base58(ann.peer_id), addrs))
        return out
