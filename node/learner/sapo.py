"""SAPO's training-set construction: filter re-scored external groups, sample I local + J external.

Received rollouts are never trusted: ``rescore.py`` rebuilds each one from its ``TaskSpec``
and re-scores every completion with the local verifier (the sender's rewards are only a hint).
Valid groups wait in a bounded pool; each round the node
discards zero-advantage groups (all completions scored the same, as in the paper) and draws
J of the rest uniformly, filling any shortfall with extra local questions (equal budget).
"""

from __future__ import annotations

import collections
import logging
import random

from node.learner.config import SapoConfig
from node.learner.grpo import TrainingGroup
from node.learner.rescore import ScoredGroup

__all__ = ["ExternalPool", "plan_round"]

log = logging.getLogger(__name__)


def plan_round(config: SapoConfig, available_external: int) -> tuple[int, int]:
    """(I local questions to generate, J external groups to take) for this round.

    J is ``min(config.external, available)``; I fills the rest of the equal budget.
    """
    j = min(config.external, max(0, available_external))
    return config.questions_per_round - j, j


class ExternalPool:
    """Valid external groups waiting to be sampled, oldest dropped first when full."""

    def __init__(self, config: SapoConfig) -> None:
        self.config = config
        self._groups: collections.deque[TrainingGroup] = collections.deque(maxlen=config.pool_capacity)
        self.zero_advantage_discarded = 0

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, scored: list[ScoredGroup]) -> int:
        """Keep the re-scored groups that carry signal; returns how many were kept."""
        kept = 0
        for item in scored:
            group = item.group
            if self.config.filter_zero_advantage and len(set(group.rewards)) == 1:
                self.zero_advantage_discarded += 1
                continue
            kept += 1
            self._groups.append(group)
        return kept

    def take(self, n: int, rng: random.Random) -> list[TrainingGroup]:
        """Remove and return ``n`` groups drawn uniformly (fewer if the pool is smaller)."""
        n = min(n, len(self._groups))
        if n <= 0:
            return []
        picks = set(rng.sample(range(len(self._groups)), n))
        taken = [g for i, g in enumerate(self._groups) if i in picks]
        self._groups = collections.deque((g for i, g in enumerate(self._groups) if i not in picks),
                                         maxlen=self.config.pool_capacity)
        return taken
