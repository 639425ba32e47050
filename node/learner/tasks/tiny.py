"""``tiny_add``: single-operation arithmetic a ~1M-parameter model can learn from scratch.

Prompt ``"3+4="``, answer ``"7"``, a completion ends with ``"\\n"``. The reward is graded so
that a randomly initialised policy already sees signal (most random groups have variance):

- 0.2 when the completion starts with a number,
- up to ``closeness`` (config, default 0.5) more for how close that number is to the answer,
- 0.1 more when the number is followed directly by the end of line,
- exactly 1.0 for the right answer ended cleanly.
"""

from __future__ import annotations

import random
import re
from typing import Any

from node.learner.errors import TaskError
from node.learner.tasks.base import ConfiguredFamily, Task
from protocol import TaskSpec

__all__ = ["TinyAdd", "tiny_add_reward"]

_LEADING_INT = re.compile(r"\d{1,6}")
_DEFAULTS: dict[str, Any] = {"max_operand": 9, "closeness": 0.5}


def tiny_add_reward(completion: str, answer: int, max_answer: int, closeness: float = 0.5) -> float:
    """Graded reward of ``completion`` for the integer ``answer`` (see the module docstring)."""
    m = _LEADING_INT.match(completion)
    if m is None:
        return 0.0
    value = int(m.group())
    clean = completion == m.group() + "\n"
    if clean and value == answer:
        return 1.0
    near = max(0.0, 1.0 - abs(value - answer) / (max_answer + 1))
    return 0.2 + closeness * near + (0.1 if clean else 0.0)


class TinyAdd(ConfiguredFamily):
    """Family ``tiny_add``; config ``{"max_operand": int in [1, 999], "closeness": float in [0, 0.6]}``."""

    name = "tiny_add"

    def _config(self, config: dict[str, Any]) -> dict[str, Any]:
        unknown = set(config) - set(_DEFAULTS)
        if unknown:
            raise TaskError("bad_config", f"tiny_add: unknown config keys {sorted(unknown)}")
        merged = {**_DEFAULTS, **config}
        mo = merged["max_operand"]
        if not isinstance(mo, int) or isinstance(mo, bool) or not 1 <= mo <= 999:
            raise TaskError("bad_config", f"tiny_add: max_operand must be an int in [1, 999], got {mo!r}")
        c = merged["closeness"]
        if not isinstance(c, (int, float)) or isinstance(c, bool) or not 0 <= c <= 0.6:
            raise TaskError("bad_config", f"tiny_add: closeness must be in [0, 0.6], got {c!r}")
        return merged


    def build(self, spec: TaskSpec) -> Task:
        cfg = self._config(dict(spec.config))
        rng = random.Random(f"tiny_add:{spec.seed}:{spec.index}")
        mo = cfg["max_operand"]
        a, b = rng.randint(0, mo), rng.randint(0, mo)
        answer = a + b
        return Task(spec=spec, prompt=f"{a}+{b}=", answer=str(answer),
                    score=lambda text: tiny_add_reward(text, answer, 2 * mo, float(cfg["closeness"])))
