"""A model's shape read from config.json without transformers (node/learner/shape.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from node.learner.errors import PolicyError
from node.learner.fit import count_params
from node.learner.shape import DEFAULTS, LLAMA_LIKE, ModelShape, read_shape

KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
        "attention_bias", "mlp_bias")


def _config_class(model_type: str):  # type: ignore[no-untyped-def]
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))


@pytest.mark.parametrize("model_type", sorted(LLAMA_LIKE))
def test_an_empty_config_json_reads_as_transformers_defaults(model_type: str) -> None:
    """DEFAULTS are the installed transformers' class defaults, the keys that follow others
    (kv heads, head_dim) included."""
    ours = asdict(ModelShape.from_dict({"model_type": model_type}))
    theirs = _config_class(model_type)()
    want = {k: getattr(theirs, k, False) for k in KEYS}
    want["head_dim"] = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert {k: ours[k] for k in KEYS} == want
    assert set(DEFAULTS[model_type]) <= set(KEYS)


@pytest.mark.parametrize("model_type", sorted(LLAMA_LIKE))
def test_a_saved_config_reads_as_transformers_reads_it(tmp_path: Path, model_type: str) -> None:
    """What save_pretrained writes (it leaves out some defaults) counts the same parameters
    read as JSON as through transformers."""
    config = _config_class(model_type)(vocab_size=1000, hidden_size=64, intermediate_size=96,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, tie_word_embeddings=True)
    config.save_pretrained(tmp_path)
    shape = read_shape(str(tmp_path))
    assert shape is not None and shape.model_type == model_type
    assert count_params(shape) == count_params(config)


def test_other_architectures_and_bad_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64}))
    assert read_shape(str(tmp_path)) is None  # transformers reads it (fit.model_config_of)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PolicyError, match="its config is unreadable"):
        read_shape(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 0}))
    with pytest.raises(PolicyError, match="hidden_size must be >= 1, got 0"):
        read_shape(str(tmp_path))
