"""SAPO's training-set construction: re-score received rollouts, filter, sample I local + J external.

Received rollouts are never trusted: each one is rebuilt from its ``TaskSpec`` and every
completion is re-scored with the local verifier (the sender's rewards are only a hint). A
rollout whose spec cannot be regenerated (unknown family, bad config, prompt mismatch) is
rejected and counted by reason. Valid groups wait in a bounded pool; each round the node
discards zero-advantage groups (all completions scored the same, as in the paper) and draws
J of the rest uniformly, filling any shortfall with extra local questions (equal budget).
"""

from __future__ import annotations

import collections
import logging
import random
from dataclasses import dataclass, field

from node.bridge import Received
from node.learner.config import SapoConfig
from node.learner.errors import TaskError
from node.learner.grpo import TrainingGroup
from node.learner.tasks import build_task
from protocol import Rollout, RolloutBatch

__all__ = ["ExternalPool", "IngestStats", "plan_round", "rescore_rollout"]

log = logging.getLogger(__name__)


def rescore_rollout(rollout: Rollout) -> TrainingGroup:
    """Rebuild the task from its spec and score every completion locally; ``TaskError`` if invalid."""
    task = build_task(rollout.task, prompt=rollout.prompt)
    rewards = tuple(task.score(c) for c in rollout.completions)
    return TrainingGroup(prompt=task.prompt, completions=tuple(rollout.completions),
                         rewards=rewards, source="external")


def plan_round(config: SapoConfig, available_external: int) -> tuple[int, int]:
    """(I local questions to generate, J external groups to take) for this round.

    J is ``min(config.external, available)``; I fills the rest of the equal budget.
    """
    j = min(config.external, max(0, available_external))
    return config.questions_per_round - j, j


@dataclass
class IngestStats:
    """What one ``ExternalPool.ingest`` call saw."""

    batches: int = 0
    rollouts: int = 0
    accepted: int = 0
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)


class ExternalPool:
    """Valid external groups waiting to be sampled, oldest dropped first when full."""

    def __init__(self, config: SapoConfig) -> None:
        self.config = config
        self._groups: collections.deque[TrainingGroup] = collections.deque(maxlen=config.pool_capacity)
        self.zero_advantage_discarded = 0

    def __len__(self) -> int:
        return len(self._groups)

    def ingest(self, received: list[Received]) -> IngestStats:
        """Re-score every rollout of every received RolloutBatch; keep the valid ones."""
        stats = IngestStats()
        for item in received:
            msg = item.message
            if not isinstance(msg, RolloutBatch):
                stats.rejected["not_rollouts"] += 1
                continue
            stats.batches += 1
            for rollout in msg.rollouts:
                stats.rollouts += 1
                try:
                    group = rescore_rollout(rollout)
                except TaskError as e:
                    stats.rejected[e.reason] += 1
                    log.info("rejected rollout from %s (round %d): %s", item.sender[:16], msg.round, e)
                    continue
                if len(group.completions) < 2:
                    stats.rejected["too_few_completions"] += 1
                    continue
                if self.config.filter_zero_advantage and len(set(group.rewards)) == 1:
                    self.zero_advantage_discarded += 1
                    continue
                stats.accepted += 1
                self._groups.append(group)
        return stats

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
