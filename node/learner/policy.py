"""Load the policy (any HF causal LM, or the embedded default) and fingerprint its base weights.

The fingerprint is a hash of the architecture config and the *base* weights, computed once
when the base model is first materialised and stored in ``<data_dir>/fingerprint.json``, so it
is stable across restarts (training does not change it) and equal on every peer that starts
from the same base.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.learner.config import PolicyConfig
from node.learner.errors import PolicyError
from node.learner.tiny_model import ensure_embedded
from protocol import atomic_write_bytes

__all__ = ["Policy", "compute_fingerprint", "load_policy", "prepare_tokenizer", "resolve_device",
           "resolve_dtype"]

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Policy:
    """A loaded model, its tokenizer and the fingerprint of its base weights."""

    model: Any
    tokenizer: Any
    fingerprint: str
    source: str


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda if available, else mps, else cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` → bfloat16 on a CUDA device that supports it, else float32."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return _DTYPES[name]


def compute_fingerprint(model: Any) -> str:
    """sha256 over the canonical config JSON and every parameter (name, dtype, shape, bytes)."""
    h = hashlib.sha256()
    cfg = model.config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        cfg.pop(volatile, None)
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:40]


def load_policy(config: PolicyConfig, data_dir: str | Path) -> Policy:
    """Load the base model and tokenizer; fingerprint them (once per data dir)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    data = Path(data_dir)
    source = str(ensure_embedded(data / "base")) if config.model == "embedded" else config.model
    device = resolve_device(config.device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_dtype(config.dtype, device))
    except (OSError, ValueError) as e:
        raise PolicyError(f"cannot load model {config.model!r}: {e}") from e
    prepare_tokenizer(tokenizer)
    fingerprint = _stored_fingerprint(data, config.model, model)
    model.to(device)
    log.info("policy %s loaded on %s as %s (fingerprint %s, %d params)", config.model, device,
             model.dtype, fingerprint[:12], sum(p.numel() for p in model.parameters()))
    return Policy(model=model, tokenizer=tokenizer, fingerprint=fingerprint, source=source)


def prepare_tokenizer(tokenizer: Any) -> None:
    """What generation and training need of any tokenizer: a pad token (the end-of-sequence
    one if it has none) and padding on the left."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"


def _stored_fingerprint(data: Path, model_name: str, model: Any) -> str:
    path = data / "fingerprint.json"
    if path.exists():
        try:
            stored = json.loads(path.read_text())
            if stored.get("model") == model_name and isinstance(stored.get("fingerprint"), str):
                return str(stored["fingerprint"])
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable %s: %s", path, e)
    fingerprint = compute_fingerprint(model)
    atomic_write_bytes(path, json.dumps({"model": model_name, "fingerprint": fingerprint}).encode())
    return fingerprint
