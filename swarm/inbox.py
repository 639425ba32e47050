"""Bounded per-type queues of validated messages waiting for the learner."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from protocol import Message

__all__ = ["Delivery", "Inbox"]


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """A validated message from another peer; ``sender`` is its libp2p peer id."""

    sender: str
    message: Message
    received_ms: int
    size: int = 0
    """Bytes of the envelope it came in (``receive`` answers within a byte budget)."""


@dataclass(kw_only=True)
class Inbox:
    """One deque per message type, at most ``size`` each: when the learner is slow, the oldest
    message is dropped and counted as ``dropped_<type>`` in ``counters``."""

    size: int
    counters: collections.Counter[str]
    _queues: dict[str, collections.deque[Delivery]] = field(default_factory=dict, repr=False)

    def put(self, type_: str, item: Delivery) -> None:
        q = self._queues.setdefault(type_, collections.deque())
        if len(q) >= self.size:
            q.popleft()
            self.counters[f"dropped_{type_}"] += 1
        q.append(item)

    def take(self, type_: str, max_items: int, max_bytes: int | None = None) -> list[Delivery]:
        """Oldest first, at most ``max_items`` and (but for the first) ``max_bytes``."""
        q = self._queues.get(type_)
        out: list[Delivery] = []
        size = 0
        while q and len(out) < max_items:
            if out and max_bytes is not None and size + q[0].size > max_bytes:
                break
            size += q[0].size
            out.append(q.popleft())
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())
