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
    shift: torch.Tensor | None = None
    """Sum of ``onto − base`` of the rebases so far: params <- params + shift when collected."""
    counted: bool = False
    """Our delta is in an applied average (the rounds it spans are no longer pending)."""
    rounds_during: int = 0

    def params(self) -> torch.Tensor:
        """The params as the attempt sees them: the snapshot with its rebases applied."""
        return self.snapshot if self.shift is None else self.snapshot + self.shift


class Background:
    """Rebasing and collecting attempts (a mixin of ``OuterLoop``, whose attributes these are)."""

    _lock: threading.Lock
    _params: list[torch.nn.Parameter]
    _state: OuterState
    _work: Work | None
    _rounds_pending: int
    _discarded_rounds: int

    def _collect(self, work: Work, rec: dict[str, Any]) -> None:
        """Apply a finished attempt to the live params: params += its shift (the rounds
        trained since its snapshot are kept); count what it did to the pending rounds."""
        with self._lock:
            if work.shift is not None:
                new = flatten(self._params) + work.shift
                if bool(torch.isfinite(new).all()):
                    unflatten_into(new, self._params)
                else:  # a non-finite local delta: reducers excluded it, nothing to keep
                    self._discarded_rounds += self._rounds_pending
                    self._rounds_pending = 0
                    unflatten_into(self._state.theta, self._params)
            if work.counted:  # the rounds it spans are in an average now
                self._rounds_pending = max(0, self._rounds_pending - work.rounds)
        rec.update(rounds_pending=self._rounds_pending, discarded_rounds=self._discarded_rounds,
                   overlap_rounds=work.rounds_during)

    def _rebase(self, *, onto: torch.Tensor, base: torch.Tensor) -> None:
        """params <- onto + (params − base), i.e. params += onto − base: the work done since
        ``base`` survives. Added to the running attempt's shift (applied when it is
        collected, on the caller's thread: the attempt never writes the live params)."""
        work = self._work
        assert work is not None, "a rebase outside an attempt"
        step = onto - base
        work.shift = step if work.shift is None else work.shift + step
