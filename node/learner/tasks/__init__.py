"""Task families and the registry that turns a ``TaskSpec`` back into a question + verifier.

Built-in families (``FAMILIES``: ``tiny.py`` and any other family of ours registered there)
are vetted by construction: their verifiers are our own code and never evaluate text.
Other names are looked up among the ReasoningGYM families whose verifier we have vetted
(``rgym.VETTED``; the module docstring says how a family gets vetted). A ReasoningGYM name
that is not vetted raises ``TaskError('unvetted_family')``, any other ``'unknown_family'``.

``build_task`` is the single entry point for received specs: it raises ``TaskError`` (with a
``reason``) for anything that cannot be regenerated. ``normalize_config`` fills a family's
defaults so that a receiver can compare a remote spec's config with its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from node.learner.errors import TaskError
from node.learner.tasks.answer import extract_answer, scored_text
from node.learner.tasks.base import Task, TaskFamily
from node.learner.tasks.letter_sort import LetterSort
from node.learner.tasks.rgym import VETTED, ReasoningGymFamily, is_reasoning_gym_family
from node.learner.tasks.tiny import TinyAdd
from protocol import TaskSpec

__all__ = ["FAMILIES", "Task", "TaskFamily", "build_task", "check_family", "extract_answer",
           "get_family", "normalize_config", "scored_text", "vetted_families"]

FAMILIES: dict[str, TaskFamily] = {f.name: f for f in (LetterSort(), TinyAdd())}
"""Built-in families by name (vetted by construction)."""
_RGYM: dict[str, TaskFamily] = {}


def vetted_families() -> tuple[str, ...]:
    """Every family name this node can train on and re-score (built-in + vetted ReasoningGYM)."""
    return tuple(sorted(set(FAMILIES) | set(VETTED)))


def check_family(name: str) -> None:
    """``TaskError`` (``unvetted_family`` / ``unknown_family``) unless ``name`` is usable;
    never imports reasoning_gym for a usable name."""
    if name in FAMILIES or name in VETTED:
        return
    if is_reasoning_gym_family(name):
        raise TaskError("unvetted_family",
                        f"{name!r} is a ReasoningGYM family whose verifier is not vetted "
                        f"(it may evaluate answer text); vetted: {', '.join(vetted_families())}")
    raise TaskError("unknown_family", f"no task family {name!r}; known: {', '.join(vetted_families())}")


def get_family(name: str) -> TaskFamily:
    """The family called ``name``; ``TaskError`` (``unvetted_family``/``unknown_family``) if none."""
    family = FAMILIES.get(name) or _RGYM.get(name)
    if family is None:
        check_family(name)
        family = _RGYM.setdefault(name, ReasoningGymFamily(name))
    return family


def normalize_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` of family ``name`` with its defaults filled in (families without a
    ``normalize_config`` method are compared as given); ``TaskError`` if invalid."""
    normalize = getattr(get_family(name), "normalize_config", None)
    return dict(config) if normalize is None else normalize(dict(config))


def build_task(spec: TaskSpec, *, prompt: str | None = None) -> Task:
    """Regenerate a task from its spec; if ``prompt`` is given it must match the regenerated one.

    The task's ``score`` applies answer extraction (``answer.scored_text``) before the
    family's verifier: the one place it happens, for local scoring and re-scoring alike."""
    task = get_family(spec.family).build(spec)
    if prompt is not None and prompt != task.prompt:
        raise TaskError("prompt_mismatch", f"{spec.family}: prompt differs from the regenerated question")
    return dataclasses.replace(task, score=_extracting(task.score))


def _extracting(score: Callable[[str], float]) -> Callable[[str], float]:
    def extracted(completion: str) -> float:
        return score(scored_text(completion))

    return extracted
