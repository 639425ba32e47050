"""Per-model defaults: prompt formats, engine defaults, answer extraction, the task preset."""

from __future__ import annotations

import random
import types

import pytest

from node.config import ConfigError, NodeConfig
from node.learner.config import EngineConfig, LearnerConfig, TaskConfig
from node.learner.prompting import (CHAT_MAX_NEW_TOKENS, EMBEDDED_MAX_NEW_TOKENS, SYSTEM_PROMPT,
                                    ChatFormat, RawFormat, make_prompt_format, resolve_engine)
from node.learner.tasks import build_task, get_family
from node.learner.tasks.answer import extract_answer
from node.learner.tasks.presets import PRESETS
from node.learner.tasks.rgym import VETTED


def test_system_prompt_is_reasoning_gyms_default():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    assert SYSTEM_PROMPT == SYSTEM_PROMPTS["default"]


def test_extraction_matches_reasoning_gym_and_is_linear():
    from reasoning_gym.utils import extract_answer as upstream

    rng = random.Random(0)
    parts = ["<answer>", "</answer>", " ", "x", "7", "\n", "<answer", "answer>", "</"]
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(14)))
        assert extract_answer(text) == upstream(text), text
    hostile = "<answer>" * 200_000  # quadratic for a backtracking regex; str.find is linear
    assert extract_answer(hostile) is None
    assert extract_answer("<answer>" * 50_000 + "</answer>") == "<answer>" * 49_999


def _model(ctx: int = 32768) -> types.SimpleNamespace:
    return types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=ctx))


def test_engine_defaults_are_sized_for_the_model_and_overrides_win():
    chat = types.SimpleNamespace(name="chat")
    r = resolve_engine(EngineConfig(), model=_model(), embedded=False, prompt_format=chat)
    assert (r.max_new_tokens, r.stop) == (CHAT_MAX_NEW_TOKENS, ())
    r = resolve_engine(EngineConfig(), model=_model(512), embedded=True, prompt_format=RawFormat())
    assert (r.max_new_tokens, r.stop) == (EMBEDDED_MAX_NEW_TOKENS, ("\n",))
    r = resolve_engine(EngineConfig(), model=_model(128), embedded=False, prompt_format=RawFormat())
    assert r.max_new_tokens == 64  # half of a short context stays for the prompt
    r = resolve_engine(EngineConfig(), model=_model(), embedded=False, prompt_format=chat,
                       completion_cap=100)
    assert r.max_new_tokens == 100  # never longer than the trainer (and receivers) take
    r = resolve_engine(EngineConfig(max_new_tokens=40, stop=("END",)), model=_model(),
                       embedded=False, prompt_format=chat)
    assert (r.max_new_tokens, r.stop) == (40, ("END",))
    cfg = LearnerConfig.from_dict({"data_dir": "d", "engine": {"max_new_tokens": 512, "stop": []}})
    assert cfg.engine.max_new_tokens == 512 and cfg.engine.stop == ()


def test_prompt_format_auto_picks_chat_only_with_a_template():
    with_template = types.SimpleNamespace(chat_template="{{ x }}")
    without = types.SimpleNamespace(chat_template=None)
    assert isinstance(make_prompt_format("auto", with_template), ChatFormat)
    assert isinstance(make_prompt_format("auto", without), RawFormat)
    assert isinstance(make_prompt_format("raw", with_template), RawFormat)
    with pytest.raises(ValueError, match="chat template"):
        make_prompt_format("chat", without)
    with pytest.raises(ValueError, match="prompt_format"):
        EngineConfig(prompt_format="fancy")


def test_sapo_paper_preset_is_the_papers_nine_vetted_families():
    assert set(PRESETS["sapo_paper"]) == {
        "base_conversion", "basic_arithmetic", "arc_1d", "bf", "propositional_logic",
        "fraction_simplification", "decimal_arithmetic", "calendar_arithmetic", "binary_matrix"}
    for families in PRESETS.values():
        assert set(families) <= set(VETTED)  # a preset never brings in an unvetted family
    cfg = TaskConfig(preset="sapo_paper")
    assert cfg.families == PRESETS["sapo_paper"]
    assert LearnerConfig.from_dict(LearnerConfig(data_dir="d", tasks=cfg).to_dict()).tasks == cfg
    with pytest.raises(ValueError, match="unknown_preset"):
        TaskConfig(preset="nope")
    with pytest.raises(ValueError, match="sets the families"):
        TaskConfig(preset="sapo_paper", families=("tiny_add",))
    with pytest.raises(ConfigError, match="preset"):
        NodeConfig(learner={"tasks": {"preset": "nope"}})


def test_every_preset_family_builds_and_accepts_its_own_answer_tagged_or_raw():
    rng = random.Random(3)
    for family in PRESETS["sapo_paper"]:
        task = build_task(get_family(family).sample_spec(rng, {}))
        assert task.prompt.endswith("\nAnswer: ")
        if family == "propositional_logic":  # no single answer: any valid conclusion scores
            assert 0.0 <= task.score("<answer>P</answer>") <= 1.0
            continue
        assert task.score(f"<answer>{task.answer}</answer>") == 1.0, family
        assert task.score(f"Reasoning first.\n<answer>\n{task.answer}\n</answer>") == 1.0, family
        assert task.score(task.answer) == 1.0, family
        assert task.score("<answer></answer>") < 1.0, family
