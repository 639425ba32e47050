"""What the hostile peers send: valid-looking RolloutBatches crafted for one attack each.

Pure construction (protocol messages, reasoning_gym for prompts, the project's own
``tiny_add`` task); no network. ``hostile.py`` seals and publishes them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from protocol import Rollout, RolloutBatch, TaskSpec

__all__ = ["Bloated", "CODE_EXEC_FAMILIES", "STEER_ANSWER", "bloat_junk", "cpu_bomb_batch",
           "code_exec_batch", "steering_batch"]

CODE_EXEC_FAMILIES = ("spiral_matrix", "string_insertion", "binary_matrix", "n_queens",
                      "countdown", "puzzle24", "polynomial_multiplication")
"""ReasoningGYM families whose verifiers run ``eval`` (the first four) or sympy's
``parse_expr`` (the last three) on the answer text."""
STEER_ANSWER = "9999"
"""The wrong answer the steering attack pushes (tiny_add reward 0.3 for ``"9999\\n"``)."""
_ids = itertools.count(1)


def _payload(marker: str) -> str:
    """Python that creates ``marker`` when evaluated (by eval or by sympy's parse_expr)."""
    return f"__import__('pathlib').Path({marker!r}).touch()"


def _rgym_prompt(family: str, config: dict[str, Any], seed: int, index: int) -> str:
    """The prompt a receiver regenerates for this spec (the wire format of node/learner)."""
    import reasoning_gym

    ds = reasoning_gym.create_dataset(family, seed=seed, size=index + 1, **config)
    return f"{ds[index]['question']}\nAnswer: "


def code_exec_batch(marker_dir: str, *, model: str, round_: int, group_size: int = 8
                    ) -> RolloutBatch:
    """One rollout per family in CODE_EXEC_FAMILIES with the right prompt (so it reaches the
    verifier) and completions that each touch ``<marker_dir>/<family>.<n>`` when evaluated."""
    rollouts = []
    for family in CODE_EXEC_FAMILIES:
        seed = 1000 + round_
        prompt = _rgym_prompt(family, {}, seed, 0)
        completions = tuple(_payload(f"{marker_dir}/{family}.{next(_ids)}")
                            for _ in range(group_size))
        rollouts.append(Rollout(task=TaskSpec(family=family, config={}, seed=seed, index=0),
                                prompt=prompt, completions=completions,
                                rewards=(1.0,) + (0.0,) * (group_size - 1)))
    return RolloutBatch(model=model, round=round_, rollouts=tuple(rollouts))


def steering_batch(*, model: str, round_: int, seed: int, group_sizes: tuple[int, ...],
                   task_config: dict[str, Any], answer: str = STEER_ANSWER) -> RolloutBatch:
    """Valid ``tiny_add`` groups, honestly scored, in which ``answer`` (``"9999\\n"``: reward
    0.3) is the best completion: half of each group says it, the other half is unparsable
    (reward 0). A sender choosing sizes and companions so decides the advantages."""
    from node.learner.tasks.tiny import TinyAdd

    family = TinyAdd()
    rollouts = []
    for i, size in enumerate(group_sizes):
        spec = TaskSpec(family=family.name, config=dict(task_config), seed=seed + i, index=0)
        task = family.build(spec)
        half = size // 2
        completions = (f"{answer}\n",) * half + ("?\n",) * (size - half)
        rollouts.append(Rollout(task=spec, prompt=task.prompt, completions=completions,
                                rewards=tuple(task.score(c) for c in completions)))
    return RolloutBatch(model=model, round=round_, rollouts=tuple(rollouts))


def cpu_bomb_batch(*, model: str, round_: int, specs: int = 16, max_n: int = 20_000_000
                   ) -> RolloutBatch:
    """``count_primes`` specs whose config makes a receiver sieve up to ``max_n`` (a list of
    ``max_n`` Python bools per seed: ~160 MB and seconds of CPU each), with wrong prompts so
    that nothing is ever learned from them. Every spec has a fresh seed (no cache hit)."""
    base = next(_ids) * 1000
    rollouts = tuple(
        Rollout(task=TaskSpec(family="count_primes", config={"max_n": max_n, "min_n": 1},
                              seed=base + i, index=0),
                prompt="not the regenerated question", completions=("1", "2"))
        for i in range(specs))
    return RolloutBatch(model=model, round=round_, rollouts=rollouts)


def bloat_junk(objects: int = 63_000) -> list[list[list[int]]]:
    """About ``objects`` msgpack objects at one byte each, inside the decoder's limits (lists
    of at most 1024 items, depth 8) and a 64 KiB body: fixarrays of 15 small ints, 15 of
    them per middle list (241 objects in 241 bytes), as many middles as fit the count."""
    leaf = [0] * 15
    middle = [leaf] * 15
    return [middle] * max(1, (objects - 1) // 241)


@dataclass(frozen=True)
class Bloated:
    """A message whose wire form carries ``junk`` under a key no receiver knows.

    ``protocol.seal`` only needs ``TYPE`` and ``to_wire()``; the rest of the body is the
    valid ``inner`` message, so a receiver that ignores unknown keys accepts it."""

    inner: RolloutBatch
    junk: Any
    key: str = "zz"

    @property
    def TYPE(self) -> str:  # noqa: N802 - the Message protocol's name
        return self.inner.TYPE

    def to_wire(self) -> dict[str, Any]:
        return {**self.inner.to_wire(), self.key: self.junk}
