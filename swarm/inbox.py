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

    def take(self, type_: str, max_items: int) -> list[Delivery]:
        q = self._queues.get(type_)
        out: list[Delivery] = []
        while q and len(out) < max_items:
            out.append(q.popleft())
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())
