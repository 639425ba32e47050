"""A bound on how far off our policy an external completion may be and still be trained on.

SAPO trains on other peers' completions as if we had sampled them (grpo.py's module
docstring): the gradient is ``-A ∇log π(y)`` with no importance weight, because the sender's
behaviour log-probs are not shared (another model or tokenizer may have made them, and a
hostile sender could forge them). That is harmless while the peers' policies stay close to
ours and biased once they drift apart: a completion our policy would almost never produce
gets the full policy-gradient step all the same.

With no trusted behaviour probability, we judge a completion against a *proxy*: what our own
sample at the same positions would look like. Our policy's expected log-probability of its
own sampled token at position t is ``-H_t`` (the entropy of ``π(· | y_<t)``), so

    surprise(y) = mean over y's completion tokens of ( -log π(y_t | y_<t) - H_t )

is the *excess surprise* of y in nats per token: its mean is 0 over our own samples, and it
grows as y moves off what we would generate. ``exp(-surprise)`` is the per-token geometric
mean of ``π(y_t) / exp(-H_t)``, an importance ratio against that proxy (AReaL's
sequence-level ratio, with the proxy in place of the behaviour log-probs we cannot trust).

``completion_weights`` turns surprises into a weight per completion (``TrainerConfig``'s
``external_correction`` and ``external_surprise_bound``):

- ``off``: no weight (1), nothing computed: the SAPO paper's update bit for bit.
- ``mask``: weight 1 while ``surprise <= bound``, else 0 (AReaL's ``mask`` action).
- ``weight``: ``min(1, exp(bound - surprise))``: 1 inside the bound, then the ratio against
  the proxy, truncated at 1 (never up-weighted).

The default is ``weight`` with bound 0: every external completion less likely than our own
typical sample is weighted by ``exp(-surprise)``. In the SAPO bench (``bench/results/
sapo_vs_isolated.json``: 8 nodes, 4/4, 400 rounds, 3 seeds) the paper's update (``off``) ends
at 0.96x [0.91, 1.00] the isolated nodes' cumulative accuracy (0.75x over 1000 rounds at 4
nodes) and the default above them (1.26x [1.25, 1.27]).

The weight multiplies the completion's policy-gradient term only; the loss keeps its
denominator (AReaL: the original mask), so a masked completion takes its share of the group's
weight with it instead of handing it to its companions. Local completions are always weighted
1 (they *are* on-policy: no update happens between generation and training).
"""

from __future__ import annotations

from typing import Callable

import torch

from node.learner.config import EXTERNAL_CORRECTIONS

__all__ = ["EXTERNAL_CORRECTIONS", "completion_weights", "excess_surprise"]


def excess_surprise(logp: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row, the mean over its masked tokens of ``-logp - entropy`` (nats per token).

    ``logp`` and ``entropy`` are (B, T) float tensors (the sampled token's log-probability and
    the distribution's entropy at each position), ``mask`` (B, T) marks completion tokens.
    A row with no masked token gets 0.
    """
    if not (logp.shape == entropy.shape == mask.shape):
        raise ValueError(f"logp {tuple(logp.shape)}, entropy {tuple(entropy.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape")
    m = mask.float()
    tokens = m.sum(dim=1)
    total = ((-logp.detach().float() - entropy.detach().float()) * m).sum(dim=1)
    return torch.where(tokens > 0, total / tokens.clamp(min=1.0), torch.zeros_like(total))


def _off(surprise: torch.Tensor, bound: float) -> torch.Tensor:
    return torch.ones_like(surprise)


def _mask(surprise: torch.Tensor, bound: float) -> torch.Tensor:
    return (surprise <= bound).float()


def _weight(surprise: torch.Tensor, bound: float) -> torch.Tensor:
    return torch.exp((bound - surprise).clamp(max=0.0))


_WEIGHTS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "off": _off, "mask": _mask, "weight": _weight}


def completion_weights(surprise: torch.Tensor, *, mode: str, bound: float) -> torch.Tensor:
    """The weight of each completion's policy-gradient term, from its excess surprise
    (module docstring); a non-finite surprise gets weight 0 unless ``mode`` is ``off``."""
    try:
        rule = _WEIGHTS[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {EXTERNAL_CORRECTIONS}, got {mode!r}") from None
    w = rule(surprise, bound)
    if mode == "off":
        return w
    return torch.where(torch.isfinite(surprise), w, torch.zeros_like(w))
