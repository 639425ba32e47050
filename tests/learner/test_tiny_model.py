"""The embedded model starts from the shipped weights, the same bytes on every machine.

The weights file is pinned here by its SHA-256 and the node's fingerprint of the loaded model
by its value: a change to either is a change of the swarm's base model, made on purpose
(``node.learner.warm_start`` says how). Weights that are not the pinned bytes are refused,
whether the package's file or a data dir's copy.
"""

from __future__ import annotations

import hashlib
import re
import shutil

import pytest
import torch
from safetensors import safe_open

from node.learner import tiny_model
from node.learner.config import PolicyConfig
from node.learner.errors import EmbeddedWeightsMismatch, PolicyError
from node.learner.policy import load_policy
from node.learner.tiny_model import (EMBEDDED_SHA256, WEIGHTS_FILE, embedded_config,
                                     ensure_embedded, shipped_weights_path)

PINNED_SHA256 = "854ba249e202cd4e38d4e900d18689b485667b484f9fe6ee4feb4e8c9fd17da1"
PINNED_FINGERPRINT = "1a5c4d35068be423fb9ea0698d4b0f45031f6331"
"""The fingerprint (node.learner.policy) of the embedded model loaded in float32: its config as
transformers 5.23.0 writes it and the pinned weights. Same on every machine and torch build."""


def test_the_shipped_weights_are_the_pinned_bytes_in_the_embedded_shape():
    path = shipped_weights_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == PINNED_SHA256 == EMBEDDED_SHA256
    assert path.stat().st_size < 4 * 2**20
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in
                  LlamaForCausalLM(embedded_config()).state_dict().items()}
    shapes.pop("lm_head.weight")  # tied to the embedding: save_pretrained stores it once
    with safe_open(str(path), framework="pt") as f:
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == shapes
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


def test_every_data_dir_starts_from_the_pinned_model(tmp_path, data_dir):
    fresh = ensure_embedded(tmp_path / "fresh" / "base")
    assert (fresh / WEIGHTS_FILE).read_bytes() == shipped_weights_path().read_bytes()
    assert not [p for p in (tmp_path / "fresh").iterdir() if p.name != "base"]  # no temp dir left
    assert ensure_embedded(fresh) == fresh  # already there: checked, kept
    a = load_policy(PolicyConfig(device="cpu"), data_dir)
    b = load_policy(PolicyConfig(device="cpu"), tmp_path / "fresh")
    assert a.fingerprint == b.fingerprint == PINNED_FINGERPRINT
    assert 1e6 / 2 < sum(p.numel() for p in a.model.parameters()) < 10e6


def test_corrupted_shipped_weights_are_refused_naming_the_expected_hash(tmp_path, monkeypatch):
    bad = tmp_path / "tiny_model.safetensors"
    data = bytearray(shipped_weights_path().read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(tiny_model, "shipped_weights_path", lambda: bad)
    with pytest.raises(EmbeddedWeightsMismatch, match=f"{re.escape(str(bad))} .*expected {PINNED_SHA256}"):
        ensure_embedded(tmp_path / "node" / "base")
    assert not (tmp_path / "node").exists()  # checked before anything is written
    bad.unlink()
    with pytest.raises(PolicyError, match=f"unreadable.*expected sha256 {PINNED_SHA256}"):
        load_policy(PolicyConfig(device="cpu"), tmp_path / "node")


def test_a_data_dir_with_other_base_weights_is_refused_and_told_how_to_start_over(data_dir):
    weights = data_dir / "base" / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # say, an older warm start
    with pytest.raises(EmbeddedWeightsMismatch, match=f"expected {PINNED_SHA256}.*delete") as e:
        load_policy(PolicyConfig(device="cpu"), data_dir)
    assert str(data_dir / "fingerprint.json") in str(e.value)
    shutil.rmtree(data_dir / "base")  # as the message says (no fingerprint.json yet here)
    assert load_policy(PolicyConfig(device="cpu"), data_dir).fingerprint == PINNED_FINGERPRINT
