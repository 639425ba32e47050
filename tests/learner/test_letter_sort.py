"""The ``letter_sort`` family: 0/1 verifier, deterministic specs, bounded config."""

from __future__ import annotations

import random

import pytest

from node.learner.errors import TaskError
from node.learner.tasks import build_task, get_family
from node.learner.tasks.letter_sort import letter_sort_reward
from protocol import TaskSpec


def _spec(seed: int = 7, **config: object) -> TaskSpec:
    return TaskSpec(family="letter_sort", config={"length": 5, "letters": 26, "format_credit": 0.0,
                                                   **config}, seed=seed, index=0)


def test_spec_regenerates_identically_and_answer_is_the_sorted_prompt():
    spec = get_family("letter_sort").sample_spec(random.Random(5), {})
    a, b = build_task(spec), build_task(TaskSpec.from_wire(spec.to_wire()))
    assert a.prompt == b.prompt and a.answer == b.answer
    word = a.prompt.removesuffix("=")
    assert len(word) == 5 and a.answer == "".join(sorted(word)) and word.isalpha()
    assert build_task(_spec(seed=8)).prompt != build_task(_spec(seed=7)).prompt


def test_questions_rarely_repeat():
    fam = get_family("letter_sort")
    rng = random.Random(0)
    prompts = {build_task(fam.sample_spec(rng, {})).prompt for _ in range(2000)}
    assert len(prompts) >= 1990  # 26^5 distinct questions


def test_config_sets_length_and_alphabet():
    task = build_task(_spec(length=9, letters=3))
    word = task.prompt.removesuffix("=")
    assert len(word) == 9 and set(word) <= set("abc")


def test_verifier_right_and_wrong():
    task = build_task(_spec())
    assert task.score(task.answer) == 1.0
    assert task.score(task.answer + "\n") == 1.0
    assert task.score(task.answer[::-1] + "\n") == (1.0 if task.answer == task.answer[::-1] else 0.0)
    assert letter_sort_reward("abcde\n", "abcdf") == 0.0
    assert letter_sort_reward("abcd\n", "abcde") == 0.0            # one letter short
    assert letter_sort_reward("abcdee\n", "abcde") == 0.0          # one letter long
    assert letter_sort_reward("abcdf\n", "abcde", format_credit=0.1) == 0.1


@pytest.mark.parametrize("text", [
    "", "\n", " abcde\n", "abcde \n", "ABCDE\n", "abcde\n\n", "abcde\nx", "a b c d e",
    "abcde" * 1000, "abcd\u00e9\n", "__import__('os')\n", "abc\x00de",
])
def test_verifier_rejects_malformed_and_hostile_answers(text):
    assert letter_sort_reward(text, "abcde") == 0.0
    assert letter_sort_reward(text, "abcde", format_credit=0.2) == 0.0  # not even well-formed


@pytest.mark.parametrize("config", [
    {"length": 1}, {"length": 13}, {"length": "5"}, {"length": True}, {"length": 5.0},
    {"letters": 1}, {"letters": 27}, {"format_credit": 0.5}, {"format_credit": -0.1},
    {"format_credit": True}, {"bogus": 1},
])
def test_out_of_bounds_config_is_bad_config(config):
    with pytest.raises(TaskError) as e:
        build_task(_spec(**config))
    assert e.value.reason == "bad_config"
    with pytest.raises(TaskError):
        get_family("letter_sort").sample_spec(random.Random(0), config)
