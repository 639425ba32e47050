from __future__ import annotations

import pytest
import torch

from node.learner.config import EngineConfig, PolicyConfig
from node.learner.engine import make_engine
from node.learner.errors import EngineError, PolicyError
from node.learner.policy import compute_fingerprint, load_policy


def test_fingerprint_is_stored_and_survives_training(data_dir):
    p = load_policy(PolicyConfig(device="cpu"), data_dir)
    with torch.no_grad():
        next(p.model.parameters()).add_(1.0)
    assert compute_fingerprint(p.model) != p.fingerprint
    assert load_policy(PolicyConfig(device="cpu"), data_dir).fingerprint == p.fingerprint
    assert (data_dir / "fingerprint.json").exists()


def test_local_save_pretrained_model_loads_by_path(tmp_path, embedded_base):
    p = load_policy(PolicyConfig(model=str(embedded_base), device="cpu"), tmp_path / "n")
    assert p.source == str(embedded_base)
    assert p.tokenizer.decode(p.tokenizer.encode("12+3=", add_special_tokens=False)) == "12+3="


def test_unknown_model_is_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no 60 s of retries
    with pytest.raises(PolicyError, match="no-such-org/no-such-model"):
        load_policy(PolicyConfig(model="no-such-org/no-such-model"), tmp_path)
    with pytest.raises(PolicyError):
        load_policy(PolicyConfig(model=str(tmp_path / "missing")), tmp_path)


@pytest.fixture
def policy(data_dir):
    return load_policy(PolicyConfig(device="cpu"), data_dir)


def test_engine_samples_n_per_prompt_and_is_seeded(policy):
    eng = make_engine(EngineConfig(max_new_tokens=5, stop=()), policy.model, policy.tokenizer)
    out = eng.generate(["1+2=", "33+4="], n=3, seed=7)
    assert [len(g) for g in out] == [3, 3]
    assert all(1 <= c.token_count <= 5 for g in out for c in g)
    again = eng.generate(["1+2=", "33+4="], n=3, seed=7)
    assert [[c.text for c in g] for g in out] == [[c.text for c in g] for g in again]
    other = eng.generate(["1+2=", "33+4="], n=3, seed=8)
    assert [[c.text for c in g] for g in out] != [[c.text for c in g] for g in other]


def test_engine_cuts_at_stop_strings(policy):
    stops = ("\n", "a", "b", "c", "d", "e", "1", "2", "3")
    eng = make_engine(EngineConfig(max_new_tokens=30, stop=stops, temperature=2.0),
                      policy.model, policy.tokenizer)
    texts = [c.text for g in eng.generate(["x"], n=16, seed=1) for c in g]
    for text in texts:
        hits = [i for i, ch in enumerate(text) if ch in "\nabcde123"]
        assert not hits or hits == [len(text) - 1], text  # only as the final char
    assert any(hits_end for hits_end in (t and t[-1] in "\nabcde123" for t in texts))


def test_multi_token_stop_string(policy):
    eng = make_engine(EngineConfig(max_new_tokens=40, stop=("ab",), temperature=1.0),
                      policy.model, policy.tokenizer)
    for g in eng.generate(["q"], n=8, seed=3):
        for c in g:
            assert "ab" not in c.text[:-2]


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="backend.*'no-such-engine'"):
        EngineConfig(backend="no-such-engine")


def test_unresolved_engine_config_is_refused(policy):
    with pytest.raises(EngineError, match="not resolved"):
        make_engine(EngineConfig(), policy.model, policy.tokenizer)
