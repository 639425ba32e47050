"""Pure maths of one shard's reduction: bounds, exclusion, deterministic weighted mean.

A reducer receives one contribution per group member for its shard. It drops contributions
that are non-finite, declare a weight outside (0, max_weight], or whose L2 norm exceeds
``max_norm`` or ``max_norm_ratio`` x the median norm of the finite contributions. The mean of
the rest is summed in the order of the members' peer ids, so the result does not depend on
arrival order. Contributions are weighted by their (bounded) declared weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Contribution", "ShardResult", "reduce_shard", "shard_bounds"]


@dataclass(frozen=True, kw_only=True)
class Contribution:
    peer: str
    """Sender's peer id (authenticated by the stream)."""
    weight: float
    """Declared weight, bounded by the reducer."""
    values: torch.Tensor
    """Decoded fp32 shard of the sender's pseudo-gradient."""


@dataclass(frozen=True, kw_only=True)
class ShardResult:
    mean: torch.Tensor | None
    """Weighted mean of the accepted contributions; None if none was accepted."""
    accepted: tuple[str, ...]
    excluded: dict[str, str]
    """Peer id -> reason ("non_finite", "weight", "norm")."""


def shard_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """Contiguous shards [start, end) of a vector of ``numel`` values for ``n`` members."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return [(i * numel // n, (i + 1) * numel // n) for i in range(n)]


def reduce_shard(
    contributions: list[Contribution], *, max_weight: float, max_norm: float, max_norm_ratio: float
) -> ShardResult:
    """Weighted mean of the contributions that pass the bounds, in peer-id order."""
    excluded: dict[str, str] = {}
    finite: list[tuple[Contribution, float]] = []
    for c in sorted(contributions, key=lambda c: c.peer):
        if not (math.isfinite(c.weight) and 0 < c.weight <= max_weight):
            excluded[c.peer] = "weight"
            continue
        norm = float(torch.linalg.vector_norm(c.values)) if c.values.numel() else 0.0
        if not math.isfinite(norm):
            excluded[c.peer] = "non_finite"
            continue
        finite.append((c, norm))
    if finite:
        norms = sorted(n for _, n in finite)
        median = norms[(len(norms) - 1) // 2]
        limit = min(max_norm, max_norm_ratio * median) if median > 0 else max_norm
    accepted: list[Contribution] = []
    for c, norm in finite:
        if norm > max_norm or (norm > limit and len(finite) > 2):
            excluded[c.peer] = "norm"
        else:
            accepted.append(c)
    if not accepted:
        return ShardResult(mean=None, accepted=(), excluded=excluded)
    # fp32 is enough: only this reducer computes the mean; members receive its bytes
    weight_sum = math.fsum(c.weight for c in accepted)
    mean = torch.zeros_like(accepted[0].values, dtype=torch.float32)
    for c in accepted:  # sorted by peer id: the result does not depend on arrival order
        mean.add_(c.values, alpha=c.weight / weight_sum)
    return ShardResult(mean=mean, accepted=tuple(c.peer for c in accepted), excluded=excluded)
