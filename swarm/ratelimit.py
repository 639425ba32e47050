"""Per-sender token buckets with bounded memory, and the gate of a service any peer may ask."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["PeerGate", "TokenBuckets"]


@dataclass(kw_only=True)
class TokenBuckets:
    """``rate`` tokens per second up to ``burst``, one bucket per key; at most ``capacity``
    buckets are kept (the least recently used is forgotten, i.e. refilled)."""

    rate: float
    burst: float
    capacity: int = 10_000
    _buckets: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1 or self.capacity <= 0:
            raise ValueError("TokenBuckets: rate > 0, burst >= 1 and capacity > 0 required")

    def take(self, key: str, now_s: float) -> bool:
        """Take one token from ``key``'s bucket; False when it is empty."""
        tokens, last = self._buckets.pop(key, (self.burst, now_s))
        tokens = min(self.burst, tokens + max(0.0, now_s - last) * self.rate)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[key] = (tokens, now_s)
        while len(self._buckets) > self.capacity:
            self._buckets.popitem(last=False)
        return allowed


@dataclass(kw_only=True)
class PeerGate:
    """Admits one request per peer per ``min_interval_s`` and, over all peers, at most
    ``rate_per_s`` (bursts of ``burst``): fresh identities are free, so the global bucket is
    what bounds the cost. Remembers at most ``capacity`` peers' last requests."""

    min_interval_s: float
    rate_per_s: float
    burst: int
    capacity: int = 4096
    _bucket: TokenBuckets | None = field(default=None, repr=False)
    _last: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._bucket = TokenBuckets(rate=self.rate_per_s, burst=self.burst)

    def admit(self, peer: str, now_s: float) -> bool:
        assert self._bucket is not None
        if now_s - self._last.get(peer, -1e9) < self.min_interval_s:
            return False
        if not self._bucket.take("*", now_s):
            return False
        if len(self._last) > self.capacity:
            self._last = {k: v for k, v in self._last.items()
                          if now_s - v < self.min_interval_s}
        self._last[peer] = now_s
        return True
