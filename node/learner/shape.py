"""A model's shape: the values of its config.json that the fit check needs, read with neither
torch nor transformers.

``transformers.AutoConfig`` imports torch (seconds on a loaded machine, and the check must
refuse a model in well under five): for the architectures whose parameters ``fit`` counts from
the shape alone (``LLAMA_LIKE``: Llama, Mistral, Qwen2) the file is read as JSON, each key it
omits taking the default of that architecture's transformers config class (``DEFAULTS``;
tests/learner/test_shape.py compares them with the installed transformers). Other
architectures give None: their config needs transformers (``fit.model_config_of``).

Where config.json comes from: ``<model>/config.json`` for a local directory, else the Hugging
Face cache or hub (``huggingface_hub.hf_hub_download``: that one file, no weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.learner.errors import PolicyError

__all__ = ["DEFAULTS", "LLAMA_LIKE", "ModelShape", "read_shape"]

LLAMA_LIKE = {"llama": False, "mistral": False, "qwen2": True}
"""Architectures counted from the shape alone: model_type -> biases on q/k/v always."""
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "tie_word_embeddings": False},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "tie_word_embeddings": False},
}
"""Per model_type, the transformers config class's default of each key ``ModelShape`` reads
(``num_key_value_heads`` and ``head_dim`` absent: they follow the attention heads)."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the parameter count and the step estimate read of a Llama-like model's config
    (the attribute names of transformers' configs, so either serves ``memory``)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.model_type not in LLAMA_LIKE:
            raise ValueError(f"model_type must be one of {sorted(LLAMA_LIKE)}, "
                             f"got {self.model_type!r}")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelShape:
        """The shape of a config.json's values (``model_type`` one of ``LLAMA_LIKE``)."""
        kind = str(values.get("model_type"))
        if kind not in DEFAULTS:
            raise ValueError(f"model_type must be one of {sorted(DEFAULTS)}, got {kind!r}")
        v = {**DEFAULTS[kind], **{k: x for k, x in values.items() if x is not None}}
        heads = int(v["num_attention_heads"])
        return cls(model_type=kind, vocab_size=int(v["vocab_size"]),
                   hidden_size=int(v["hidden_size"]),
                   intermediate_size=int(v["intermediate_size"]),
                   num_hidden_layers=int(v["num_hidden_layers"]), num_attention_heads=heads,
                   num_key_value_heads=int(v.get("num_key_value_heads") or heads),
                   head_dim=int(v.get("head_dim") or int(v["hidden_size"]) // heads),
                   tie_word_embeddings=bool(v["tie_word_embeddings"]),
                   attention_bias=bool(v.get("attention_bias", False)),
                   mlp_bias=bool(v.get("mlp_bias", False)))


def read_shape(model: str) -> ModelShape | None:
    """The shape in ``model``'s config.json (a local directory, else a hub id), or None when
    its architecture is not ``LLAMA_LIKE``; ``PolicyError`` when the file cannot be had or
    read."""
    path = Path(model).expanduser()
    try:
        if path.is_dir():
            file = path / "config.json"
        else:
            from huggingface_hub import hf_hub_download

            file = Path(hf_hub_download(model, "config.json"))
        values = json.loads(file.read_text())
    except Exception as e:  # noqa: BLE001 - OSError, JSON, and the hub's many error types
        raise PolicyError(f"cannot load model {model!r}: its config is unreadable: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    if not isinstance(values, dict) or values.get("model_type") not in LLAMA_LIKE:
        return None
    try:
        return ModelShape.from_dict(values)
    except (ValueError, TypeError, KeyError) as e:
        raise PolicyError(f"cannot load model {model!r}: its config.json is invalid: {e}") from e
