"""A task is a question plus its verifier, regenerated from a ``protocol.TaskSpec``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from protocol import TaskSpec

__all__ = ["HELDOUT_SEED_BASE", "TRAINING_SEEDS", "ConfiguredFamily", "Task", "TaskFamily"]

TRAINING_SEEDS = 2**31
"""Every training question's seed is below this: ``sample_spec`` draws it in [0, 2**31),
and a received rollout whose seed is not is refused (``heldout_seed``, rescore.py)."""
HELDOUT_SEED_BASE = 2**32
"""Held-out questions (``heldout_spec``) have seeds from here on. ReasoningGYM seeds item
``index`` with ``seed + index`` (index <= ``rgym.MAX_INDEX``), so a training question's
effective seed stays below 2**31 + 10_000 < this: disjoint by construction."""


@dataclass(frozen=True, kw_only=True)
class Task:
    """One question: its spec, the prompt shown to the policy and the verifier."""

    spec: TaskSpec
    prompt: str
    answer: str
    """Ground truth (for logs and reports; scoring goes through ``score``)."""
    score: Callable[[str], float]
    """Reward of one completion's text, in [0, 1]."""


class TaskFamily(Protocol):
    """Generates tasks of one family; must be deterministic in the spec."""

    name: str

    def sample_spec(self, rng: random.Random, config: dict[str, Any]) -> TaskSpec:
        """A fresh spec for this family with the given (validated) config."""

    def build(self, spec: TaskSpec) -> Task:
        """Regenerate the task; raise ``TaskError`` if the spec is not valid."""

    def heldout_spec(self, config: dict[str, Any], number: int) -> TaskSpec:
        """Question ``number`` (0, 1, ...) of this family's fixed held-out set: a seed at or
        above ``HELDOUT_SEED_BASE``, never one that ``sample_spec`` draws."""


class ConfiguredFamily:
    """A built-in family whose config is a small validated dict: ``_config`` fills defaults and
    raises ``TaskError('bad_config')``; specs carry the filled config, so a receiver compares
    a remote spec's config with ``normalize_config`` of its own."""

    name: str = ""

    def _config(self, config: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def normalize_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with defaults filled in; ``TaskError('bad_config')`` if invalid."""
        return self._config(config)

    def sample_spec(self, rng: random.Random, config: dict[str, Any]) -> TaskSpec:
        return TaskSpec(family=self.name, config=self._config(config),
                        seed=rng.randrange(TRAINING_SEEDS), index=0)

    def heldout_spec(self, config: dict[str, Any], number: int) -> TaskSpec:
        return TaskSpec(family=self.name, config=self._config(config),
                        seed=HELDOUT_SEED_BASE + number, index=0)
