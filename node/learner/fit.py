"""A model that fits: ``--model auto``'s table, and the check a learner runs on its model
before it loads any weights.

    --model auto  ── DeviceMemory (kind, total) ── MODEL_TABLE ──▶ a model id
    any model     ── its config.json (shape.py; no torch for Llama-like models) + parameter
                     count (from the shape, else on torch's meta device; no weights)
                  ── memory.estimate_step_memory with [learner.trainer] ──▶ fits the
                     device's available memory, or ModelDoesNotFit: one line with the
                     estimate, the memory available and the settings that would fit

The table (RL Swarm's rule; first row that matches):

    ====================================  ==============================
    device                                model
    ====================================  ==============================
    CUDA GPU with >= 40 GiB of memory     ``Qwen/Qwen2.5-1.5B-Instruct``
    any other CUDA GPU                    ``Qwen/Qwen2.5-0.5B-Instruct``
    no CUDA GPU (CPU only, Apple MPS)     ``embedded`` (tiny built-in)
    ====================================  ==============================

*Available* memory is what a training step may take: on CUDA the free memory torch sees on
the device once its context exists (other processes and MIG limits included), less vLLM's
``gpu_memory_utilization`` share of the total when the engine is vLLM; on CPU and MPS the
system's ``MemAvailable``, capped by a cgroup memory limit (a container's). The estimate is
the one the trainer logs at start (rows of up to ``max_completion_tokens`` +
``PROMPT_ALLOWANCE`` tokens, one micro-batch of ``microbatch_tokens``), an upper bound where
fused attention kernels keep less.

The device is a parameter (``DeviceMemory``) of the choice and of the check, so tests
simulate any size; ``probe_device`` measures the real one.

The check runs twice: in a short child before `join` starts the node (``python -m
node.learner.fit``, by ``node.doctor.check_model``: a model that cannot fit is refused in
about a second, before the swarm process or any weights), and in the learner, which trains
with the model it resolves. On a CPU (``--device cpu``, or ``auto`` on a machine with no
NVIDIA device) neither torch nor transformers is imported for a Llama-like model.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from node.learner.config import EngineConfig, LearnerConfig, PolicyConfig, TrainerConfig
from node.learner.errors import ModelDoesNotFit, PolicyError
from node.learner.memory import PROMPT_ALLOWANCE, MemoryEstimate, estimate_step_memory
from node.learner.shape import LLAMA_LIKE, ModelShape, read_shape

__all__ = ["AUTO", "EMBEDDED_SHAPE", "GIB", "MODEL_TABLE", "NVIDIA_NODES", "DeviceMemory", "TableRow",
           "cgroup_limit", "check_fit", "choose_model", "count_params", "fit_model", "main",
           "model_config_of", "probe_device"]

log = logging.getLogger(__name__)

AUTO = "auto"
"""The ``--model`` value that picks the model from ``MODEL_TABLE``."""
GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SMALLEST_MICROBATCH = 256
_SHORTEST_COMPLETION = 32


@dataclass(frozen=True, kw_only=True)
class DeviceMemory:
    """The memory of the device the learner trains on."""

    name: str
    """The torch device: ``cuda:0``, ``cpu``, ``mps``."""
    total: int
    """Bytes the device has (the GPU's memory; the machine's RAM for cpu and mps)."""
    available: int
    """Bytes a training step may take (module docstring)."""
    bfloat16: bool = False
    """Whether ``[learner.policy] dtype = "auto"`` trains in bfloat16 here (a CUDA device
    that supports it); else float32."""

    def __post_init__(self) -> None:
        if self.total < 0 or self.available < 0:
            raise ValueError(f"device memory must be >= 0, got total={self.total}, "
                             f"available={self.available}")

    @property
    def gpu(self) -> bool:
        """A CUDA GPU (MPS shares the machine's RAM and counts as no GPU in the table)."""
        return self.name.split(":")[0] == "cuda"

    @classmethod
    def simulated(cls, total_gib: float, *, gpu: bool = True,
                  available_gib: float | None = None) -> DeviceMemory:
        """A device of ``total_gib`` GiB (all of it available unless told), for tests and
        what-if questions; a simulated GPU trains in bfloat16."""
        total = int(total_gib * GIB)
        avail = total if available_gib is None else int(available_gib * GIB)
        return cls(name="cuda:0" if gpu else "cpu", total=total, available=avail, bfloat16=gpu)


def _qwen25(hidden: int, inter: int, layers: int, heads: int) -> ModelShape:
    """Qwen2.5's config.json values for this size."""
    return ModelShape(model_type="qwen2", vocab_size=151936, hidden_size=hidden,
                      intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=2, head_dim=hidden // heads, tie_word_embeddings=True)


EMBEDDED_SHAPE = ModelShape(model_type="llama", vocab_size=101, hidden_size=128,
                            intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=4, head_dim=32, tie_word_embeddings=True)
"""``tiny_model.embedded_config()``'s shape, written out: building that config builds the
embedded tokenizer (torch); tests/learner/test_fit.py checks the two agree."""


@dataclass(frozen=True, kw_only=True)
class TableRow:
    """One row of ``MODEL_TABLE``."""

    model: str
    """What ``--model auto`` becomes on a device this row matches."""
    gpu: bool
    """Matches CUDA GPUs (True) or devices without one (False)."""
    min_total_gib: float
    """Matches devices with at least this much memory (``DeviceMemory.total``)."""
    shape: ModelShape
    """The model's shape (its config.json values) without a download: the refusal message
    weighs the table's smaller models with it."""


MODEL_TABLE: tuple[TableRow, ...] = (
    TableRow(model="Qwen/Qwen2.5-1.5B-Instruct", gpu=True, min_total_gib=40,
             shape=_qwen25(1536, 8960, 28, 12)),
    TableRow(model="Qwen/Qwen2.5-0.5B-Instruct", gpu=True, min_total_gib=0,
             shape=_qwen25(896, 4864, 24, 14)),
    TableRow(model="embedded", gpu=False, min_total_gib=0, shape=EMBEDDED_SHAPE),
)
"""``--model auto``'s choices, first match wins (module docstring). README's table is this."""


def choose_model(device: DeviceMemory) -> str:
    """The model ``--model auto`` picks for ``device``: the first row of MODEL_TABLE that
    matches its kind and total memory."""
    for row in MODEL_TABLE:
        if row.gpu == device.gpu and device.total >= row.min_total_gib * GIB:
            return row.model
    raise AssertionError("MODEL_TABLE has a catch-all row for each kind")  # pragma: no cover


def model_config_of(model: str) -> Any:
    """The model's config: a table model's shape as the table knows it (no download, so the
    check also runs offline), else config.json (a local path, or the hub's file alone: no
    weights): its ``ModelShape`` for a Llama-like model, else transformers' config."""
    for row in MODEL_TABLE:
        if row.model == model:
            return row.shape
    shape = read_shape(model)
    if shape is not None:
        return shape
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise PolicyError(f"cannot load model {model!r}: its config is unreadable: {e}") from e


def count_params(model_config: Any) -> int:
    """Parameters of the model ``model_config`` (a ``ModelShape`` or a transformers config)
    describes, tied embeddings counted once (as the trainer counts them): from the shape for
    Llama, Mistral and Qwen2 (no modelling code to import: the check stays within seconds),
    else counted on torch's meta device (no memory, no weights)."""
    if isinstance(model_config, ModelShape):
        return _llama_like_params(model_config)
    if getattr(model_config, "model_type", "") in LLAMA_LIKE:
        return _llama_like_params(ModelShape.from_dict(model_config.to_dict()))
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    return sum(p.numel() for p in model.parameters())


def _llama_like_params(c: ModelShape) -> int:
    h, inter, vocab = c.hidden_size, c.intermediate_size, c.vocab_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    qkv_bias = LLAMA_LIKE[c.model_type] or c.attention_bias
    attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if qkv_bias else 0)
    if c.attention_bias and c.model_type == "llama":
        attention += h  # o_proj's bias too
    mlp = 3 * h * inter + ((2 * inter + h) if c.mlp_bias else 0)
    layer = attention + mlp + 2 * h  # two RMSNorm weights
    head = 0 if c.tie_word_embeddings else vocab * h
    return vocab * h + c.num_hidden_layers * layer + h + head


@functools.cache
def _table_params(model: str) -> int:
    return count_params(next(row for row in MODEL_TABLE if row.model == model).shape)


def _estimate(model_config: Any, n_params: int, trainer: TrainerConfig, param_bytes: int) -> MemoryEstimate:
    """The estimate the trainer logs at start (grpo.GrpoTrainer.__init__), from the config."""
    return estimate_step_memory(model_config, n_params, trainer, param_bytes=param_bytes,
                                seq_len=trainer.max_completion_tokens + PROMPT_ALLOWANCE,
                                grad_checkpointing=n_params >= trainer.grad_checkpoint_min_params)


def _param_bytes(policy: PolicyConfig, device: DeviceMemory) -> int:
    if policy.dtype == "auto":
        return 2 if device.bfloat16 else 4
    return _DTYPE_BYTES[policy.dtype]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_fit(model: str, model_config: Any, n_params: int, config: LearnerConfig,
              device: DeviceMemory) -> MemoryEstimate:
    """The training step's estimate for ``model`` on ``device``; ``ModelDoesNotFit`` (one
    line: the estimate, the memory available, the settings that would fit) if it exceeds
    ``device.available``."""
    param_bytes = _param_bytes(config.policy, device)
    trainer = config.trainer
    est = _estimate(model_config, n_params, trainer, param_bytes)
    if est.total <= device.available:
        return est
    fixes = _settings_that_fit(model, model_config, n_params, config, device, param_bytes)
    advice = (f"it fits with {' or '.join(fixes)}" if fixes else
              "no single setting makes it fit: use a device with at least "
              f"{_gib(est.total)} available, or a smaller model")
    raise ModelDoesNotFit(
        f"model {model!r} does not fit {device.name}: its training step needs {_gib(est.total)} "
        f"({est.describe()}; rows of up to {trainer.max_completion_tokens + PROMPT_ALLOWANCE} "
        f"tokens, {trainer.microbatch_tokens}-token micro-batches) but {_gib(device.available)} "
        f"of {_gib(device.total)} is available", advice)


def _settings_that_fit(model: str, model_config: Any, n_params: int, config: LearnerConfig,
                       device: DeviceMemory, param_bytes: int) -> list[str]:
    """Each single change that makes the estimate fit, the mildest of its kind."""
    trainer = config.trainer

    def fits(t: TrainerConfig, pb: int = param_bytes, cfg: Any = model_config, n: int = n_params) -> bool:
        return _estimate(cfg, n, t, pb).total <= device.available

    out: list[str] = []
    for key, floor in (("microbatch_tokens", _SMALLEST_MICROBATCH),
                       ("max_completion_tokens", _SHORTEST_COMPLETION)):
        value = getattr(trainer, key) // 2  # the largest halving that fits
        while value >= floor:
            if fits(replace(trainer, **{key: value})):
                out.append(f"[learner.trainer] {key} = {value}")
                break
            value //= 2
    if trainer.kl_coef > 0 and fits(replace(trainer, kl_coef=0.0)):
        out.append("[learner.trainer] kl_coef = 0 (no reference copy)")
    if param_bytes == 4 and device.gpu and fits(trainer, pb=2):
        out.append('[learner.policy] dtype = "bfloat16"')
    for row in MODEL_TABLE:  # largest first
        if row.model == model or row.gpu != device.gpu:
            continue
        cfg = row.shape
        n = _table_params(row.model)
        if n < n_params and fits(trainer, cfg=cfg, n=n):
            out.append(f"--model {row.model}")
            break
    return out


def probe_device(policy: PolicyConfig, engine: EngineConfig | None = None) -> DeviceMemory:
    """The memory of the device ``policy.device`` names (module docstring: what counts as
    available; ``engine`` says whether vLLM takes its share). Creates the CUDA context on a
    GPU. Imports torch only where a CUDA device may be used (module docstring)."""
    if policy.device == "cpu" or (policy.device == "auto" and not _nvidia_present()):
        total, available = _system_memory()
        return DeviceMemory(name="cpu", total=total, available=available)
    import torch

    from node.learner.policy import resolve_device

    dev = resolve_device(policy.device)
    if dev.type == "cuda":
        try:
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(index)
        except (RuntimeError, AssertionError) as e:  # torch without CUDA asserts
            raise PolicyError(f"cannot use device {policy.device!r}: {e}") from e
        vllm = (int(engine.gpu_memory_utilization * total)
                if engine is not None and engine.backend == "vllm" else 0)
        return DeviceMemory(name=f"cuda:{index}", total=total, available=max(0, free - vllm),
                            bfloat16=torch.cuda.is_bf16_supported())
    total, available = _system_memory()
    return DeviceMemory(name=dev.type, total=total, available=available)


NVIDIA_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia/gpus", "/dev/kfd")
"""Where a Linux machine shows an NVIDIA driver (or ROCm, which torch drives as CUDA);
without any of them torch sees no CUDA device."""


def _nvidia_present() -> bool:
    """Whether CUDA may be there; False only where it cannot (Linux without the NVIDIA driver:
    ``--device auto`` is the CPU there). Elsewhere (macOS: MPS) torch is asked."""
    return not sys.platform.startswith("linux") or any(os.path.exists(p) for p in NVIDIA_NODES)


def _system_memory() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes, both capped by a cgroup memory limit (a container's:
    /proc/meminfo shows the host's); physical pages where there is no /proc/meminfo."""
    try:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = int(value.split()[0]) * 1024
        total, available = fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"])
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        total, available = os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    limit = cgroup_limit()
    if limit is not None:
        total, available = min(total, limit[0]), min(available, max(0, limit[0] - limit[1]))
    return total, available


def cgroup_limit(root: str = "/sys/fs/cgroup") -> tuple[int, int] | None:
    """(limit, usage) in bytes of this process's cgroup memory limit (v2 ``memory.max``, or
    v1 ``memory/memory.limit_in_bytes``), None without one."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(os.path.join(root, limit_file)) as f:
                text = f.read().strip()
            with open(os.path.join(root, usage_file)) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if text == "max" or not text.isdigit() or int(text) >= 2**60:  # v1's "no limit"
            return None
        return int(text), usage
    return None


def fit_model(config: LearnerConfig, *, device: DeviceMemory | None = None) -> LearnerConfig:
    """``config`` with ``--model auto`` resolved, once its model's training step is known to
    fit ``device`` (None: ``probe_device``); ``ModelDoesNotFit`` or ``PolicyError`` if not.
    Reads the model's config.json only: no weights are loaded."""
    if device is None:
        device = probe_device(config.policy, config.engine)
    model = config.policy.model
    if model == AUTO:
        model = choose_model(device)
        log.info("--model auto: %s for %s with %s", model, device.name, _gib(device.total))
    model_config = model_config_of(model)
    est = check_fit(model, model_config, count_params(model_config), config, device)
    log.info("model %s fits %s: training step estimate %s of %s available", model, device.name,
             _gib(est.total), _gib(device.available))
    return replace(config, policy=replace(config.policy, model=model))


def main(argv: list[str] | None = None) -> int:
    """``python -m node.learner.fit --config-json LEARNER_TABLE``: the check alone, as the
    learner runs it, before a node starts (``node.doctor.check_model``). Prints one JSON line:
    ``{"fits": true, "model", "device", "estimate", "available", "total"}`` (bytes), or
    ``{"fits": false, "problem", "fix"}`` (exit 2), or ``{"fits": null, "error"}`` when the
    check cannot be made (exit 2)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m node.learner.fit")
    parser.add_argument("--config-json", required=True, help="the [learner] table (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    try:
        config = LearnerConfig.from_dict(json.loads(args.config_json))
        device = probe_device(config.policy, config.engine)
        model = choose_model(device) if config.policy.model == AUTO else config.policy.model
        model_config = model_config_of(model)
        est = check_fit(model, model_config, count_params(model_config), config, device)
    except ModelDoesNotFit as e:
        print(json.dumps({"fits": False, "problem": e.problem, "fix": e.fix}), flush=True)
        return 2
    except (PolicyError, ValueError, TypeError) as e:
        print(json.dumps({"fits": None, "error": str(e)}), flush=True)
        return 2
    print(json.dumps({"fits": True, "model": model, "device": device.name, "estimate": est.total,
                      "available": device.available, "total": device.total}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
