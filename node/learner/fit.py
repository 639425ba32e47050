"""A model that fits: ``--model auto``'s table, and the check a learner runs on its model
before it loads any weights.

    --model auto  ── DeviceMemory (kind, total) ── MODEL_TABLE ──▶ a model id
    any model     ── its config.json (shape) + parameter count (meta device, no weights)
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
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from node.learner.config import EngineConfig, LearnerConfig, PolicyConfig, TrainerConfig
from node.learner.errors import ModelDoesNotFit, PolicyError
from node.learner.memory import PROMPT_ALLOWANCE, MemoryEstimate, estimate_step_memory

__all__ = ["AUTO", "GIB", "MODEL_TABLE", "DeviceMemory", "TableRow", "cgroup_limit", "check_fit",
           "choose_model", "count_params", "fit_model", "model_config_of", "probe_device"]

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


def _qwen25(hidden: int, inter: int, layers: int, heads: int) -> Callable[[], Any]:
    def config() -> Any:  # Qwen2.5's config.json values for this size
        from transformers import Qwen2Config

        return Qwen2Config(vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
                           num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=2, tie_word_embeddings=True)
    return config


def _embedded() -> Any:
    from node.learner.tiny_model import embedded_config

    return embedded_config()


@dataclass(frozen=True, kw_only=True)
class TableRow:
    """One row of ``MODEL_TABLE``."""

    model: str
    """What ``--model auto`` becomes on a device this row matches."""
    gpu: bool
    """Matches CUDA GPUs (True) or devices without one (False)."""
    min_total_gib: float
    """Matches devices with at least this much memory (``DeviceMemory.total``)."""
    config: Callable[[], Any]
    """The model's shape (its config.json values) without a download: the refusal message
    weighs the table's smaller models with it."""


MODEL_TABLE: tuple[TableRow, ...] = (
    TableRow(model="Qwen/Qwen2.5-1.5B-Instruct", gpu=True, min_total_gib=40,
             config=_qwen25(1536, 8960, 28, 12)),
    TableRow(model="Qwen/Qwen2.5-0.5B-Instruct", gpu=True, min_total_gib=0,
             config=_qwen25(896, 4864, 24, 14)),
    TableRow(model="embedded", gpu=False, min_total_gib=0, config=_embedded),
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
    weights)."""
    for row in MODEL_TABLE:
        if row.model == model:
            return row.config()
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise PolicyError(f"cannot load model {model!r}: its config is unreadable: {e}") from e


_LLAMA_LIKE = {"llama": False, "mistral": False, "qwen2": True}
"""Architectures ``count_params`` counts from the config alone: model_type → biases on q/k/v."""


def count_params(model_config: Any) -> int:
    """Parameters of the model ``model_config`` describes, tied embeddings counted once (as
    the trainer counts them): from the shape for Llama, Mistral and Qwen2 (no modelling code
    to import: the check stays within seconds), else counted on torch's meta device (no
    memory, no weights)."""
    qkv_bias = _LLAMA_LIKE.get(getattr(model_config, "model_type", ""))
    if qkv_bias is not None:
        return _llama_like_params(model_config, qkv_bias=qkv_bias or bool(
            getattr(model_config, "attention_bias", False)))
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    return sum(p.numel() for p in model.parameters())


def _llama_like_params(c: Any, *, qkv_bias: bool) -> int:
    h, inter, vocab = int(c.hidden_size), int(c.intermediate_size), int(c.vocab_size)
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or h // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if qkv_bias else 0)
    if getattr(c, "attention_bias", False) and c.model_type == "llama":
        attention += h  # o_proj's bias too
    mlp = 3 * h * inter + ((2 * inter + h) if getattr(c, "mlp_bias", False) else 0)
    layer = attention + mlp + 2 * h  # two RMSNorm weights
    head = 0 if getattr(c, "tie_word_embeddings", True) else vocab * h
    return vocab * h + int(c.num_hidden_layers) * layer + h + head


@functools.cache
def _table_params(model: str) -> int:
    return count_params(next(row for row in MODEL_TABLE if row.model == model).config())


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
        f"of {_gib(device.total)} is available; {advice}")


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
        cfg = row.config()
        n = _table_params(row.model)
        if n < n_params and fits(trainer, cfg=cfg, n=n):
            out.append(f"--model {row.model}")
            break
    return out


def probe_device(policy: PolicyConfig, engine: EngineConfig | None = None) -> DeviceMemory:
    """The memory of the device ``policy.device`` names (module docstring: what counts as
    available; ``engine`` says whether vLLM takes its share). Creates the CUDA context on a
    GPU."""
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
