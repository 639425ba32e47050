"""The hostile payloads are live: a positive control for each attack's ammunition, so a
passing attack test means the defence held, not that the attack misfired."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from protocol import Identity, open_envelope, seal
from protocol.limits import packb
from tests.adversary.payloads import (
    CODE_EXEC_FAMILIES,
    STEER_ANSWER,
    Bloated,
    bloat_junk,
    code_exec_batch,
    cpu_bomb_batch,
    steering_batch,
)

TINY = {"max_operand": 9, "closeness": 0.5}

_SCORE_RAW = """
import json, sys
import reasoning_gym
from protocol import RolloutBatch
from protocol.limits import unpackb
batch = RolloutBatch.from_wire(unpackb(sys.stdin.buffer.read()))
for r in batch.rollouts:
    ds = reasoning_gym.create_dataset(r.task.family, seed=r.task.seed, size=r.task.index + 1,
                                      **r.task.config)
    for c in r.completions:
        ds.score_answer(answer=c, entry=ds[r.task.index])
"""


@pytest.mark.slow
def test_code_exec_completions_run_when_a_raw_verifier_scores_them(tmp_path: Path) -> None:
    """Scored by ReasoningGYM's own verifiers (in a throwaway process, not the node's code),
    every family's payload creates its marker."""
    batch = code_exec_batch(str(tmp_path), model="m", round_=1, group_size=2)
    assert {r.task.family for r in batch.rollouts} == set(CODE_EXEC_FAMILIES)
    subprocess.run([sys.executable, "-c", _SCORE_RAW], input=packb(batch.to_wire()),
                   check=True, timeout=300)
    touched = {p.name.split(".")[0] for p in tmp_path.iterdir()}
    assert touched == set(CODE_EXEC_FAMILIES)


def test_steering_groups_are_valid_and_make_the_wrong_answer_the_best() -> None:
    from node.learner.tasks import build_task

    batch = steering_batch(model="m", round_=3, seed=7, group_sizes=(64, 8), task_config=TINY)
    assert [len(r.completions) for r in batch.rollouts] == [64, 8]
    for r in batch.rollouts:
        task = build_task(r.task, prompt=r.prompt)  # what a receiver regenerates
        assert task.answer != STEER_ANSWER
        rewards = [task.score(c) for c in r.completions]
        assert list(r.rewards) == rewards
        assert max(rewards) == task.score(f"{STEER_ANSWER}\n") > 0 == min(rewards)


def test_cpu_bomb_and_unknown_key_messages_fit_the_wire_limits() -> None:
    me = Identity.generate()
    bomb = cpu_bomb_batch(model="m", round_=1)
    assert len(bomb.rollouts) == 16
    assert all(r.task.config["max_n"] == 20_000_000 for r in bomb.rollouts)
    assert len({r.task.seed for r in bomb.rollouts}) == 16  # no cache hits
    open_envelope(seal(me, bomb, swarm_id="s"), swarm_id="s")
    inner = steering_batch(model="m", round_=1, seed=1, group_sizes=(8,), task_config=TINY)
    bloated = Bloated(inner, bloat_junk(63_000))
    body = packb(bloated.to_wire())
    assert len(body) <= 64 * 1024

    def count(x: object) -> int:
        return 1 + sum(map(count, x)) if isinstance(x, list) else 1
    assert 62_000 <= count(bloated.junk) <= 64_000
    seal(me, bloated, swarm_id="s")  # within the sender-side limits


@pytest.mark.slow
def test_takeover_state_hash_is_what_the_attacker_commits_to() -> None:
    from collectives.state import OuterState
    from tests.adversary.takeover import zero_state

    state = zero_state(1000, 10**6)
    again = OuterState.from_bytes(state.to_bytes(), numel=1000)
    assert again.hash() == state.hash() and again.applied == 10**6
    assert float(again.theta.abs().sum()) == 0.0
