"""Token log-probabilities of a causal LM without materialising full-vocabulary logits.

``token_logprobs`` runs the model's trunk (``model.base_model``) once, gathers the hidden
states at the positions that need a log-prob (the completion tokens, ``positions``), and
applies the output head chunk by chunk (``_ChunkedLinearLogProb``, the fused
linear-cross-entropy idea of Liger/Cut-Cross-Entropy): for ``chunk_tokens`` positions at a
time it computes the logits, divides them by the sampling temperature, and keeps only the
selected token's logit minus the ``logsumexp``. Backward recomputes one chunk's logits at a
time and turns them into their gradient in place: the live logits are ``chunk_tokens x
vocab`` floats, whatever the batch. A 151,936-token
vocabulary at 16k positions would otherwise need ~10 GB of fp32 logits, plus as much again
for their log-softmax.

The temperature: the engine samples from ``softmax(logits / T)``, so the policy whose ratio
GRPO takes is that distribution, and log-probs here are ``log_softmax(logits / T)`` (verl and
TRL do the same). ``top_p`` truncation is not reflected (it is 1.0 by default; with it < 1
the sampled distribution is the truncated one and these log-probs are those of the
untruncated tempered policy, as in verl and TRL).

``check_head_matches(model)`` compares this path with the model's own ``forward`` once: an
architecture whose head does more than ``lm_head(last_hidden_state)`` (logit soft-capping,
scaling) is refused rather than trained on wrong log-probs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from node.learner.errors import PolicyError

__all__ = ["check_head_matches", "token_logprobs"]


class _ChunkedLinearLogProb(torch.autograd.Function):
    """``log_softmax((h W^T + b) * inv_temp)[target]`` for N positions, ``chunk`` at a time.

    Forward keeps only each position's logsumexp; backward recomputes a chunk's logits and
    turns them in place into the gradient ``(onehot - softmax) * g * inv_temp``, so at most one
    chunk of logits (plus a cast copy in low precision) is alive, and the head's weight
    gradient is accumulated in one buffer (``addmm_``) instead of one tensor per chunk.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, inv_temp: float, chunk: int) -> torch.Tensor:
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        picked = torch.empty_like(lse)
        for i in range(0, hidden.shape[0], chunk):
            logits = _chunk_logits(hidden[i:i + chunk], weight, bias, inv_temp)
            picked[i:i + chunk] = logits.gather(1, targets[i:i + chunk, None]).squeeze(1)
            lse[i:i + chunk] = torch.logsumexp(logits, dim=1)
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.inv_temp, ctx.chunk = inv_temp, chunk
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        inv_temp, chunk = ctx.inv_temp, ctx.chunk
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        for i in range(0, hidden.shape[0], chunk):
            h, g = hidden[i:i + chunk], grad_out[i:i + chunk].float()
            logits = _chunk_logits(h, weight, bias, inv_temp)
            # d logp / d z = inv_temp * (onehot(target) - softmax(z * inv_temp)), times g
            grad_z = logits.sub_(lse[i:i + chunk, None]).exp_().mul_(-(g * inv_temp)[:, None])
            grad_z.scatter_add_(1, targets[i:i + chunk, None], (g * inv_temp)[:, None])
            grad_z = grad_z.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[i:i + chunk] = grad_z @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_z.t(), h)
            if grad_bias is not None:
                grad_bias += grad_z.sum(0)
            del logits, grad_z
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  inv_temp: float) -> torch.Tensor:
    logits = torch.nn.functional.linear(h, weight, bias).float()
    return logits.mul_(inv_temp) if inv_temp != 1.0 else logits


def _entropy_chunk(head: Any, hidden: torch.Tensor, inv_temp: float) -> torch.Tensor:
    logits = head(hidden).float() * inv_temp
    lse = torch.logsumexp(logits, dim=-1)
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   temperature: float = 1.0, with_entropy: bool = False,
                   positions: torch.Tensor | None = None, chunk_tokens: int = 512,
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / temperature)`` of token t+1 given tokens <= t, shape (B, T-1),
    float32, and (if asked) the entropy of that distribution at every position.

    ``positions`` (bool, (B, T-1)) limits the work to those positions; elsewhere both outputs
    are 0. ``chunk_tokens`` positions go through the output head at a time (the entropy, when
    asked, in checkpointed chunks of the same size: a second pass over the head).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise PolicyError(f"chunked log-probs need a linear output head, {type(model).__name__} "
                          f"has {type(head).__name__}")
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    targets = input_ids[:, 1:]
    if positions is None:
        positions = torch.ones_like(targets, dtype=torch.bool)
    positions = positions.bool()
    flat_hidden = hidden[:, :-1][positions]
    flat_targets = targets[positions]
    inv_temp = 1.0 / temperature
    flat_logp = _ChunkedLinearLogProb.apply(flat_hidden, head.weight, head.bias, flat_targets,
                                            inv_temp, chunk_tokens)
    logp = hidden.new_zeros(targets.shape, dtype=torch.float32).index_put((positions,), flat_logp)
    if not with_entropy:
        return logp, None
    grad = torch.is_grad_enabled()
    parts = []
    for i in range(0, flat_targets.shape[0], chunk_tokens):
        h = flat_hidden[i:i + chunk_tokens]
        parts.append(checkpoint(_entropy_chunk, head, h, inv_temp, use_reentrant=False)
                     if grad else _entropy_chunk(head, h, inv_temp))
    entropy = hidden.new_zeros(targets.shape, dtype=torch.float32)
    if parts:
        entropy = entropy.index_put((positions,), torch.cat(parts))
    return logp, entropy


@torch.no_grad()
def check_head_matches(model: Any, tol: float = 1e-3) -> None:
    """Raise PolicyError unless ``lm_head(base_model(x))`` reproduces ``model(x).logits``."""
    device = next(model.parameters()).device
    ids = torch.arange(1, 9, device=device)[None] % model.config.vocab_size
    mask = torch.ones_like(ids)
    try:
        reference = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), -1)
        reference = reference.gather(-1, ids[:, 1:, None]).squeeze(-1)
        ours, _ = token_logprobs(model, ids, mask)
    except (AttributeError, TypeError) as e:
        raise PolicyError(f"chunked log-probs unsupported for {type(model).__name__}: {e}") from e
    err = float((ours - reference).abs().max())
    if not err <= tol * max(1.0, float(reference.abs().max())):
        raise PolicyError(f"chunked log-probs differ from {type(model).__name__}'s forward by {err:.3g} "
                          "(a head with soft-capping or scaling is not supported)")
