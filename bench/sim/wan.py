"""WAN one-way latencies: peers spread over six regions, approximate inter-region RTTs.

The RTTs are typical public-cloud inter-region round trips (order of magnitude of published
AWS/GCP region ping tables, not measured here) plus ~15 ms of home-access latency per side;
peers are placed by a rough guess of where RL-swarm users are. Half an RTT is one way.
"""

from __future__ import annotations

import math
import random

__all__ = ["REGIONS", "WanLatency"]

REGIONS = ("us-east", "us-west", "europe", "asia", "s-america", "oceania")
_WEIGHTS = (0.25, 0.15, 0.3, 0.2, 0.05, 0.05)
_RTT_MS = (  # symmetric, same order as REGIONS
    (10, 65, 80, 180, 120, 200),
    (65, 10, 140, 120, 175, 140),
    (80, 140, 12, 170, 190, 260),
    (180, 120, 170, 15, 290, 110),
    (120, 175, 190, 290, 15, 310),
    (200, 140, 260, 110, 310, 15),
)
_ACCESS_MS = 15.0


class WanLatency:
    """Region per peer and a one-way latency per message (log-normal jitter)."""

    def __init__(self, rng: random.Random, *, jitter: float) -> None:
        self.rng = rng
        self.region: list[int] = []
        self.base = [[rtt / 2 + _ACCESS_MS for rtt in row] for row in _RTT_MS]
        # jitter factors drawn once and cycled through (a gauss per copy was a tenth of the run)
        self.factors = [math.exp(rng.gauss(0.0, jitter)) for _ in range(4096)]
        self.i = 0

    def add_peer(self) -> None:
        self.region.append(self.rng.choices(range(len(REGIONS)), _WEIGHTS)[0])

    def one_way_ms(self, a: int, b: int) -> float:
        self.i = (self.i + 1) & 4095
        return self.base[self.region[a]][self.region[b]] * self.factors[self.i]
