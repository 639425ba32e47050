"""One outer-step attempt's work: the params it started from and the shift it makes to them
(see loop.py: an attempt never writes the live params; every rebase ``params <- onto +
(params − base)`` is ``params += onto − base``, summed in ``Work.shift`` and applied on the
training thread when the attempt is collected, ``Snapshots`` and ``add_shift``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from collectives.state import flatten, unflatten_into

__all__ = ["Progress", "Snapshots", "Work", "add_shift", "finite"]


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
    (attempt.py ``_meet_others``): our join record lives until their read ends."""
    shift: torch.Tensor | None = None
    """Sum of ``onto − base`` of the rebases so far: params <- params + shift when collected."""
    counted: bool = False
    """Our delta is in an applied average (the rounds it spans are no longer pending)."""
    rounds_during: int = 0

    def params(self) -> torch.Tensor:
        """The params as the attempt sees them: the snapshot with its rebases applied."""
        return self.snapshot if self.shift is None else self.snapshot + self.shift

    def rebase(self, *, onto: torch.Tensor, base: torch.Tensor,
               out: torch.Tensor | None = None) -> None:
        """params <- onto + (params − base), i.e. params += onto − base: the work done since
        ``base`` survives. Added to the shift (applied when the attempt is collected, on the
        caller's thread). ``out``: a dead buffer (aliasing neither) to hold ``onto − base``."""
        step = onto - base if out is None else torch.sub(onto, base, out=out)
        self.shift = step if self.shift is None else self.shift + step

    def add(self, step: torch.Tensor) -> None:
        """params <- params + step when collected (``step`` is ours to keep)."""
        self.shift = step if self.shift is None else self.shift + step


def finite(t: torch.Tensor) -> bool:
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


def add_shift(params: list[torch.nn.Parameter], shift: torch.Tensor) -> bool:
    """params += shift (in place when they are contiguous fp32 CPU tensors); False, and
    nothing written in the fallback path, when the result is not finite (a non-finite local
    delta: reducers excluded it; the caller resets the params)."""
    if _add_in_place(params, shift):
        return all(finite(p.detach()) for p in params)
    new = flatten(params).add_(shift)
    if not finite(new):
        return False
    unflatten_into(new, params)
    return True


class Snapshots:
    """flatten(params) for a new attempt's ``Work.snapshot``, into the buffer of the previous
    snapshot when the params are contiguous fp32 CPU tensors: a fresh 400 MB tensor (100M
    values) costs its page faults on every attempt, on the training thread (0.1 s quiet, 1.3 s
    measured at load 11, against 0.1-0.3 s for the copy). Take one only when no attempt
    runs: an attempt's snapshot never outlives it (every rebase and delta computed from it is
    a new tensor)."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def take(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        if not all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params):
            return flatten(params)
        n = sum(p.numel() for p in params)
        if self._buf is None or self._buf.numel() != n:
            self._buf = torch.empty(n, dtype=torch.float32)
        return flatten(params, out=self._buf)


class Progress:
    """The training thread's side of the outer step: the live params, the rounds trained
    since our delta was last counted in an applied average (``pending``), the rounds whose
    work was dropped (``discarded``: only a non-finite local delta is), and the snapshots
    attempts start from. Only the thread that trains touches it."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.pending = 0
        self.discarded = 0
        self._snapshots = Snapshots()

    def snapshot(self) -> torch.Tensor:
        """flatten(params) for a new attempt (only when none runs: ``Snapshots``)."""
        return self._snapshots.take(self.params)

    def collect(self, work: Work, *, reset: Callable[[list[torch.nn.Parameter]], None],
                ) -> dict[str, int]:
        """Apply a finished attempt to the live params: params += its shift (the rounds
        trained since its snapshot are kept; ``reset(params)`` puts θ_global back when the
        result is not finite); count what it did to the pending rounds. Returns the
        record's observations of it."""
        if work.shift is not None and not add_shift(self.params, work.shift):
            # a non-finite local delta: reducers excluded it, nothing of it to keep
            self.discarded += self.pending
            self.pending = 0
            reset(self.params)
        if work.counted:  # the rounds it spans are in an average now
            self.pending = max(0, self.pending - work.rounds)
        return {"rounds_pending": self.pending, "discarded_rounds": self.discarded,
                "overlap_rounds": work.rounds_during}
