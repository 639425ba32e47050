from __future__ import annotations

import logging

import pytest
import torch

from node.learner.checkpoint import load_checkpoint, save_checkpoint
from node.learner.config import PolicyConfig, TrainerConfig
from node.learner.errors import CheckpointError
from node.learner.grpo import GrpoTrainer, TrainingGroup
from node.learner.policy import load_policy


def _trained(data_dir):
    p = load_policy(PolicyConfig(device="cpu"), data_dir)
    t = GrpoTrainer(TrainerConfig(lr=1e-2), p.model, p.tokenizer)
    t.step([TrainingGroup(prompt="1+1=", completions=("2\n", "7x"), rewards=(1.0, 0.0))])
    return p, t


def _fresh(data_dir):
    p = load_policy(PolicyConfig(device="cpu"), data_dir)
    return p, GrpoTrainer(TrainerConfig(lr=1e-2), p.model, p.tokenizer)


def test_round_trip_restores_weights_optimizer_and_round(data_dir):
    p, t = _trained(data_dir)
    save_checkpoint(data_dir, round=3, fingerprint=p.fingerprint, model=p.model, optimizer=t.optimizer)
    p2, t2 = _fresh(data_dir)
    assert not torch.equal(p2.model.model.layers[0].mlp.up_proj.weight, p.model.model.layers[0].mlp.up_proj.weight)
    ck = load_checkpoint(data_dir, model=p2.model, optimizer=t2.optimizer, fingerprint=p.fingerprint)
    assert ck is not None and ck.round == 3
    for (k, a), b in zip(p.model.state_dict().items(), p2.model.state_dict().values()):
        assert torch.equal(a, b), k
    s1, s2 = t.optimizer.state_dict(), t2.optimizer.state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    assert torch.equal(s1["state"][0]["exp_avg"], s2["state"][0]["exp_avg"])


def test_no_checkpoint_returns_none(data_dir):
    p, t = _fresh(data_dir)
    assert load_checkpoint(data_dir, model=p.model, optimizer=t.optimizer, fingerprint=p.fingerprint) is None


def test_keeps_only_the_newest(data_dir):
    p, t = _trained(data_dir)
    for r in (1, 2, 3):
        save_checkpoint(data_dir, round=r, fingerprint=p.fingerprint, model=p.model,
                        optimizer=t.optimizer, keep=2)
    assert sorted(x.name for x in (data_dir / "checkpoints").iterdir()) == ["round-00000002", "round-00000003"]


def test_corrupt_newest_falls_back_to_previous(data_dir, caplog):
    p, t = _trained(data_dir)
    save_checkpoint(data_dir, round=1, fingerprint=p.fingerprint, model=p.model, optimizer=t.optimizer)
    newest = save_checkpoint(data_dir, round=2, fingerprint=p.fingerprint, model=p.model,
                             optimizer=t.optimizer)
    blob = bytearray((newest / "model.safetensors").read_bytes())
    blob[-10] ^= 0xFF
    (newest / "model.safetensors").write_bytes(bytes(blob))
    p2, t2 = _fresh(data_dir)
    with caplog.at_level(logging.WARNING):
        ck = load_checkpoint(data_dir, model=p2.model, optimizer=t2.optimizer, fingerprint=p.fingerprint)
    assert ck is not None and ck.round == 1
    assert "model.safetensors" in caplog.text and "round-00000002" in caplog.text


def test_all_corrupt_is_a_clear_error_naming_the_file(data_dir):
    p, t = _trained(data_dir)
    only = save_checkpoint(data_dir, round=1, fingerprint=p.fingerprint, model=p.model, optimizer=t.optimizer)
    (only / "optimizer.pt").write_bytes(b"garbage")
    p2, t2 = _fresh(data_dir)
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        load_checkpoint(data_dir, model=p2.model, optimizer=t2.optimizer, fingerprint=p.fingerprint)


def test_checkpoint_of_another_model_is_refused(data_dir):
    p, t = _trained(data_dir)
    save_checkpoint(data_dir, round=1, fingerprint="other", model=p.model, optimizer=t.optimizer)
    with pytest.raises(CheckpointError, match="meta.json"):
        load_checkpoint(data_dir, model=p.model, optimizer=t.optimizer, fingerprint=p.fingerprint)
