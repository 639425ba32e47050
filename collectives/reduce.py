"""Pure maths of one shard's reduction: bounds, weights, robust deterministic mean.

A reducer receives one contribution per group member for its shard (its own included).

1. **Exclusion.** Contributions that are non-finite or declare a weight outside
   (0, max_weight] are dropped; so is one whose L2 norm exceeds ``max_norm`` (absolute), or
   ``max_norm_ratio`` x a reference norm. With >= 3 finite contributions the reference is
   their median norm. In a group of two it is the reducer's own scale, so the bound holds
   against the other member: the larger of its own contribution's norm (``own``) and
   ``ref_rms`` x sqrt(shard length), ``ref_rms`` being the root mean square of the last
   mean the reducer accepted as a member (``AllReduce.mean_rms``: a joiner's is the
   adopted momentum's step size, holding.py), the same reference as the member check in
   member.py. Without the second term a reducer whose own delta is ~0 (it just rebased,
   trained a round since its delta was counted, finished training) would exclude every
   honest peer and "average" only itself. A hostile peer of a group of two still gets at
   most ``max_norm_ratio`` x that reference; grown through accepted means, at most
   ``max_norm_ratio``-fold per step. A reducer with no scale at all (own shard exactly
   zero and no mean accepted yet: it never trained nor stepped) accepts only zero
   contributions. Declared weights do not scale the limit: they are the sender's word, and
   a weight-scaled limit would let a hostile peer buy more norm by declaring max_weight.
   The reference depends only on the reducer's own state; members need not agree on it.
2. **Weights.** A declared weight (inner rounds since the sender's delta was last counted) is
   capped by the median declared weight of the contributions left: one peer declaring 1000
   against 1.0 counts as the median, never more.
3. **Robust mean (>= 3 contributions): centred clipping** (Karimireddy et al., 2021). Around
   the coordinate-wise median v0, each contribution's offset x_i - v0 is clipped to the norm
   tau = clip_factor x the median offset norm; result = v0 + sum(w_i clip(x_i - v0)) / sum(w_i).
   One contributor moves the result by at most w_i tau / sum(w): bounded, unlike a plain
   mean. We chose it over a coordinate-wise trimmed mean because with the groups we see
   (3-8 members) trimming one value per side per coordinate is the median of 3, which throws
   away most of the honest averaging; centred clipping leaves honest, similar contributions
   untouched (when no offset exceeds tau the result is the plain weighted mean, bit for bit).

Every sum runs in the members' peer-id order, so the result does not depend on arrival order.

**Streaming.** Every statistic above decomposes over chunks of the shard: a norm is the root of
the sum of per-chunk squared norms, and the coordinate median (so each offset) is per
coordinate. A reducer can therefore stream the plain weighted mean chunk by chunk, collect
``chunk_stats`` on the way, and decide at the end with ``plain_mean_holds`` whether
``reduce_shard`` would have accepted every contribution and clipped none, i.e. whether the
streamed mean is the robust mean; if not, it sends ``reduce_shard``'s result instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Contribution", "ShardResult", "reduce_shard", "shard_bounds", "CLIP_FACTOR",
           "capped_weights", "plain_mean_holds", "chunk_stats", "norm_limit",
           "coordinate_median"]

CLIP_FACTOR = 2.0
"""Centred clipping radius as a multiple of the median distance to the coordinate median."""


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
    """Robust weighted mean of the accepted contributions; None if none was accepted."""
    accepted: tuple[str, ...]
    excluded: dict[str, str]
    """Peer id -> reason ("non_finite", "weight", "norm")."""
    weights: dict[str, float]
    """Peer id -> the weight used (after the median cap), for the accepted ones."""
    clipped: tuple[str, ...] = ()
    """Accepted peers whose offset from the coordinate median was clipped."""


def shard_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """Contiguous shards [start, end) of a vector of ``numel`` values for ``n`` members."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return [(i * numel // n, (i + 1) * numel // n) for i in range(n)]


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[(len(s) - 1) // 2]  # lower median: a real element, deterministic


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t)) if t.numel() else 0.0


NETWORK_MAX_ROWS = 32
"""Up to this many rows ``coordinate_median`` sorts with a compare-exchange network (n rounds
of elementwise min/max: O(n^2) vector ops); more rows go to ``torch.median``."""


def coordinate_median(rows: list[torch.Tensor]) -> torch.Tensor:
    """Per coordinate, the lower middle value of ``rows`` (equal-shaped tensors): the values
    of ``torch.stack(rows).median(dim=0).values``, NaN where a row has NaN. A zero's sign may
    differ: norms do not see it, and a mean is computed by its reducer alone, which sends
    every member the same bytes.
    ``torch.median`` over a short dim is slow: 4 rows of 262,144 values took 8.4 ms, and a
    reducer runs one per 1 MiB chunk (0.13 s of CPU per 10M-value exchange of 4 peers); an
    odd-even transposition network of ``torch.minimum``/``maximum`` takes 0.15-6 ms for 3-16
    rows. NaN spreads to both outputs of every exchange it meets, so after n rounds its whole
    column is NaN, as with torch.median."""
    if not rows:
        raise ValueError("no rows")
    if len(rows) == 1:
        return rows[0].clone()
    if len(rows) > NETWORK_MAX_ROWS:
        return torch.stack(rows).median(dim=0).values
    r = list(rows)
    n = len(r)
    for rnd in range(n):  # after n rounds of odd-even transposition the rows are sorted
        for i in range(rnd % 2, n - 1, 2):
            r[i], r[i + 1] = torch.minimum(r[i], r[i + 1]), torch.maximum(r[i], r[i + 1])
    return r[(n - 1) // 2]  # a new tensor: every row took part in an exchange


def norm_limit(norms: dict[str, float], *, own: str | None, ref_rms: float, numel: int,
               max_norm: float, max_norm_ratio: float) -> float:
    """The largest L2 norm a contribution to a shard of ``numel`` values may have, given the
    finite contributions' ``norms`` (peer id -> norm); see the module docstring."""
    if len(norms) >= 3:
        ref = _median(list(norms.values()))
        return min(max_norm, max_norm_ratio * ref) if ref > 0 else max_norm
    history = ref_rms * math.sqrt(numel) if math.isfinite(ref_rms) and ref_rms > 0 else 0.0
    ref = max(norms.get(own, 0.0) if own is not None else 0.0, history)
    return min(max_norm, max_norm_ratio * ref)  # no scale at all: only zero passes


def reduce_shard(contributions: list[Contribution], *, max_weight: float, max_norm: float,
                 max_norm_ratio: float, own: str | None = None, ref_rms: float = 0.0,
                 clip_factor: float = CLIP_FACTOR) -> ShardResult:
    """Robust weighted mean of the contributions that pass the bounds, in peer-id order.

    ``own``: the reducer's peer id; ``ref_rms``: the RMS of the last mean it accepted. In a
    group of two the larger of its contribution's norm and ``ref_rms`` x sqrt(length) is
    the norm reference (``norm_limit``)."""
    excluded: dict[str, str] = {}
    finite: list[tuple[Contribution, float]] = []
    for c in sorted(contributions, key=lambda c: c.peer):
        if not (math.isfinite(c.weight) and 0 < c.weight <= max_weight):
            excluded[c.peer] = "weight"
            continue
        norm = _norm(c.values)
        if not math.isfinite(norm):
            excluded[c.peer] = "non_finite"
            continue
        finite.append((c, norm))
    numel = finite[0][0].values.numel() if finite else 0
    limit = norm_limit({c.peer: n for c, n in finite}, own=own, ref_rms=ref_rms, numel=numel,
                       max_norm=max_norm, max_norm_ratio=max_norm_ratio)
    accepted: list[Contribution] = []
    for c, norm in finite:
        if norm > limit:
            excluded[c.peer] = "norm"
        else:
            accepted.append(c)
    if not accepted:
        return ShardResult(mean=None, accepted=(), excluded=excluded, weights={})
    cap = _median([c.weight for c in accepted])
    weights = {c.peer: min(c.weight, cap) for c in accepted}
    weight_sum = math.fsum(weights.values())
    mean = torch.zeros_like(accepted[0].values, dtype=torch.float32)
    clipped: list[str] = []
    if len(accepted) >= 3:
        center = coordinate_median([c.values for c in accepted])  # the lower middle value
        offsets = [c.values - center for c in accepted]
        dists = [_norm(o) for o in offsets]
        tau = clip_factor * _median(dists)
        scales = [1.0 if d <= tau or d == 0 else tau / d for d in dists]
        clipped = [c.peer for c, s in zip(accepted, scales) if s < 1.0]
        if clipped:
            mean.copy_(center)
            for c, o, s in zip(accepted, offsets, scales):
                mean.add_(o, alpha=weights[c.peer] * s / weight_sum)
            return ShardResult(mean=mean, accepted=tuple(c.peer for c in accepted),
                               excluded=excluded, weights=weights, clipped=tuple(clipped))
    # fp32 is enough: only this reducer computes the mean; members receive its bytes
    for c in accepted:  # sorted by peer id: the result does not depend on arrival order
        mean.add_(c.values, alpha=weights[c.peer] / weight_sum)
    return ShardResult(mean=mean, accepted=tuple(c.peer for c in accepted), excluded=excluded,
                       weights=weights)


def capped_weights(declared: dict[str, float]) -> dict[str, float]:
    """The weights ``reduce_shard`` uses when it accepts all of ``declared``."""
    cap = _median(list(declared.values()))
    return {p: min(w, cap) for p, w in declared.items()}


def chunk_stats(parts: dict[str, torch.Tensor]) -> tuple[dict[str, float], dict[str, float]]:
    """Per peer: squared L2 norm of its chunk, and (>= 3 peers) squared L2 norm of its offset
    from the chunk's coordinate median (else {})."""
    peers = sorted(parts)
    sq = {p: _norm(parts[p]) ** 2 for p in peers}
    if len(peers) < 3:
        return sq, {}
    center = coordinate_median([parts[p] for p in peers])
    return sq, {p: _norm(parts[p] - center) ** 2 for p in peers}


def plain_mean_holds(*, weights: dict[str, float], sq_norms: dict[str, float],
                     sq_offsets: dict[str, float], max_weight: float, max_norm: float,
                     max_norm_ratio: float, own: str | None = None, ref_rms: float = 0.0,
                     numel: int = 0, clip_factor: float = CLIP_FACTOR) -> bool:
    """True when ``reduce_shard`` would accept every contribution and clip none, given their
    declared ``weights``, squared norms and (>= 3 peers) squared offsets summed over chunks
    of a shard of ``numel`` values (``own``, ``ref_rms``: as for ``reduce_shard``)."""
    if any(not (math.isfinite(w) and 0 < w <= max_weight) for w in weights.values()):
        return False
    norms = {p: math.sqrt(v) for p, v in sq_norms.items()}
    if any(not math.isfinite(n) for n in norms.values()):
        return False
    limit = norm_limit(norms, own=own, ref_rms=ref_rms, numel=numel, max_norm=max_norm,
                       max_norm_ratio=max_norm_ratio)
    if any(n > limit for n in norms.values()):
        return False
    if len(norms) >= 3:
        dists = [math.sqrt(v) for v in sq_offsets.values()]
        if len(dists) != len(norms) or not all(math.isfinite(d) for d in dists):
            return False
        tau = clip_factor * _median(dists)
        return all(d <= tau or d == 0 for d in dists)
    return True
