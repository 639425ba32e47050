"""Re-scoring of received rollouts: the receiver's verifier, never the sender's claim.

``Rescorer.rescore`` takes the RolloutBatches a round received from the bridge, rebuilds each
rollout's task from its ``TaskSpec`` and scores every completion locally. A rollout whose spec
cannot be regenerated (unknown family, bad config, prompt mismatch, ...) is rejected and
counted by reason. What comes out is a list of ``ScoredGroup`` (who sent it, in which of its
rounds, when it arrived) for the external pool (``sapo.py``) to keep or drop.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from node.bridge import Received
from node.learner.config import SapoConfig, TaskConfig
from node.learner.errors import TaskError
from node.learner.grpo import TrainingGroup
from node.learner.tasks import build_task
from protocol import Rollout, RolloutBatch

__all__ = ["RescoreResult", "Rescorer", "ScoredGroup", "rescore_rollout"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ScoredGroup:
    """One received question group, re-scored locally, with where and when it came from."""

    sender: str
    """Peer id of the authenticated sender."""
    round: int
    """The sender's round number (from its RolloutBatch)."""
    received_ms: int
    """Wall-clock milliseconds when the swarm process accepted the message."""
    family: str
    group: TrainingGroup
    """Prompt, completions and the *locally computed* rewards (source ``external``)."""
    claimed: tuple[float, ...] = ()
    """The rewards the sender claimed (a hint, never used as rewards; reputation may compare)."""


@dataclass
class RescoreResult:
    """What one ``Rescorer.rescore`` call saw."""

    groups: list[ScoredGroup] = field(default_factory=list)
    batches: int = 0
    rollouts: int = 0
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)


def rescore_rollout(rollout: Rollout) -> TrainingGroup:
    """Rebuild the task from its spec and score every completion locally; ``TaskError`` if invalid."""
    task = build_task(rollout.task, prompt=rollout.prompt)
    rewards = tuple(task.score(c) for c in rollout.completions)
    return TrainingGroup(prompt=task.prompt, completions=tuple(rollout.completions),
                         rewards=rewards, source="external")


class Rescorer:
    """Re-scores received rollouts for one learner (its task and SAPO config)."""

    def __init__(self, tasks: TaskConfig, sapo: SapoConfig) -> None:
        self.tasks = tasks
        self.sapo = sapo

    def rescore(self, received: list[Received]) -> RescoreResult:
        """Re-score every rollout of every received RolloutBatch; count what is rejected."""
        out = RescoreResult()
        for item in received:
            msg = item.message
            if not isinstance(msg, RolloutBatch):
                out.rejected["not_rollouts"] += 1
                continue
            out.batches += 1
            for rollout in msg.rollouts:
                out.rollouts += 1
                try:
                    group = rescore_rollout(rollout)
                except TaskError as e:
                    out.rejected[e.reason] += 1
                    log.info("rejected rollout from %s (round %d): %s", item.sender[:16], msg.round, e)
                    continue
                if len(group.completions) < 2:
                    out.rejected["too_few_completions"] += 1
                    continue
                out.groups.append(ScoredGroup(sender=item.sender, round=msg.round,
                                              received_ms=item.received_ms,
                                              family=rollout.task.family, group=group,
                                              claimed=tuple(rollout.rewards)))
        return out

    def close(self) -> None:
        """Release whatever the rescorer holds (nothing in process)."""
