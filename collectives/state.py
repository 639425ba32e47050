"""The shared outer state (θ_global, Nesterov buffer, version): hashing, wire form, update.

Everything here is a deterministic function of its inputs; given the same state and the same
averaged pseudo-gradient bytes, every peer computes the same bits (elementwise fp32 ops only).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.errors import ProtocolError
from protocol.limits import Limits, packb, unpackb

__all__ = ["OuterState", "flatten", "unflatten_into", "HASH_BLOCK", "block_digest",
           "state_digest"]

_WIRE_VERSION = 2
HASH_BLOCK = 1 << 18
"""Values per block of the state hash: the hash is sha256 over the header and the sha256 of
every block's (θ, momentum) bytes, so blocks hash in parallel (hashlib releases the GIL) and
in any order: as the averaged shards land during the exchange (landing.py), not in one
0.5 s pass over 800 MB at 100M values after it."""
_HASH_POOL: ThreadPoolExecutor | None = None


def block_digest(theta: torch.Tensor, momentum: torch.Tensor, b: int) -> bytes:
    """sha256 of block ``b``'s θ bytes then momentum bytes (little-endian fp32)."""
    lo, hi = b * HASH_BLOCK, min((b + 1) * HASH_BLOCK, theta.numel())
    h = hashlib.sha256(_le_f32(theta[lo:hi]).data)
    h.update(_le_f32(momentum[lo:hi]).data)
    return h.digest()


def state_digest(applied: int, numel: int, blocks: list[bytes]) -> str:
    """The state hash from its block digests (in block order)."""
    h = hashlib.sha256(b"swarm-node/outer-state/v3")
    h.update(applied.to_bytes(8, "little"))
    h.update(numel.to_bytes(8, "little"))
    for d in blocks:
        h.update(d)
    return h.hexdigest()


def _hash_pool() -> ThreadPoolExecutor:
    global _HASH_POOL
    if _HASH_POOL is None:
        _HASH_POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                        thread_name_prefix="state-hash")
    return _HASH_POOL


def _le_f32(t: torch.Tensor) -> np.ndarray:
    """``t`` as a C-contiguous little-endian fp32 array (no copy when it already is one)."""
    return np.ascontiguousarray(t.numpy(), dtype="<f4")


def flatten(params: list[torch.nn.Parameter], *, out: torch.Tensor | None = None) -> torch.Tensor:
    """All parameters as one contiguous fp32 CPU vector (a copy); into ``out`` (an fp32 CPU
    vector of the total length, returned) when given."""
    if not params:
        return torch.zeros(0, dtype=torch.float32) if out is None else out
    parts = [p.detach().reshape(-1).to("cpu", torch.float32) for p in params]
    return torch.cat(parts) if out is None else torch.cat(parts, out=out)


def unflatten_into(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    """Copy ``flat`` into ``params`` in place (dtype/device of each parameter kept)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector of {flat.numel()} values for {offset} parameters")


@dataclass
class OuterState:
    """θ_global, the Nesterov momentum buffer and the version.

    With momentum 0 the buffer holds the last applied average (``m = 0 m + g``): the update
    never reads it, the member and reducer checks of a peer that adopted the state do
    (their reference step size, holding.py).

    The version counts the averages of >= 2 peers applied to θ_global since genesis; an
    attempt that changed nothing (alone, failed) changes neither the version nor the hash.
    """

    theta: torch.Tensor
    momentum: torch.Tensor
    applied: int = 0
    """Version: number of outer steps (averages of >= 2 peers) that changed θ_global."""

    _memo: tuple[object, ...] = field(default=(), init=False, repr=False, compare=False)
    """(theta, momentum, their versions and the counter, hash) of the last hash computed."""

    @property
    def version(self) -> int:
        return self.applied

    def clone(self) -> OuterState:
        return OuterState(theta=self.theta.clone(), momentum=self.momentum.clone(),
                          applied=self.applied)

    def is_finite(self) -> bool:
        return bool(torch.isfinite(self.theta).all()) and bool(torch.isfinite(self.momentum).all())

    def hash(self) -> str:
        """sha256 of the version, θ_global and the momentum; cached until one of them changes.

        torch bumps a tensor's ``_version`` on every in-place write (``t[i] = x`` included);
        writes through ``.numpy()`` or ``.data`` would bypass it, and nothing here makes them.
        """
        if self.theta.is_inference() or self.momentum.is_inference():
            return self._digest()  # inference tensors have no version counter
        key = (self.applied, self.theta._version, self.momentum._version)
        m = self._memo
        if m and m[0] is self.theta and m[1] is self.momentum and m[2] == key:
            return m[3]  # type: ignore[return-value]
        digest = self._digest()
        self._memo = (self.theta, self.momentum, key, digest)
        return digest

    def with_digest(self, digest: str) -> OuterState:
        """Record ``digest`` as the hash of the state as it is now (computed elsewhere, block
        by block: landing.py); any later write to θ or the momentum invalidates it."""
        self._memo = (self.theta, self.momentum,
                      (self.applied, self.theta._version, self.momentum._version), digest)
        return self

    def _digest(self) -> str:
        n = self.theta.numel()
        if self.momentum.numel() != n:
            raise ValueError("θ and momentum differ in size")
        nblocks = -(-n // HASH_BLOCK)
        if nblocks <= 1:
            blocks = [block_digest(self.theta, self.momentum, b) for b in range(nblocks)]
        else:
            blocks = list(_hash_pool().map(
                lambda b: block_digest(self.theta, self.momentum, b), range(nblocks)))
        return state_digest(self.applied, n, blocks)

    def stepped(self, avg_pseudo_grad: torch.Tensor, *, lr: float, momentum: float,
                out: torch.Tensor | None = None) -> OuterState:
        """The state after one outer Nesterov SGD step (as torch.optim.SGD(nesterov=True)),
        in new tensors: ``self`` stays as it was (the state to roll back to, without a copy).
        Explicit elementwise fp32 ops with the bits of ``m = mu m + g; θ -= lr (g + mu m)``,
        in one allocation with ``out`` (a dead buffer of θ's size, aliasing nothing here,
        that becomes the new θ), two without (a fresh large tensor costs more in page faults
        than an op)."""
        g = avg_pseudo_grad
        if out is None:
            out = torch.empty_like(self.theta)
        if momentum > 0:
            m = torch.mul(self.momentum, momentum).add_(g)
            update = torch.mul(m, momentum, out=out).add_(g)  # g + mu m: IEEE addition commutes
        else:  # m = 0 m + g: the buffer keeps the last average (a joiner's step size,
            # holding.py ``_step_rms``), which a momentum-free update never reads
            m, update = g.clone(), out.copy_(g)
        update.mul_(lr)
        theta = torch.sub(self.theta, update, out=update)
        return OuterState(theta=theta, momentum=m, applied=self.applied + 1)

    def to_bytes(self) -> bytes:
        return packb([_WIRE_VERSION, self.applied, self.theta.numel(),
                      _le_f32(self.theta).tobytes(), _le_f32(self.momentum).tobytes()])

    @staticmethod
    def wire_size(numel: int) -> int:
        """An upper bound on the length of ``to_bytes()`` for ``numel`` values (the fetch bound)."""
        return len(packb([_WIRE_VERSION, 2**63 - 1, numel, b"", b""])) + 8 * numel \
            + 2 * (_bin_header(4 * numel) - _bin_header(0))

    @classmethod
    def from_bytes(cls, data: bytes, *, numel: int) -> OuterState:
        """Parse a state; ValueError if malformed or of the wrong size."""
        limits = Limits(max_message_bytes=len(data) + 1, max_str=4 * numel + 64)
        try:
            raw = unpackb(data, limits)
        except ProtocolError as e:
            raise ValueError(f"outer state does not decode: {e}") from e
        if not (isinstance(raw, list) and len(raw) == 5 and raw[0] == _WIRE_VERSION):
            raise ValueError("not an outer state")
        _, applied, n, theta, mom = raw
        if n != numel or not isinstance(theta, bytes) or not isinstance(mom, bytes) \
                or len(theta) != 4 * numel or len(mom) != 4 * numel:
            raise ValueError(f"outer state of {n} values, expected {numel}")
        if not (isinstance(applied, int) and applied >= 0):
            raise ValueError("bad version in outer state")
        t = torch.from_numpy(np.frombuffer(theta, "<f4").astype(np.float32))
        m = torch.from_numpy(np.frombuffer(mom, "<f4").astype(np.float32))
        return cls(theta=t, momentum=m, applied=applied)


def _bin_header(n: int) -> int:
    """Bytes of the msgpack header of a bin of length ``n``."""
    return 2 if n < 2**8 else 3 if n < 2**16 else 5

