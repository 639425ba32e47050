"""Task families and the registry that turns a ``TaskSpec`` back into a question + verifier.

Built-in families live in ``tiny.py``; any other name is looked up in ReasoningGYM
(``rgym.py``). ``build_task`` is the single entry point for received specs: it raises
``TaskError`` (with a ``reason``) for anything that cannot be regenerated.
"""

from __future__ import annotations

from node.learner.errors import TaskError
from node.learner.tasks.base import Task, TaskFamily
from node.learner.tasks.letter_sort import LetterSort
from node.learner.tasks.rgym import ReasoningGymFamily, is_reasoning_gym_family
from node.learner.tasks.tiny import TinyAdd
from protocol import TaskSpec

__all__ = ["FAMILIES", "Task", "TaskFamily", "build_task", "get_family"]

FAMILIES: dict[str, TaskFamily] = {f.name: f for f in (LetterSort(), TinyAdd())}
"""Built-in families by name; ReasoningGYM families are created on first use."""


def get_family(name: str) -> TaskFamily:
    """The family called ``name``; ``TaskError('unknown_family')`` if none."""
    family = FAMILIES.get(name)
    if family is None and is_reasoning_gym_family(name):
        family = FAMILIES.setdefault(name, ReasoningGymFamily(name))
    if family is None:
        raise TaskError("unknown_family", f"no task family {name!r}")
    return family


def build_task(spec: TaskSpec, *, prompt: str | None = None) -> Task:
    """Regenerate a task from its spec; if ``prompt`` is given it must match the regenerated one."""
    task = get_family(spec.family).build(spec)
    if prompt is not None and prompt != task.prompt:
        raise TaskError("prompt_mismatch", f"{spec.family}: prompt differs from the regenerated question")
    return task
