"""``letter_sort``: sort a random string of letters, scored 0/1 for correctness.

Prompt ``"qdkaq="``, answer ``"adkqq"`` (the letters in alphabetical order, repeats kept). A
completion earns 1.0 only when its whole text is the answer, optionally ended by ``"\\n"``
(the stop string); any other string of the alphabet's letters earns ``format_credit``
(config, default 0: the SAPO paper gives no format reward), anything else 0. So a group of
completions carries GRPO signal only when some are right and some are not, which at low
accuracy is rare: the regime in which shared groups that survive the zero-advantage filter pay.

With the defaults (``length = 5`` over 26 letters) there are 26^5 ≈ 1.2·10^7 distinct
questions, so nodes rarely see the same one. The verifier is a bounded string comparison.
"""

from __future__ import annotations

import random
import string
from typing import Any

from node.learner.errors import TaskError
from node.learner.tasks.base import ConfiguredFamily, Task
from protocol import TaskSpec

__all__ = ["LetterSort", "letter_sort_reward", "sort_question"]

_DEFAULTS: dict[str, Any] = {"length": 5, "letters": 26, "format_credit": 0.0}
_MAX_LENGTH = 12
_MAX_FORMAT_CREDIT = 0.2


def sort_question(rng: random.Random, length: int, letters: int = 26) -> tuple[str, str]:
    """(prompt, answer) for a string of ``length`` letters drawn from the first ``letters``
    (shared with the embedded model's warm start)."""
    alphabet = string.ascii_lowercase[:letters]
    word = "".join(rng.choice(alphabet) for _ in range(length))
    return f"{word}=", "".join(sorted(word))


def letter_sort_reward(completion: str, answer: str, letters: int = 26,
                       format_credit: float = 0.0) -> float:
    """1.0 for ``answer`` or ``answer + "\\n"``; ``format_credit`` for another non-empty
    string of the alphabet's letters (optionally newline-ended); else 0.0."""
    if not isinstance(completion, str) or len(completion) > _MAX_LENGTH + 1:
        return 0.0
    text = completion[:-1] if completion.endswith("\n") else completion
    if text == answer:
        return 1.0
    alphabet = string.ascii_lowercase[:letters]
    return float(format_credit) if text and all(c in alphabet for c in text) else 0.0


def _int_in(cfg: dict[str, Any], key: str, lo: int, hi: int) -> None:
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise TaskError("bad_config", f"letter_sort: {key} must be an int in [{lo}, {hi}], got {v!r}")


class LetterSort(ConfiguredFamily):
    """Family ``letter_sort``; config ``{"length": int in [2, 12], "letters": int in [2, 26],
    "format_credit": float in [0, 0.2]}``."""

    name = "letter_sort"

    def _config(self, config: dict[str, Any]) -> dict[str, Any]:
        unknown = set(config) - set(_DEFAULTS)
        if unknown:
            raise TaskError("bad_config", f"letter_sort: unknown config keys {sorted(unknown)}")
        merged = {**_DEFAULTS, **config}
        _int_in(merged, "length", 2, _MAX_LENGTH)
        _int_in(merged, "letters", 2, 26)
        c = merged["format_credit"]
        if (not isinstance(c, (int, float)) or isinstance(c, bool)
                or not 0 <= c <= _MAX_FORMAT_CREDIT):
            raise TaskError("bad_config",
                            f"letter_sort: format_credit must be in [0, {_MAX_FORMAT_CREDIT}], got {c!r}")
        merged["format_credit"] = float(c)  # one wire form: receivers compare configs exactly
        return merged


    def build(self, spec: TaskSpec) -> Task:
        cfg = self._config(dict(spec.config))
        prompt, answer = sort_question(random.Random(f"letter_sort:{spec.seed}:{spec.index}"),
                                       cfg["length"], cfg["letters"])
        letters, credit = cfg["letters"], float(cfg["format_credit"])
        return Task(spec=spec, prompt=prompt, answer=answer,
                    score=lambda text: letter_sort_reward(text, answer, letters, credit))
