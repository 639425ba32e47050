"""A model that fits (node/learner/fit.py): ``--model auto``'s table on simulated devices, the
check of a model's training step against the device's memory, and the refusal's advice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from node.learner.config import LearnerConfig, PolicyConfig, TrainerConfig
from node.learner.errors import ModelDoesNotFit
from node.learner.fit import (EMBEDDED_SHAPE, GIB, MODEL_TABLE, NVIDIA_NODES, DeviceMemory, cgroup_limit, check_fit,
                              choose_model, count_params, fit_model, model_config_of, probe_device)
from node.learner.shape import ModelShape

ROOT = Path(__file__).resolve().parents[2]
CONTEXT_GIB = 0.5
"""What a CUDA context takes of a GPU before training (README): a simulated card has this less
available than its total."""
QWEN_05B, QWEN_15B = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"


def gpu(total_gib: float, available_gib: float | None = None) -> DeviceMemory:
    avail = total_gib - CONTEXT_GIB if available_gib is None else available_gib
    return DeviceMemory.simulated(total_gib, available_gib=avail)


def learner(model: str = "auto", **trainer: object) -> LearnerConfig:
    return LearnerConfig(data_dir="unused", policy=PolicyConfig(model=model),
                         trainer=TrainerConfig(**trainer))  # type: ignore[arg-type]


@pytest.mark.parametrize(("total_gib", "want"), [
    (8, QWEN_05B), (16, QWEN_05B), (24, QWEN_05B), (39.9, QWEN_05B), (40, QWEN_15B), (80, QWEN_15B)])
def test_auto_picks_by_gpu_memory(total_gib: float, want: str) -> None:
    assert choose_model(gpu(total_gib)) == want


@pytest.mark.parametrize("total_gib", [2, 16, 512])
def test_auto_picks_the_embedded_model_without_a_gpu(total_gib: float) -> None:
    assert choose_model(DeviceMemory.simulated(total_gib, gpu=False)) == "embedded"
    assert choose_model(DeviceMemory(name="mps", total=int(total_gib * GIB),
                                     available=int(total_gib * GIB))) == "embedded"


@pytest.mark.parametrize("total_gib", [8, 16, 24, 40, 80])
def test_auto_choice_fits_its_gpu_with_the_default_settings(total_gib: float) -> None:
    config = fit_model(learner("auto"), device=gpu(total_gib))
    assert config.policy.model == choose_model(gpu(total_gib))
    assert config.trainer == TrainerConfig()


def test_auto_on_cpu_is_the_embedded_model_and_fits() -> None:
    config = fit_model(learner("auto"), device=DeviceMemory.simulated(4, gpu=False))
    assert config.policy.model == "embedded"


def test_table_shapes_have_qwen25_parameter_counts() -> None:
    """The table's built-in shapes are Qwen2.5's (README: 494 M and 1.54 B parameters)."""
    counts = {row.model: count_params(row.shape) for row in MODEL_TABLE}
    assert counts[QWEN_05B] == 494_032_768
    assert counts[QWEN_15B] == 1_543_714_304
    assert counts["embedded"] < 2_000_000


def _configs() -> list[object]:
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    small = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}
    return [LlamaConfig(**small), LlamaConfig(**small, attention_bias=True, mlp_bias=True),
            Qwen2Config(**small, tie_word_embeddings=True), Qwen2Config(**small, tie_word_embeddings=False),
            MistralConfig(**small, head_dim=32), GPT2Config(n_embd=64, n_layer=2, n_head=4)]


@pytest.mark.parametrize("index", range(6))
def test_parameter_count_from_the_shape_is_the_models(index: int) -> None:
    """Counted from the config (Llama, Qwen2, Mistral; GPT-2 through the meta device) as the
    trainer counts the built model."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _configs()[index]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert count_params(config) == sum(p.numel() for p in model.parameters())


def test_check_is_the_estimate_the_trainer_logs(embedded_base: Path) -> None:
    """The start-of-run check and GrpoTrainer's logged estimate are the same numbers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.learner.grpo import GrpoTrainer

    model = AutoModelForCausalLM.from_pretrained(embedded_base)
    trainer = GrpoTrainer(TrainerConfig(), model, AutoTokenizer.from_pretrained(embedded_base))
    est = check_fit("embedded", model_config_of("embedded"), count_params(model_config_of("embedded")),
                    learner("embedded"), DeviceMemory.simulated(1, gpu=False))
    assert est == trainer.memory


def _refusal(model: str, config: LearnerConfig, device: DeviceMemory) -> str:
    with pytest.raises(ModelDoesNotFit) as err:
        fit_model(replace(config, policy=replace(config.policy, model=model)), device=device)
    message = str(err.value)
    assert "\n" not in message
    return message


def _fits(model: str, config: LearnerConfig, device: DeviceMemory) -> bool:
    try:
        fit_model(replace(config, policy=replace(config.policy, model=model)), device=device)
    except ModelDoesNotFit:
        return False
    return True


def test_too_large_model_on_disk_refused_with_a_smaller_model_that_fits(tmp_path: Path) -> None:
    """A 1.5B-shaped model dir (config.json only, no weights) on a simulated 8 GiB card: its
    weights, gradients and Adam state alone exceed the card, so only a smaller model fits."""
    from transformers import Qwen2Config

    model_dir = tmp_path / "big"
    shape = MODEL_TABLE[0].shape
    Qwen2Config(**{k: v for k, v in asdict(shape).items() if k != "model_type"}
                ).save_pretrained(model_dir)
    assert model_config_of(str(model_dir)) == shape  # read as JSON: no transformers
    config, device = learner(), gpu(8)
    message = _refusal(str(model_dir), config, device)
    est = float(re.search(r"needs ([\d.]+) GiB", message).group(1))  # type: ignore[union-attr]
    assert est > 7.5
    assert f"model {str(model_dir)!r} does not fit cuda:0" in message
    assert "but 7.5 GiB of 8.0 GiB is available" in message
    assert "= weights" in message and "+ adam" in message
    assert "microbatch_tokens =" not in message  # no trainer setting alone can fit it
    assert message.endswith(f"it fits with --model {QWEN_05B}")
    assert _fits(QWEN_05B, config, device)


def test_readme_table_is_the_code_table() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index("| device | `--model auto` picks |")
    rows = text[start:text.index("\n\n", start)].splitlines()[2:]
    assert [re.findall(r"`([^`]+)`", r)[-1] for r in rows] == [row.model for row in MODEL_TABLE]
    assert "at least 40 GiB" in rows[0] and MODEL_TABLE[0].min_total_gib == 40


def test_readme_shows_the_real_refusal() -> None:
    """README's example is the line `join` prints (node.doctor's model check: the problem,
    then the fix) for this code's refusal, word for word (1.5B on a simulated 8 GiB card)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("    cannot start: model 'Qwen/Qwen2.5-1.5B-Instruct'")
    shown = " ".join(line.strip() for line in text[start:text.index("\n\n", start)].splitlines())
    with pytest.raises(ModelDoesNotFit) as err:
        fit_model(learner(QWEN_15B), device=gpu(8))
    assert shown == f"cannot start: {err.value.problem}; fix: {err.value.fix}"
    assert f"{err.value.problem}; {err.value.fix}" == str(err.value)


@pytest.mark.parametrize(("config", "available_gib", "want"), [
    (learner(kl_coef=0.1), 5.4,  # 5.9 GiB: the reference copy and 4,096-token micro-batches
     ["[learner.trainer] microbatch_tokens = 1024", "[learner.trainer] kl_coef = 0 (no reference copy)"]),
    (replace(learner(microbatch_tokens=512), policy=PolicyConfig(dtype="float32")), 8.33,  # 8.35 GiB
     ["[learner.trainer] max_completion_tokens = 128", '[learner.policy] dtype = "bfloat16"']),
])
def test_every_setting_the_refusal_names_makes_it_fit(config: LearnerConfig, available_gib: float,
                                                      want: list[str]) -> None:
    """0.5B on a card with a little too little free: each setting the refusal names, applied
    alone, fits, and a micro-batch budget or completion length twice as large does not."""
    device = gpu(8, available_gib=available_gib)
    message = _refusal(QWEN_05B, config, device)
    fixes = message.split("; it fits with ", 1)[1].split(" or ")
    assert fixes == want, message
    for fix in fixes:
        if fix == '[learner.policy] dtype = "bfloat16"':
            assert _fits(QWEN_05B, replace(config, policy=replace(config.policy, dtype="bfloat16")), device)
            continue
        m = re.fullmatch(r"\[learner\.trainer\] (\w+) = (\d+)( \(.*\))?", fix)
        assert m, fix
        key, value = m.group(1), int(m.group(2))
        fixed = replace(config, trainer=replace(config.trainer, **{key: value}))
        assert _fits(QWEN_05B, fixed, device), fix
        if key in ("microbatch_tokens", "max_completion_tokens"):  # the mildest of its kind
            doubled = replace(config, trainer=replace(config.trainer, **{key: value * 2}))
            assert not _fits(QWEN_05B, doubled, device), fix


def test_refusal_without_any_fix_says_how_much_memory_it_needs() -> None:
    message = _refusal("embedded", learner(), DeviceMemory.simulated(0.001, gpu=False))
    assert "no single setting makes it fit: use a device with at least" in message


def test_probe_sees_this_machine() -> None:
    device = probe_device(PolicyConfig(device="cpu"))
    assert device.name == "cpu" and not device.gpu
    assert 0 < device.available <= device.total


def test_a_gpu_that_is_not_there_is_a_policy_error() -> None:
    """--device cuda without CUDA: the node stops with a reason (fatal) instead of crashing."""
    import torch

    from node.learner.errors import PolicyError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(PolicyError, match="cannot use device 'cuda'"):
        probe_device(PolicyConfig(device="cuda"))


@pytest.mark.parametrize(("files", "want"), [
    ({"memory.max": "8589934592\n", "memory.current": "1073741824\n"}, (8 * GIB, GIB)),
    ({"memory.max": "max\n", "memory.current": "1073741824\n"}, None),
    ({"memory/memory.limit_in_bytes": "4294967296", "memory/memory.usage_in_bytes": "0"}, (4 * GIB, 0)),
    ({"memory/memory.limit_in_bytes": "9223372036854771712", "memory/memory.usage_in_bytes": "0"}, None),
    ({}, None)])
def test_a_containers_memory_limit_is_read(tmp_path: Path, files: dict[str, str], want: object) -> None:
    """A container's cgroup limit (v2 or v1) caps what the machine offers the learner."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_limit(str(tmp_path)) == want


def test_learner_process_refuses_a_model_that_cannot_fit_within_seconds(tmp_path: Path) -> None:
    """The real path: the learner child, on this machine's CPU, reads a config.json whose
    weights alone are far beyond any RAM (~14 B parameters of float32 embedding: 56 GB, x4 with
    gradients and Adam), emits one ``fatal`` event and exits 2 (the supervisor does not
    restart), before the data dir's lock or the swarm's socket."""
    from transformers import LlamaConfig

    model_dir = tmp_path / "huge"
    LlamaConfig(vocab_size=4_000_000, hidden_size=4096, intermediate_size=4096,
                num_hidden_layers=1, num_attention_heads=32).save_pretrained(model_dir)
    payload = {"ipc_path": str(tmp_path / "no.sock"), "rounds": 1, "data_dir": str(tmp_path / "d"),
               "learner": {"data_dir": str(tmp_path / "d"),
                           "policy": {"model": str(model_dir), "device": "cpu"}},
               "outer": {}}
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "node.learner_process", "--config-json",
                           json.dumps(payload)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.monotonic() - t
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert [e["event"] for e in events] == ["fatal"]
    error = events[0]["error"]
    assert error.startswith(f"model {str(model_dir)!r} does not fit cpu: its training step needs ")
    assert "is available; " in error
    assert not (tmp_path / "d" / "learner.lock").exists()
    assert seconds < 30, seconds  # the bound includes the child's torch import on a loaded box


def test_the_embedded_shape_is_the_embedded_model_s() -> None:
    """The table writes the embedded model's shape out (building its config needs torch)."""
    from node.learner.tiny_model import embedded_config

    assert ModelShape.from_dict(embedded_config().to_dict()) == EMBEDDED_SHAPE


FIT_CHILD = """
import json, sys
from node.learner.fit import main
code = main(["--config-json", sys.argv[1]])
print(json.dumps({"code": code, "loaded": [m for m in ("torch", "transformers", "libp2p",
                                                       "hivemind") if m in sys.modules]}))
"""


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_the_check_alone_refuses_without_importing_torch_or_transformers(
        tmp_path: Path, device: str) -> None:
    """``python -m node.learner.fit`` (what join runs before any child: node.doctor) reads a
    Llama-like config.json as JSON and the CPU's memory from /proc: no torch, no transformers,
    the imports that took the old refusal (in the learner child) past five seconds. ``auto``
    needs no torch where no NVIDIA device exists."""
    from transformers import LlamaConfig

    if device == "auto" and any(os.path.exists(p) for p in NVIDIA_NODES):
        pytest.skip("this machine may have CUDA: auto asks torch")
    model_dir = tmp_path / "huge"
    LlamaConfig(vocab_size=4_000_000, hidden_size=4096, intermediate_size=4096,
                num_hidden_layers=1, num_attention_heads=32).save_pretrained(model_dir)
    table = {"data_dir": str(tmp_path / "d"), "policy": {"model": str(model_dir), "device": device}}
    proc = subprocess.run([sys.executable, "-c", FIT_CHILD, json.dumps(table)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result, probe = (json.loads(line) for line in proc.stdout.splitlines())
    assert probe == {"code": 2, "loaded": []}
    assert result["fits"] is False
    assert result["problem"].startswith(f"model {str(model_dir)!r} does not fit cpu: its "
                                        "training step needs 553.7 GiB")
    assert result["fix"] == "it fits with --model embedded"
