"""The learner's view of the swarm: the Bridge interface and an in-process loopback.

The learner process never imports libp2p. It talks to the swarm process through a Bridge:
``SocketBridge`` (node/ipc_client.py) speaks msgpack frames over a Unix socket to the swarm
process; ``LoopbackHub`` connects several in-process bridges for tests of the learner alone.
Both carry the same signed envelopes (``protocol.seal`` / ``protocol.open_envelope``).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Protocol

from protocol import Identity, Message, PeerAnnouncement, ReplayGuard, open_envelope, seal


@dataclass(frozen=True, kw_only=True)
class Received:
    """A validated message from another peer. ``sender`` is its libp2p peer id."""

    sender: str
    message: Message
    received_ms: int


class Bridge(Protocol):
    peer_id: str
    """This node's libp2p peer id (seeds its task sampling; names it in reports)."""

    def announce(self, *, model: str, collective_addrs: tuple[str, ...] = (),
                 capabilities: tuple[str, ...] = ()) -> None:
        """Tell the swarm what this node runs; the swarm process announces it periodically."""

    def publish(self, message: Message) -> None:
        """Sign (swarm side) and gossip a RolloutBatch (the one type a learner publishes)."""

    def receive(self, type_: str, *, max_items: int = 256) -> list[Received]:
        """Take up to ``max_items`` validated messages of one type (oldest first)."""

    def peers(self) -> list[PeerAnnouncement]:
        """The latest announcement of every live peer (self excluded)."""

    def stats(self) -> dict[str, int]:
        """Counters: published, received, rejected by reason, dropped, ..."""

    def links(self) -> dict[str, str]:
        """Each connected peer's link: ``direct``, or ``relayed`` (through a circuit relay
        only: swarm.holepunch)."""

    def sources(self, delivered: dict[str, int], valid: dict[str, int] | None = None, *,
                own: int | None = None) -> None:
        """Once a round, per sender: groups it delivered that passed our re-scoring with
        signal (``delivered``) and that passed it at all (``valid``), and our own local
        groups with signal (``own``); running totals. The swarm process keeps the feeds of
        sources that deliver (swarm.feed_standing)."""

    def close(self) -> None: ...


@dataclass
class LoopbackHub:
    """Connects in-process LoopbackBridges; every message is really sealed and verified."""

    swarm_id: str = "loopback"
    queue_limit: int = 1024
    bridges: dict[str, LoopbackBridge] = field(default_factory=dict)

    def bridge(self, identity: Identity) -> LoopbackBridge:
        b = LoopbackBridge(hub=self, identity=identity)
        self.bridges[identity.peer_id] = b
        return b

    def deliver(self, sender: str, data: bytes) -> None:
        for peer_id, b in self.bridges.items():
            if peer_id != sender:
                b._accept(data)


@dataclass
class LoopbackBridge:
    hub: LoopbackHub
    identity: Identity
    announcement: PeerAnnouncement | None = None
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
    delivered: dict[str, int] = field(default_factory=dict)
    """The learner's last ``sources`` report: groups with signal per sender."""
    valid: dict[str, int] = field(default_factory=dict)
    """The same report: groups that passed re-scoring per sender."""
    _queues: dict[str, collections.deque[Received]] = field(default_factory=dict)
    _guard: ReplayGuard = field(default_factory=ReplayGuard)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def announce(self, *, model: str, collective_addrs: tuple[str, ...] = (),
                 capabilities: tuple[str, ...] = ()) -> None:
        self.announcement = PeerAnnouncement(
            peer_id=self.identity.peer_id, addrs=(), model=model,
            collective_addrs=tuple(collective_addrs), capabilities=tuple(capabilities))

    def publish(self, message: Message) -> None:
        self.counters[f"published_{message.TYPE}"] += 1
        self.hub.deliver(self.identity.peer_id, seal(self.identity, message,
                                                     swarm_id=self.hub.swarm_id))

    def _accept(self, data: bytes) -> None:
        now = int(time.time() * 1000)
        env = open_envelope(data, swarm_id=self.hub.swarm_id)
        self._guard.check(env, now)
        q = self._queues.setdefault(env.type, collections.deque())
        if len(q) >= self.hub.queue_limit:
            q.popleft()
            self.counters[f"dropped_{env.type}"] += 1
        q.append(Received(sender=env.sender_peer_id, message=env.message, received_ms=now))
        self.counters[f"received_{env.type}"] += 1

    def receive(self, type_: str, *, max_items: int = 256) -> list[Received]:
        q = self._queues.get(type_)
        out: list[Received] = []
        while q and len(out) < max_items:
            out.append(q.popleft())
        return out

    def peers(self) -> list[PeerAnnouncement]:
        return [b.announcement for pid, b in self.hub.bridges.items()
                if pid != self.identity.peer_id and b.announcement is not None]

    def stats(self) -> dict[str, int]:
        return dict(self.counters)

    def links(self) -> dict[str, str]:
        return {}  # in process: no connections

    def sources(self, delivered: dict[str, int], valid: dict[str, int] | None = None, *,
                own: int | None = None) -> None:
        self.delivered = dict(delivered)  # no feeds in process: kept for tests to read
        self.valid = dict(valid or {})
        self.own = own

    def close(self) -> None:
        self.hub.bridges.pop(self.identity.peer_id, None)
