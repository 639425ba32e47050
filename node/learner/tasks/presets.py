"""Named sets of task families (``TaskConfig.preset``).

``sapo_paper`` is the family set of the SAPO paper's controlled experiment ("Sharing is
Caring", arXiv 2509.08721; docs/notes/sapo.md): nine ReasoningGYM families, one drawn
uniformly per question. All nine are vetted (``rgym.VETTED``): seven score with upstream's
pure ``score_answer``; ``binary_matrix`` (upstream ``eval``s the answer) and
``propositional_logic`` (cubic in the answer's length) score with our own
``scorers.SAFE_SCORERS``. ``tests/learner/test_tasks_presets.py`` pins that every preset
family is vetted, so a preset can never smuggle in an unvetted one.
"""

from __future__ import annotations

from node.learner.errors import TaskError

__all__ = ["PRESETS", "preset_families"]

PRESETS: dict[str, tuple[str, ...]] = {
    "sapo_paper": ("base_conversion", "basic_arithmetic", "arc_1d", "bf", "propositional_logic",
                   "fraction_simplification", "decimal_arithmetic", "calendar_arithmetic",
                   "binary_matrix"),
}
"""Preset name -> its families (drawn uniformly per question)."""


def preset_families(name: str) -> tuple[str, ...]:
    """The families of preset ``name``; ``TaskError('unknown_preset')`` if there is none."""
    try:
        return PRESETS[name]
    except KeyError:
        raise TaskError("unknown_preset",
                        f"no task preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
