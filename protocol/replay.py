"""Replay protection with bounded memory.

A message is accepted once, and only while its creation time lies inside
[now - max_age, now + max_future]. Seen (sender, nonce) pairs are remembered until they age
out of the window. When more than ``capacity`` are held, the oldest are evicted and the
window's floor rises to their time, so an evicted nonce can never be replayed: anything at or
below the floor is stale. This closes gossipsub's own 120 s seen-cache gap.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from protocol.envelope import Envelope
from protocol.errors import DuplicateNonce, FutureMessage, StaleMessage


@dataclass(kw_only=True)
class ReplayGuard:
    max_age_ms: int = 300_000
    max_future_ms: int = 30_000
    capacity: int = 200_000
    _seen: OrderedDict[tuple[bytes, bytes], int] = field(default_factory=OrderedDict, repr=False)
    _floor_ms: int = -1

    def __post_init__(self) -> None:
        if self.max_age_ms <= 0 or self.max_future_ms < 0 or self.capacity <= 0:
            raise ValueError("ReplayGuard: max_age_ms and capacity must be positive")

    def check(self, envelope: Envelope, now_ms: int) -> None:
        """Raise a ReplayError, or remember the message as seen."""
        ts = envelope.created_ms
        if ts > now_ms + self.max_future_ms:
            raise FutureMessage(f"created {ts - now_ms} ms in the future")
        if ts < now_ms - self.max_age_ms or ts <= self._floor_ms:
            raise StaleMessage(f"created {now_ms - ts} ms ago, outside the replay window")
        key = (envelope.sender, envelope.nonce)
        if key in self._seen:
            raise DuplicateNonce("nonce already seen from this sender")
        self._expire(now_ms)
        self._seen[key] = ts
        while len(self._seen) > self.capacity:
            _, evicted_ts = self._seen.popitem(last=False)
            self._floor_ms = max(self._floor_ms, evicted_ts)

    def _expire(self, now_ms: int) -> None:
        cutoff = now_ms - self.max_age_ms
        # insertion order ≈ arrival order; stop at the first entry still in the window
        while self._seen:
            key, ts = next(iter(self._seen.items()))
            if ts >= cutoff:
                break
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)
