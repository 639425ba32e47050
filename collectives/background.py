"""One outer-step attempt running in the background: the params it started from and the
shift it makes to them (see loop.py: an attempt never writes the live params; every rebase
``params <- onto + (params − base)`` is ``params += onto − base``, summed here and applied
on the training thread when the attempt is collected)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from collectives.state import OuterState, flatten, unflatten_into

__all__ = ["Background", "Work"]


@dataclass
class Work:
    """One attempt: the params it started from and what it does to them."""

    snapshot: torch.Tensor
    """flatten(params) when the attempt started (taken on the caller's thread)."""
    rounds: int
    """Rounds since our delta was last counted, when the attempt started."""
    weight: float | None
    meet: float | None = None
    """Meeting time (DHT time) on the clock, None for an unscheduled attempt."""
    window: float | None = None
    """Unscheduled: how long to wait for the peers to join (None: ``join_window_s``)."""
    final: bool = False
    """Our run ended (finish.py): a meeting where every peer present ended too is the last,
    if nobody we expect is missing (else it is let pass without a step)."""
    last_call: bool = False
    """finish()'s wait is over: step with whoever came."""
    met: tuple[int, ...] = ()
    """The clock codes of the peers at our state already at ``meet`` when we moved there
    (join.py ``_meet_others``): our join record lives until their read ends."""
    shift: torch.Tensor | None = None
    """Sum of ``onto − base`` of the rebases so far: params <- params + shift when collected."""
    counted: bool = False
    """Our delta is in an applied average (the rounds it spans are no longer pending)."""
    rounds_during: int = 0

    def params(self) -> torch.Tensor:
        """The params as the attempt sees them: the snapshot with its rebases applied."""
        return self.snapshot if self.shift is None else self.snapshot + self.shift


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite: its max and min are (``aminmax`` propagates
    NaN). ``torch.isfinite(t).all()`` allocates temporaries of t's size: 1-3 s at 100M
    values on a loaded machine; ``amax`` and ``amin`` read it twice (0.12 s at load 6),
    ``aminmax`` once (0.05-0.06 s): this runs on the training thread, in every step's
    apply."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) and torch.isfinite(hi))


def _add_in_place(params: list[torch.nn.Parameter], shift: torch.Tensor) -> bool:
    """``params += shift`` in place when every param is a contiguous fp32 CPU tensor (the
    same fp32 additions as flatten + add + copy back, without the two copies); False,
    nothing written, otherwise."""
    if not all(p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous()
               for p in params):
        return False
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.view(-1).add_(shift[offset : offset + n])
            offset += n
    return True


class Background:
    """Rebasing and collecting attempts (a mixin of ``OuterLoop``, whose attributes these are)."""

    _lock: threading.Lock
    _params: list[torch.nn.Parameter]
    _state: OuterState
    _work: Work | None
    _rounds_pending: int
    _discarded_rounds: int
    _snapshot_buf: torch.Tensor | None = None

    def _snapshot(self) -> torch.Tensor:
        """flatten(params) for a new attempt's ``Work.snapshot``, into the buffer of the
        previous snapshot when the params are contiguous fp32 CPU tensors: a fresh 400 MB
        tensor (100M values) costs its page faults on every attempt, on the training thread
        (0.1 s quiet, 1.3 s measured at load 11, against 0.1-0.3 s for the copy). Only when
        no attempt runs (the caller's ``_pending`` is None): an attempt's snapshot never
        outlives it (every rebase and delta computed from it is a new tensor)."""
        if not all(p.device.type == "cpu" and p.dtype == torch.float32 for p in self._params):
            return flatten(self._params)
        n = sum(p.numel() for p in self._params)
        if self._snapshot_buf is None or self._snapshot_buf.numel() != n:
            self._snapshot_buf = torch.empty(n, dtype=torch.float32)
        return flatten(self._params, out=self._snapshot_buf)

    def _collect(self, work: Work, rec: dict[str, Any]) -> None:
        """Apply a finished attempt to the live params: params += its shift (the rounds
        trained since its snapshot are kept); count what it did to the pending rounds."""
        with self._lock:
            if work.shift is not None:
                if _add_in_place(self._params, work.shift):
                    ok = all(_finite(p.detach()) for p in self._params)
                else:
                    new = flatten(self._params).add_(work.shift)
                    ok = _finite(new)
                    if ok:
                        unflatten_into(new, self._params)
                if not ok:  # a non-finite local delta: reducers excluded it, nothing to keep
                    self._discarded_rounds += self._rounds_pending
                    self._rounds_pending = 0
                    unflatten_into(self._state.theta, self._params)
            if work.counted:  # the rounds it spans are in an average now
                self._rounds_pending = max(0, self._rounds_pending - work.rounds)
        rec.update(rounds_pending=self._rounds_pending, discarded_rounds=self._discarded_rounds,
                   overlap_rounds=work.rounds_during)

    def _rebase(self, *, onto: torch.Tensor, base: torch.Tensor,
                out: torch.Tensor | None = None) -> None:
        """params <- onto + (params − base), i.e. params += onto − base: the work done since
        ``base`` survives. Added to the running attempt's shift (applied when it is
        collected, on the caller's thread: the attempt never writes the live params).
        ``out``: a dead buffer (aliasing neither) to hold ``onto − base``."""
        work = self._work
        assert work is not None, "a rebase outside an attempt"
        step = onto - base if out is None else torch.sub(onto, base, out=out)
        work.shift = step if work.shift is None else work.shift + step
