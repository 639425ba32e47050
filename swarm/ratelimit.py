"""Per-sender token buckets with bounded memory."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["TokenBuckets"]


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
