"""The outer step applied while the average lands: Nesterov update and state hash per chunk.

Without this, a member waits for the whole average, then runs ``OuterState.stepped`` (four
passes over 100M values) and hashes 800 MB of θ and momentum for its vote: 0.6-0.8 s at
100M values after the last byte arrived, on a quiet machine. Every value of the new state
depends only on the same position of θ, the momentum and the average, and the state hash is
a hash of block digests (state.py), so both can be done for each chunk of the average as it
is decoded (in the codec pool, while later chunks are still on the wire). When the exchange
ends, the new state and its hash are ready.

Bit-parity: ``land`` runs the same elementwise fp32 ops as ``OuterState.stepped`` on slices
(no op here depends on its neighbours or on the slice bounds), so the result is the same
bits; ``tests/collectives/test_units.py`` checks it against ``stepped`` and ``hash``.

A range may land twice (a reducer's "redo" verdict overwrites the streamed mean with its
robust mean): it is recomputed, and the blocks it touches are hashed again at the end.
"""

from __future__ import annotations

import threading

import torch

from collectives.state import HASH_BLOCK, OuterState, block_digest, state_digest

__all__ = ["Landing"]


class Landing:
    """The state after one outer step from ``base`` with the average ``avg``, built range by
    range as the average's values become final (``land``), and its hash block by block."""

    def __init__(self, base: OuterState, avg: torch.Tensor, *, lr: float,
                 momentum: float) -> None:
        n = base.theta.numel()
        if avg.numel() != n:
            raise ValueError(f"average of {avg.numel()} values for a state of {n}")
        self.base, self.avg, self.lr, self.mu = base, avg, lr, momentum
        self.theta = torch.empty_like(base.theta)
        self.momentum = torch.empty_like(base.momentum)
        self._nblocks = -(-n // HASH_BLOCK)
        self._missing = [min(HASH_BLOCK, n - b * HASH_BLOCK) for b in range(self._nblocks)]
        """Block -> values not landed yet (first landings only)."""
        self._digests: list[bytes | None] = [None] * self._nblocks
        self._stale: set[int] = set()
        self._seen: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def land(self, lo: int, hi: int) -> None:
        """``avg[lo:hi]`` holds its final values: step that range, hash completed blocks.
        Thread-safe for ranges of one chunk grid (disjoint or equal)."""
        if hi <= lo:
            return
        g = self.avg[lo:hi]
        theta = self.theta[lo:hi]
        if self.mu > 0:  # the ops of OuterState.stepped, on a slice
            m = torch.mul(self.base.momentum[lo:hi], self.mu, out=self.momentum[lo:hi]).add_(g)
            update = torch.mul(m, self.mu, out=theta).add_(g)
        else:  # m = 0 m + g (state.py)
            self.momentum[lo:hi].copy_(g)
            update = theta.copy_(g)
        update.mul_(self.lr)
        torch.sub(self.base.theta[lo:hi], update, out=update)
        done = []
        with self._lock:
            blocks = range(lo // HASH_BLOCK, (hi - 1) // HASH_BLOCK + 1)
            if (lo, hi) in self._seen:
                self._stale.update(blocks)
                return
            self._seen.add((lo, hi))
            for b in blocks:
                self._missing[b] -= min(hi, (b + 1) * HASH_BLOCK) - max(lo, b * HASH_BLOCK)
                if self._missing[b] == 0:
                    done.append(b)
        for b in done:
            d = block_digest(self.theta, self.momentum, b)
            with self._lock:
                if b not in self._stale:
                    self._digests[b] = d

    def state(self) -> OuterState | None:
        """The stepped state with its hash recorded, or None if some value never landed."""
        with self._lock:
            if any(self._missing):
                return None
            todo = [b for b in range(self._nblocks) if b in self._stale
                    or self._digests[b] is None]
        for b in todo:
            self._digests[b] = block_digest(self.theta, self.momentum, b)
        new = OuterState(theta=self.theta, momentum=self.momentum,
                         applied=self.base.applied + 1)
        digests = [d for d in self._digests if d is not None]
        return new.with_digest(state_digest(new.applied, self.theta.numel(), digests))
