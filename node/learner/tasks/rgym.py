"""ReasoningGYM families (procedural, offline): any dataset name registered in reasoning_gym.

The spec's ``config`` is passed to ``reasoning_gym.create_dataset`` (difficulty knobs); the
spec's ``seed`` seeds the dataset and ``index`` picks the item, so any peer regenerates the
same question and verifier.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any

from node.learner.errors import TaskError
from node.learner.tasks.base import Task
from protocol import TaskSpec

__all__ = ["ReasoningGymFamily", "is_reasoning_gym_family"]

log = logging.getLogger(__name__)
MAX_INDEX = 9_999
"""Largest item index accepted (the dataset is built with size index+1)."""


def is_reasoning_gym_family(name: str) -> bool:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:  # pragma: no cover - reasoning_gym is a dependency
        return False
    return name in DATASETS


@functools.lru_cache(maxsize=256)
def _dataset(name: str, config_items: tuple[tuple[str, Any], ...], seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **dict(config_items))


class ReasoningGymFamily:
    """One ReasoningGYM dataset as a task family."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sample_spec(self, rng: random.Random, config: dict[str, Any]) -> TaskSpec:
        return TaskSpec(family=self.name, config=dict(config), seed=rng.randrange(2**31),
                        index=rng.randrange(MAX_INDEX + 1))

    def build(self, spec: TaskSpec) -> Task:
        if spec.index > MAX_INDEX:
            raise TaskError("bad_config", f"{self.name}: index {spec.index} > {MAX_INDEX}")
        try:
            ds = _dataset(self.name, tuple(sorted(spec.config.items())), spec.seed, spec.index + 1)
            entry = ds[spec.index]
        except Exception as e:  # reasoning_gym raises assorted errors for bad configs
            raise TaskError("bad_config", f"{self.name}: {type(e).__name__}: {e}") from None

        def score(text: str) -> float:
            try:
                return float(ds.score_answer(answer=text.strip(), entry=entry))
            except Exception as e:  # a verifier bug must not crash the node
                log.warning("verifier %s failed: %s", self.name, e)
                return 0.0

        return Task(spec=spec, prompt=f"{entry['question']}\nAnswer: ", answer=str(entry["answer"]),
                    score=score)
