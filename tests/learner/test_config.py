from __future__ import annotations

import json

import pytest

from node.learner import EngineConfig, LearnerConfig, SapoConfig, TaskConfig, TrainerConfig


def test_round_trip_through_json():
    cfg = LearnerConfig(data_dir="/tmp/x", seed=3, engine=EngineConfig(stop=("\n", "END")),
                        tasks=TaskConfig(families=("tiny_add", "basic_arithmetic"),
                                         family_config={"tiny_add": {"max_operand": 5}}),
                        sapo=SapoConfig(external=2))
    again = LearnerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize("build", [
    lambda: SapoConfig(external=9),
    lambda: SapoConfig(completions_per_question=1),
    lambda: TrainerConfig(lr=0),
    lambda: TrainerConfig(clip_low=1.0),
    lambda: TrainerConfig(external_correction="clamp"),
    lambda: TrainerConfig(external_surprise_bound=-0.5),
    lambda: TrainerConfig(external_surprise_bound=float("inf")),
    lambda: TrainerConfig(external_surprise_bound=float("nan")),
    lambda: EngineConfig(top_p=1.5),
    lambda: EngineConfig(stop=("",)),
    lambda: TaskConfig(families=()),
    lambda: LearnerConfig(data_dir=""),
])
def test_invalid_values_raise_value_error(build):
    with pytest.raises(ValueError):
        build()


def test_unknown_keys_are_rejected():
    with pytest.raises(ValueError, match="trainer.learning_rate: unknown key"):
        LearnerConfig.from_dict({"data_dir": "/tmp/x", "trainer": {"learning_rate": 1}})


def test_public_surface_is_listed_and_importable():
    import node.learner as pkg

    assert {"run_learner", "LearnerConfig", "TaskError"} <= set(pkg.__all__)
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
