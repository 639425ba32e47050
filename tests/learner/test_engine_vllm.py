"""The vLLM backend without vLLM: selection, errors, and the weight-push call path.

vLLM needs a CUDA GPU and is not installed here, so the tests below that go past the error
messages run against ``_StandInVllm``: an INTERFACE TEST DOUBLE of the few ``vllm`` names
``vllm_engine.py`` uses (``LLM(...)``, ``LLM.apply_model``, ``LLM.generate``,
``SamplingParams``). It checks which calls the engine makes and with what; it says nothing
about vLLM itself, which these tests never run.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import random
import sys
import types

import pytest
import torch

from node.bridge import LoopbackHub
from node.learner import LearnerConfig, PolicyConfig, TaskConfig, run_learner
from node.learner.config import EngineConfig
from node.learner.engine import make_engine
from node.learner.errors import EngineError
from node.learner.loop import Learner
from protocol import Identity


def _engine_config(**kw) -> EngineConfig:
    return EngineConfig(backend="vllm", max_new_tokens=6, stop=("\n",), **kw)


def test_vllm_is_selected_by_config_and_validated():
    assert EngineConfig(backend="vllm").backend == "vllm"
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(backend="vllm", gpu_memory_utilization=1.5)
    cfg = LearnerConfig.from_dict({"data_dir": "d", "engine": {"backend": "vllm"}})
    assert cfg.engine.backend == "vllm"


@pytest.mark.skipif(any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
                    or importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_without_vllm_installed_the_error_says_how_to_get_it():
    with pytest.raises(EngineError, match=r"pip install 'swarm-node\[vllm\]'"):
        make_engine(_engine_config(), torch.nn.Linear(1, 1), None, source="x")
    assert "vllm" not in sys.modules  # nothing imported it


class _StandInVllm:
    """Interface test double of ``vllm`` (see the module docstring). Not vLLM."""

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class _Model:
        def __init__(self):
            self.weights: dict[str, torch.Tensor] = {}
            self.loads = 0

        def load_weights(self, weights):
            self.loads += 1
            for name, tensor in weights:
                self.weights[name] = tensor.detach().clone()
            return set(self.weights)

    class LLM:
        instances: list = []

        def __init__(self, **kw):
            self.kw = kw
            self.model = _StandInVllm._Model()
            self.requests: list = []
            _StandInVllm.LLM.instances.append(self)

        def apply_model(self, func):
            return [func(self.model)]

        def generate(self, prompts, params, use_tqdm=True):
            self.requests.append((list(prompts), params))
            outs = []
            for p in params:
                rng = random.Random(p.kw["seed"])
                outs.append(types.SimpleNamespace(outputs=[
                    types.SimpleNamespace(text="".join(rng.choice("abcde1") for _ in range(5)) + "\n",
                                          token_ids=[1] * 6)
                    for _ in range(p.kw["n"])]))
            return outs


@pytest.fixture
def stand_in(monkeypatch):
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.LLM = _StandInVllm.LLM
    module.SamplingParams = _StandInVllm.SamplingParams
    _StandInVllm.LLM.instances = []
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return _StandInVllm


def test_without_cuda_the_error_says_so(stand_in, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineError, match="needs a CUDA GPU"):
        make_engine(_engine_config(), torch.nn.Linear(1, 1), None, source="x")
    assert stand_in.LLM.instances == []


def _weights_match(llm, model) -> bool:
    pushed = llm.model.weights
    params = dict(model.named_parameters())
    return pushed.keys() == params.keys() and all(torch.equal(pushed[k], params[k]) for k in params)


def test_interface_generate_and_seeding(stand_in, monkeypatch, data_dir):
    """Interface test (stand-in LLM): request shape, per-prompt seeds, n per prompt."""
    from node.learner.policy import load_policy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    policy = load_policy(PolicyConfig(device="cpu"), data_dir)
    engine = make_engine(_engine_config(temperature=0.7, gpu_memory_utilization=0.3),
                         policy.model, policy.tokenizer, source=policy.source)
    (llm,) = stand_in.LLM.instances
    assert llm.kw["model"] == policy.source and llm.kw["dtype"] == "float32"
    assert llm.kw["gpu_memory_utilization"] == 0.3 and llm.kw["enable_prefix_caching"] is False
    assert _weights_match(llm, policy.model)  # pushed once when built (a resumed checkpoint)
    out = engine.generate(["ab=", "cd="], n=3, seed=11)
    assert [len(g) for g in out] == [3, 3] and all(c.token_count == 6 for g in out for c in g)
    (_, params), = llm.requests
    kws = [p.kw for p in params]
    assert all(k["n"] == 3 and k["temperature"] == 0.7 and k["max_tokens"] == 6 and
               k["stop"] == ["\n"] and k["include_stop_str_in_output"] for k in kws)
    assert kws[0]["seed"] != kws[1]["seed"]  # one seed per prompt, derived from the call's
    again = engine.generate(["ab=", "cd="], n=3, seed=11)
    assert [p.kw["seed"] for p in llm.requests[1][1]] == [k["seed"] for k in kws]
    assert [[c.text for c in g] for g in again] == [[c.text for c in g] for g in out]


def test_interface_weights_pushed_after_every_optimizer_and_outer_step(stand_in, monkeypatch, data_dir):
    """Interface test (stand-in LLM): the learner pushes the policy's weights to the engine
    after each optimizer step and each outer step, so sampling never uses stale weights."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = LearnerConfig(data_dir=str(data_dir), policy=PolicyConfig(device="cpu"), checkpoint_every=0,
                        checkpoint_every_s=0, engine=EngineConfig(backend="vllm"),
                        tasks=TaskConfig(family_config={"letter_sort": {"format_credit": 0.2}}))
    bridge = LoopbackHub().bridge(Identity.from_seed(bytes([9]) * 32))
    learner = Learner(cfg, peer_id=bridge.peer_id)
    (llm,) = stand_in.LLM.instances
    assert learner.engine_config.max_new_tokens == 6  # embedded defaults, whatever the backend
    loads = llm.model.loads
    record = learner.run_round(bridge)
    assert record is not None and record["train"]["optimizer_steps"] == 1
    assert llm.model.loads == loads + 1 and _weights_match(llm, learner.policy.model)
    learner.rescorer.close()

    seen = {}

    def outer(model, round_):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)  # an outer step that moves every weight
        seen["model"] = model
        seen["loads"] = stand_in.LLM.instances[-1].model.loads
        return None

    stand_in.LLM.instances = []
    run_learner(cfg, bridge, rounds=1, outer=outer)
    (llm2,) = stand_in.LLM.instances
    assert llm2.model.loads == seen["loads"] + 1  # one push right after the outer step
    assert _weights_match(llm2, seen["model"])    # ... of the weights the outer step left
