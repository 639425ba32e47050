"""Our own scorers for ReasoningGYM families whose upstream verifier is unsafe or too costly.

Each scorer has the signature ``score(answer, entry) -> float`` of ``score_answer``.

- ``binary_matrix``: upstream ``eval``s the answer. Ours gives the same rewards on every
  answer upstream accepts without evaluating code, parsing the text with a charset check and
  ``json.loads`` (no evaluation of any kind).
- ``propositional_logic``: upstream's own string parser and truth table are pure but cost
  about cubic in the answer's length (a 256-char chain of negations: 0.34 s; 3,000 chars:
  26 s). Ours scores answers longer than ``MAX_FORMULA_CHARS`` 0.0 and others as upstream.

``SAFE_SCORERS`` maps a family name to a factory ``dataset -> scorer``; ``rgym`` uses it
instead of the dataset's ``score_answer``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

__all__ = ["MAX_FORMULA_CHARS", "SAFE_SCORERS", "binary_matrix_score"]

Scorer = Callable[[Any, dict[str, Any]], float]
MAX_FORMULA_CHARS = 160
"""Longest propositional_logic answer scored (the dataset's conclusions are < 60 chars)."""

_MATRIX_LITERAL = re.compile(r"[\[\]\d,\s-]{2,65536}")
"""A Python/JSON list literal of integers: brackets, digits, commas, minus, whitespace only."""


def _matrix_to_str(matrix: list[list[int]]) -> str:
    return "\n".join(" ".join(str(x) for x in row) for row in matrix)


def binary_matrix_score(answer: str | None, entry: dict[str, Any]) -> float:
    """``binary_matrix``: 1.0 for the exact matrix text; 0.1 for the same matrix written as a
    list of lists of integers (upstream ``eval``s that; we read it with a charset check and
    ``json.loads``); else 0.0."""
    oracle = entry["answer"]
    if answer is None:
        return 0.0
    if answer == oracle:
        return 1.0
    if _MATRIX_LITERAL.fullmatch(answer) is None:
        return 0.0
    try:
        matrix = json.loads(answer)  # charset admits only nested lists of ints; ints <= 4300 digits
    except ValueError:
        return 0.0
    if not (isinstance(matrix, list)
            and all(isinstance(row, list) and all(type(x) is int for x in row) for row in matrix)):
        return 0.0
    return 0.1 if _matrix_to_str(matrix) == oracle else 0.0


def _length_capped(score_answer: Scorer, max_chars: int) -> Scorer:
    def score(answer: Any, entry: dict[str, Any]) -> float:
        if not isinstance(answer, str) or len(answer) > max_chars:
            return 0.0
        return float(score_answer(answer, entry))

    return score


SAFE_SCORERS: dict[str, Callable[[Any], Scorer]] = {
    "binary_matrix": lambda dataset: binary_matrix_score,
    "propositional_logic": lambda dataset: _length_capped(dataset.score_answer, MAX_FORMULA_CHARS),
}
