"""The held-out score: a fixed evaluation set per task family that no training round uses.

The set. ``heldout_tasks`` takes ``questions`` questions, dealt round-robin over the node's
task families; question j of a family is ``family.heldout_spec(config, j)``, whose seed is
at or above ``tasks.base.HELDOUT_SEED_BASE``. Training questions have seeds below
``TRAINING_SEEDS`` (``sample_spec``), and a received rollout with any other seed is refused
(``heldout_seed``, rescore.py), so neither our own rounds nor a peer's rollouts train on it.
The set depends only on the families, their config and ``questions``: the same on every node
and every run with the same task config, so scores are comparable across nodes and time.
Seeds are disjoint, questions need not be: a small question space (``tiny_add`` with
``max_operand`` 9 has 100 sums) is seen in training whatever the seed; ``letter_sort``'s
26^5 words practically never are.

The score. ``Evaluator.run`` asks the node's own engine for one greedy completion per
question and ``samples`` sampled ones (the node's temperature and top-p, a fixed seed),
scores them with the family's own verifier (``build_task``: the same reward as training)
and reports accuracy (reward >= 1, as a round record's ``accuracy``) and mean reward,
overall and per family. Nothing here trains or touches the optimizer.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

from node.learner.config import TaskConfig
from node.learner.engine import Engine
from node.learner.prompting import PromptFormat
from node.learner.tasks import Task, build_task, get_family

__all__ = ["Evaluator", "HeldoutScore", "heldout_tasks"]

log = logging.getLogger(__name__)

_SEED = 0x4E1D
"""Seed of the sampled completions (fixed: the same weights give the same score)."""


def heldout_tasks(tasks: TaskConfig, *, questions: int) -> list[Task]:
    """The fixed evaluation set: ``questions`` questions dealt round-robin over
    ``tasks.families`` (the first families get one more when it does not divide)."""
    if questions < 1:
        raise ValueError(f"questions must be >= 1, got {questions}")
    families = tasks.families
    out = []
    for k in range(questions):
        name = families[k % len(families)]
        spec = get_family(name).heldout_spec(tasks.family_config.get(name, {}), k // len(families))
        out.append(build_task(spec))
    return out


@dataclass(frozen=True, kw_only=True)
class HeldoutScore:
    """One evaluation of the policy on the held-out set."""

    greedy_accuracy: float
    """Share of questions whose greedy completion earns reward >= 1."""
    sampled_accuracy: float
    """Share of sampled completions (``samples`` per question) that earn reward >= 1."""
    greedy_reward: float
    sampled_reward: float
    questions: int
    samples: int
    seconds: float
    """Wall time of the evaluation (generation and scoring)."""
    by_family: dict[str, dict[str, float]]
    """Family -> {"greedy_accuracy", "sampled_accuracy", "questions"}."""

    def to_record(self, **extra: Any) -> dict[str, Any]:
        """The JSON form carried in a round record's ``heldout`` (``extra``: e.g. ``after_rounds``)."""
        return {**extra, "greedy_accuracy": round(self.greedy_accuracy, 4),
                "sampled_accuracy": round(self.sampled_accuracy, 4),
                "greedy_reward": round(self.greedy_reward, 4),
                "sampled_reward": round(self.sampled_reward, 4),
                "questions": self.questions, "samples": self.samples,
                "seconds": round(self.seconds, 4), "by_family": self.by_family}


class Evaluator:
    """Scores a policy on the held-out set through an engine (built once; ``run`` per use)."""

    def __init__(self, *, tasks: TaskConfig, engine: Engine, prompts: PromptFormat,
                 questions: int, samples: int, max_batch: int = 64) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.tasks = heldout_tasks(tasks, questions=questions)
        self.engine = engine
        self.samples = samples
        self.max_batch = max_batch
        """Most sequences generated at once (the learner passes its round's I x G)."""
        self._rendered = [prompts.render(t.prompt) for t in self.tasks]

    def run(self) -> HeldoutScore:
        t = time.perf_counter()
        greedy = self._generate(n=1, greedy=True)
        sampled = self._generate(n=self.samples, greedy=False)
        g_rewards = [task.score(group[0]) for task, group in zip(self.tasks, greedy)]
        s_rewards = [[task.score(c) for c in group] for task, group in zip(self.tasks, sampled)]
        seconds = time.perf_counter() - t
        fams: dict[str, list[int]] = collections.defaultdict(list)
        for i, task in enumerate(self.tasks):
            fams[task.spec.family].append(i)
        by_family = {name: {"greedy_accuracy": round(_acc([g_rewards[i] for i in idx]), 4),
                            "sampled_accuracy": round(_acc([r for i in idx for r in s_rewards[i]]), 4),
                            "questions": len(idx)}
                     for name, idx in sorted(fams.items())}
        flat = [r for group in s_rewards for r in group]
        return HeldoutScore(greedy_accuracy=_acc(g_rewards), sampled_accuracy=_acc(flat),
                            greedy_reward=sum(g_rewards) / len(g_rewards),
                            sampled_reward=sum(flat) / len(flat), questions=len(self.tasks),
                            samples=self.samples, seconds=seconds, by_family=by_family)

    def _generate(self, *, n: int, greedy: bool) -> list[list[str]]:
        per_call = max(1, self.max_batch // n)
        out: list[list[str]] = []
        for start in range(0, len(self._rendered), per_call):
            chunk = self._rendered[start:start + per_call]
            groups = self.engine.generate(chunk, n=n, seed=_SEED + start, greedy=greedy)
            out.extend([c.text for c in group] for group in groups)
        return out


def _acc(rewards: list[float]) -> float:
    return sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else 0.0
