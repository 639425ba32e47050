"""ReasoningGYM families (procedural, offline), only those whose verifier we have vetted.

The spec's ``config`` is passed to ``reasoning_gym.create_dataset`` (difficulty knobs); the
spec's ``seed`` seeds the dataset and ``index`` picks the item, so any peer regenerates the
same question and verifier.

Vetting. Re-scoring runs a family's verifier on text written by strangers, so a family is
usable only if it is in ``VETTED`` below. To vet one, read the whole path from
``score_answer`` down (its class and every helper it calls, in reasoning_gym's site-packages
source) and check that it

- never evaluates the text: no ``eval``, ``exec``, ``compile``, ``ast``, ``literal_eval``,
  ``sympy`` (``parse_expr``/``sympify`` evaluate), ``importlib``/``__import__``, no
  subprocess or file access;
- costs at most polynomially in the answer's length (the receiver bounds that length in
  tokens before anything is scored) and does not depend on the answer for its memory;
- has a generator (``create_dataset`` + ``ds[index]``) that is cheap at its default config.

A family that fails the first or second point may still be vetted with our own scorer in
``scorers.SAFE_SCORERS`` (same rewards on sane answers, strict parsing, length caps). Then add the family to ``VETTED``
with a one-line note of what was read; ``tests/learner/test_verifiers.py`` feeds every vetted
family hostile answers and scans its scoring source. Everything else is refused:
``TaskError("unvetted_family")`` locally (config validation) and for received rollouts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
from typing import Any

from node.learner.errors import TaskError
from node.learner.tasks.base import HELDOUT_SEED_BASE, TRAINING_SEEDS, Task
from node.learner.tasks.scorers import SAFE_SCORERS
from protocol import TaskSpec

__all__ = ["MAX_INDEX", "VETTED", "ReasoningGymFamily", "clear_cache", "is_reasoning_gym_family"]

log = logging.getLogger(__name__)
MAX_INDEX = 9_999
"""Largest item index accepted (the dataset is built with size index+1)."""
_CACHE_DATASETS = 8
"""Datasets kept built (per family, config, seed, size). Seeds are random, so hits are rare
(the same spec rebuilt); each is < 0.2 MB for the vetted families at their default config
(measured) but a config may make one large (count_primes max_n 2e7: ~230 MB), hence small."""

VETTED: dict[str, str] = {
    "base_conversion": "base score_answer: string equality / substring",
    "basic_arithmetic": "base score_answer: string equality / substring",
    "arc_1d": "base score_answer: string equality / substring",
    "bf": "base score_answer; bfi runs only the generator's own program",
    "count_primes": "base score_answer; generator sieves up to max_n (own config only)",
    "propositional_logic": "own recursive string parser (not sympy) + truth table over the "
                           "question's variables; ~cubic in length: scorers caps the length",
    "fraction_simplification": "regex + int(); bare except returns 0.01",
    "decimal_arithmetic": "decimal.Decimal(answer) and a subtraction; ast only in the generator",
    "calendar_arithmetic": "strip/title/int() and math.exp of a relative error",
    "binary_matrix": "upstream eval()s the answer: replaced by scorers.binary_matrix_score",
}
"""Family name -> what its scoring path does (why it is safe)."""


def is_reasoning_gym_family(name: str) -> bool:
    """Whether reasoning_gym registers a dataset called ``name`` (vetted or not)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:  # pragma: no cover - reasoning_gym is a dependency
        return False
    return name in DATASETS


@functools.lru_cache(maxsize=_CACHE_DATASETS)
def _dataset(name: str, config_items: tuple[tuple[str, Any], ...], seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **dict(config_items))


def clear_cache() -> None:
    """Drop every cached dataset (the verifier worker does so when its memory runs high)."""
    _dataset.cache_clear()


class ReasoningGymFamily:
    """One vetted ReasoningGYM dataset as a task family."""

    def __init__(self, name: str) -> None:
        if name not in VETTED:
            raise TaskError("unvetted_family", f"{name}: verifier not vetted (see tasks/rgym.py)")
        self.name = name

    def normalize_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with the dataset's defaults filled in (``seed``/``size`` excluded);
        ``TaskError('bad_config')`` for a key the dataset's config does not have."""
        from reasoning_gym.factory import DATASETS

        fields = {f.name: f for f in dataclasses.fields(DATASETS[self.name][1])}
        fields.pop("seed", None)
        fields.pop("size", None)
        unknown = set(config) - set(fields)
        if unknown:
            raise TaskError("bad_config", f"{self.name}: unknown config keys {sorted(unknown)}")
        out: dict[str, Any] = {}
        for key, f in fields.items():
            if key in config:
                out[key] = config[key]
            elif f.default is not dataclasses.MISSING:
                out[key] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[key] = f.default_factory()
        return out

    def sample_spec(self, rng: random.Random, config: dict[str, Any]) -> TaskSpec:
        self.normalize_config(config)
        return TaskSpec(family=self.name, config=dict(config), seed=rng.randrange(TRAINING_SEEDS),
                        index=rng.randrange(MAX_INDEX + 1))

    def heldout_spec(self, config: dict[str, Any], number: int) -> TaskSpec:
        """Item ``number`` of one dataset seeded ``HELDOUT_SEED_BASE`` (one dataset built for
        the whole set; its items' effective seeds are above every training item's)."""
        if not 0 <= number <= MAX_INDEX:
            raise TaskError("bad_config", f"{self.name}: held-out question {number} > {MAX_INDEX}")
        self.normalize_config(config)
        return TaskSpec(family=self.name, config=dict(config), seed=HELDOUT_SEED_BASE, index=number)

    def build(self, spec: TaskSpec) -> Task:
        if spec.index > MAX_INDEX:
            raise TaskError("bad_config", f"{self.name}: index {spec.index} > {MAX_INDEX}")
        self.normalize_config(dict(spec.config))
        try:
            ds = _dataset(self.name, tuple(sorted(spec.config.items())), spec.seed, spec.index + 1)
            entry = ds[spec.index]
        except Exception as e:  # reasoning_gym raises assorted errors for bad configs
            raise TaskError("bad_config", f"{self.name}: {type(e).__name__}: {e}") from None
        scorer = SAFE_SCORERS[self.name](ds) if self.name in SAFE_SCORERS else ds.score_answer

        def score(text: str) -> float:
            try:
                return float(scorer(text.strip(), entry))
            except Exception as e:  # a verifier bug must not crash the node
                log.debug("verifier %s failed: %s", self.name, type(e).__name__)
                return 0.0

        return Task(spec=spec, prompt=f"{entry['question']}\nAnswer: ", answer=str(entry["answer"]),
                    score=score)
