"""Memory of a training step: its predicted peak, micro-batch packing, out-of-memory detection.

What a GRPO step holds (``estimate_step_memory``; P parameters of ``b`` bytes each)::

    weights      P * b
    gradients    P * b
    optimizer    2 * P * b                 AdamW's exp_avg and exp_avg_sq (parameter dtype)
    reference    P * b                     only with kl_coef > 0 (frozen copy)
    activations  N * L * per_layer         saved for backward, N = padded tokens of one
                                           micro-batch, L layers (gradient checkpointing:
                                           N * L * H * b + N * per_layer, one layer recomputed)
    head         2 * C * V * 4 + V * H * b one chunk of C positions' fp32 logits (turned into
                                           their gradient in place) and its transient
                                           temporary, and the head's weight-gradient buffer
                                           (logprobs.py); the entropy (entropy_coef > 0,
                                           or an external_correction other than
                                           off: its first epoch) adds 2 * C * V * 4 more

with ``per_layer = (16 H + 4 I) * b + 4 H * 4 + heads * S * 4 * 2`` bytes per token: the
tensors a Llama/Qwen2 block keeps for backward (norm inputs and outputs in fp32, q/k/v and
their rotary copies, GQA-expanded k/v, the attention output and o_proj input, the MLP's gate,
up, activation and product of width I), plus the attention probabilities of an eager/math
attention kernel (``heads x S`` per token for rows of S tokens, and its softmax input). Fused
kernels (flash attention on GPU) keep less, so the estimate is an upper bound there.

Nothing here depends on what a peer sends: N is bounded by ``TrainerConfig.microbatch_tokens``
(a single row longer than that is a micro-batch of its own; rows are at most prompt +
``max_completion_tokens``, and prompts are built locally), C by ``logits_chunk_mb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node.learner.config import TrainerConfig

if TYPE_CHECKING:  # the estimate is arithmetic: the fit check runs it before torch is imported
    import torch

__all__ = ["PROMPT_ALLOWANCE", "MemoryEstimate", "chunk_tokens_for", "estimate_step_memory",
           "is_out_of_memory", "plan_microbatches", "release_cached_memory"]

PROMPT_ALLOWANCE = 512
"""Prompt tokens the start-of-run estimate allows for on top of ``max_completion_tokens``
(prompts are built locally from our own tasks; the chat template adds ~50 tokens)."""
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def chunk_tokens_for(vocab_size: int, chunk_mb: float) -> int:
    """Positions per chunk so that one chunk's fp32 logits take about ``chunk_mb`` MiB
    (logprobs.py's chunks)."""
    return max(1, int(chunk_mb * 2**20) // (4 * vocab_size))


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Predicted bytes of one training step, by what holds them."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    logits: int
    """The output head's chunked logits and its weight-gradient buffer."""

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.reference
                + self.activations + self.logits)

    @property
    def step_extra(self) -> int:
        """What a step adds on top of the loaded weights (and reference copy)."""
        return self.gradients + self.optimizer + self.activations + self.logits

    def describe(self) -> str:
        mib = 2**20
        return (f"{self.total / mib:.0f} MiB = weights {self.weights / mib:.0f} + grads "
                f"{self.gradients / mib:.0f} + adam {self.optimizer / mib:.0f} + ref "
                f"{self.reference / mib:.0f} + activations {self.activations / mib:.0f} + "
                f"logits {self.logits / mib:.0f}")


def estimate_step_memory(model_config: Any, n_params: int, trainer: TrainerConfig, *,
                         param_bytes: int, seq_len: int, grad_checkpointing: bool) -> MemoryEstimate:
    """Predicted peak of one step (module docstring) for rows of at most ``seq_len`` tokens."""
    h = int(model_config.hidden_size)
    inter = int(getattr(model_config, "intermediate_size", 4 * h))
    layers = int(model_config.num_hidden_layers)
    heads = int(model_config.num_attention_heads)
    vocab = int(model_config.vocab_size)
    tokens = max(trainer.microbatch_tokens, seq_len)
    per_layer = (16 * h + 4 * inter) * param_bytes + 4 * h * 4 + heads * seq_len * 4 * 2
    if grad_checkpointing:
        activations = tokens * layers * h * param_bytes + tokens * per_layer
    else:
        activations = tokens * layers * per_layer
    activations += tokens * h * 4 * 2  # final norm output in fp32 and the gathered positions
    chunk = min(chunk_tokens_for(vocab, trainer.logits_chunk_mb), tokens)
    copies = 4 if trainer.entropy_coef > 0 or trainer.external_correction != "off" else 2
    weights = n_params * param_bytes
    return MemoryEstimate(weights=weights, gradients=weights, optimizer=2 * weights,
                          reference=weights if trainer.kl_coef > 0 else 0, activations=activations,
                          logits=copies * chunk * vocab * 4 + vocab * h * param_bytes)


def plan_microbatches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Split rows (their token counts) into micro-batches of at most ``max_tokens`` padded
    tokens (rows x longest row), longest rows first; a row longer than ``max_tokens`` goes
    alone. Returns lists of row indices."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # longest first: the first sets the width
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA/MPS out-of-memory, Python's MemoryError, or torch's CPU allocator failure."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch < 2.5: cuda only
    if isinstance(exc, (MemoryError, oom)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


def release_cached_memory(device: torch.device) -> None:
    """Give cached allocator blocks back after an out-of-memory error (CUDA only)."""
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
