from __future__ import annotations

import random

import pytest

from node.learner.errors import TaskError
from node.learner.tasks import build_task, get_family
from node.learner.tasks.tiny import tiny_add_reward
from protocol import TaskSpec


def test_tiny_add_regenerates_identically_from_spec():
    spec = get_family("tiny_add").sample_spec(random.Random(5), {"max_operand": 20})
    a, b = build_task(spec), build_task(TaskSpec.from_wire(spec.to_wire()))
    assert a.prompt == b.prompt and a.answer == b.answer
    x, y = a.prompt.rstrip("=").split("+")
    assert int(a.answer) == int(x) + int(y) and max(int(x), int(y)) <= 20


def test_tiny_add_reward_is_graded():
    assert tiny_add_reward("7\n", 7, 18) == 1.0
    assert tiny_add_reward("7", 7, 18) < 1.0            # not terminated
    assert tiny_add_reward("8\n", 7, 18) > tiny_add_reward("15\n", 7, 18) > 0.2
    assert tiny_add_reward("x7\n", 7, 18) == 0.0
    assert tiny_add_reward("", 7, 18) == 0.0


def test_reasoning_gym_family_regenerates_and_verifies():
    fam = get_family("basic_arithmetic")
    spec = fam.sample_spec(random.Random(1), {"max_terms": 2, "max_digits": 1})
    task = build_task(spec)
    assert build_task(spec).prompt == task.prompt
    assert task.score(task.answer) == 1.0
    assert task.score("not a number") == 0.0


@pytest.mark.parametrize("spec,reason", [
    (TaskSpec(family="no_such_family", config={}, seed=1, index=0), "unknown_family"),
    (TaskSpec(family="tiny_add", config={"max_operand": -3}, seed=1, index=0), "bad_config"),
    (TaskSpec(family="tiny_add", config={"bogus": 1}, seed=1, index=0), "bad_config"),
    (TaskSpec(family="basic_arithmetic", config={"min_terms": 9, "max_terms": 2}, seed=1, index=0),
     "bad_config"),
    (TaskSpec(family="basic_arithmetic", config={}, seed=1, index=10**9), "bad_config"),
])
def test_bad_specs_are_rejected_with_a_reason(spec, reason):
    with pytest.raises(TaskError) as e:
        build_task(spec)
    assert e.value.reason == reason


def test_prompt_mismatch_is_rejected():
    spec = TaskSpec(family="tiny_add", config={"max_operand": 9, "closeness": 0.5}, seed=3, index=0)
    with pytest.raises(TaskError) as e:
        build_task(spec, prompt=build_task(spec).prompt + " ")
    assert e.value.reason == "prompt_mismatch"
