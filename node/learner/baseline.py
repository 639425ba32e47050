"""The receiver's own expected reward per task family: what external groups are judged against.

``OwnBaseline`` keeps, per family, an exponential moving average of the mean reward of the
node's *own* local completions and of the within-group spread (population std) of its own
groups (one update per round and family). An
external group's ``Anchor`` (``grpo.anchored_advantages``) is built from it, so a sender
cannot choose the bar its completions are measured against. Only local rewards feed it, so its
size is bounded by the node's own families and no peer can move it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from node.learner.grpo import Anchor

__all__ = ["OwnBaseline"]


@dataclass
class _Moments:
    mean: float
    spread: float


def _pstd(values: Sequence[float]) -> float:
    mu = sum(values) / len(values)
    return math.sqrt(sum((v - mu) ** 2 for v in values) / len(values))


class OwnBaseline:
    """Running mean reward and within-group spread of our own local groups, per family."""

    def __init__(self, *, momentum: float, group_size: int) -> None:
        if not 0 <= momentum < 1:
            raise ValueError(f"OwnBaseline: momentum must be in [0, 1), got {momentum}")
        if group_size < 2:
            raise ValueError(f"OwnBaseline: group_size must be >= 2, got {group_size}")
        self.momentum = momentum
        self.max_abs = math.sqrt(group_size - 1)
        self._families: dict[str, _Moments] = {}

    def update(self, family: str, groups: Sequence[Sequence[float]]) -> None:
        """Fold one round's local groups (their rewards) of ``family`` into its statistics."""
        groups = [g for g in groups if g]
        if not groups:
            return
        mean = sum(sum(g) for g in groups) / sum(len(g) for g in groups)
        spread = sum(_pstd(g) for g in groups) / len(groups)
        m = self._families.get(family)
        if m is None:
            self._families[family] = _Moments(mean, spread)
            return
        m.mean = self.momentum * m.mean + (1 - self.momentum) * mean
        m.spread = self.momentum * m.spread + (1 - self.momentum) * spread

    def anchor(self, family: str) -> Anchor | None:
        """The anchor for an external group of ``family``; None before any local rewards."""
        m = self._families.get(family)
        if m is None:
            return None
        return Anchor(mean=m.mean, std=m.spread, max_abs=self.max_abs)
