"""Error feedback for the sparse codec: what a member's contribution left out stays in its
params, so its next delta carries it (SparseLoCo's error feedback, kept in the params).

With ``compression = "sparse"`` a member sends only the top-k of each 4096 values of its
delta Δ = θ − params (2-bit values). After a step that counted its contribution, its params
are rebased onto the new θ as always (``params <- θ_new + the rounds trained since the
snapshot``) and keep ``error_decay`` x what was not sent::

    params <- θ_new + (params − snapshot) − error_decay * (Δ − decode(encode(Δ)))

so the next delta is ``error_decay`` x the unsent part plus the new work. SparseLoCo keeps
the unsent part in a separate accumulator ``e`` and resets the params to θ_new instead; on
the default task that made nodes learn worse than not averaging at all (4 nodes, H = 2,
k = 64, 3 seeds: last-20 accuracy 0.100 against 0.109 alone and 0.121 for the dense mean),
because each node drops 98 % of its own recent work from the model it trains and samples
with until its accumulator sends it. Kept in the params, the same bytes on the wire learn as
well as the dense mean (0.118; bench/outer_learning.py, ``ef=params`` against ``ef=state``;
bench/results/outer_parity_4n.json).

It is local state by construction: never hashed (θ is; the params never were) and never
sent; checkpointed with the params; kept across rebases and adoptions (the rebase keeps
whatever the params hold); zero on a fresh node (its params are the θ it adopted). Every
member still applies the same decoded mean to θ, so the shared state stays bit-identical.
It is only kept when the contribution counted (``Work.counted``): after a failed or
rolled-back attempt the params still hold all of Δ, and the next delta sends it anew.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from collectives.codec import Codec
from collectives.work import Work

__all__ = ["ErrorFeedback"]


@dataclass(frozen=True)
class ErrorFeedback:
    """``codec``: the contributions' codec; ``decay``: the share of the unsent part kept."""

    codec: Codec
    decay: float

    def unsent(self, payload: torch.Tensor, chunks: list[tuple[int, int]]) -> torch.Tensor:
        """``payload − decode(encode(payload))`` over the wire ``chunks`` the exchange encoded
        it in (global [a, b) ranges): what the codec left out (the codec is deterministic:
        the same bytes the exchange sent)."""
        out = payload.clone()
        for a, b in chunks:
            part = out[a:b]
            part.sub_(self.codec.decode(self.codec.encode(payload[a:b]), b - a))
        return out

    def keep(self, work: Work, unsent: torch.Tensor) -> None:
        """Our contribution counted: the params keep ``decay`` x what it left out (Δ is
        θ − params, so keeping work means moving the params by −unsent)."""
        work.add(unsent.mul_(-self.decay))
