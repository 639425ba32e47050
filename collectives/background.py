"""One outer-step attempt running in the background: the params it started from and the
shift it makes to them (see loop.py: an attempt never writes the live params; every rebase
``params <- onto + (params − base)`` is ``params += onto − base``, summed here and applied
on the training thread when the attempt is collected)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Work"]


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
    shift: torch.Tensor | None = None
    """Sum of ``onto − base`` of the rebases so far: params <- params + shift when collected."""
    counted: bool = False
    """Our delta is in an applied average (the rounds it spans are no longer pending)."""
    rounds_during: int = 0

    def params(self) -> torch.Tensor:
        """The params as the attempt sees them: the snapshot with its rebases applied."""
        return self.snapshot if self.shift is None else self.snapshot + self.shift
