"""What one outer-step attempt reports, and the deadlines it keeps.

``StepRecord`` (protocol/records.py: it crosses to the supervisor) is the report of an
attempt that did something (stepped, adopted a state, failed, stood alone): frozen, built
once from the attempt's ``Draft`` when it ends, never read to decide what happens next (the
attempt decides from the values its phases return). ``Passed`` is an attempt that let its
meeting pass without a step: the caller only learns when it ended and, for a finished node,
whether that was its end. ``Deadlines`` are the times (monotonic) each phase of one attempt
must end by, all computed from its start and ``deadline_s``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.records import Status, StepRecord

__all__ = ["Deadlines", "Draft", "Passed", "Status", "StepRecord"]


@dataclass(frozen=True)
class Passed:
    """An attempt that let its meeting pass without a step (nothing to report)."""

    ended_at: float
    """DHT time it ended (meetings opened meanwhile are let pass too)."""
    why: str
    """"period" (a meeting of a period we no longer hold), "late" (the others froze their
    group before our record was stored), "waiting" (finished: a peer we expect is missing
    or still training without us), "end". (An attempt that adopted a state before its
    meeting passed reports that adoption: a ``StepRecord``, status resynced.)"""
    end: bool = False
    """finish(): every peer present ended and nothing is pending: our run's end."""
    waiting_for: int = 0
    """finish(): how many peers we expect were missing."""


@dataclass
class Draft:
    """What an attempt has seen so far: written by the attempt as it goes, read only by
    ``freeze`` (its control flow runs on the values its phases return)."""

    step: int
    weight: float | None = None
    status: Status = Status.FAILED
    peers: int = 1
    error: str | None = None
    leader: str | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    resync_bytes: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    _mark_t: float = field(default_factory=time.monotonic)

    def note(self, **values: Any) -> None:
        self.observed.update(values)

    def mark(self, phase: str) -> None:
        """Seconds since the previous phase ended, in ``phase_seconds``."""
        now = time.monotonic()
        self.phase_seconds[phase] = round(now - self._mark_t, 4)
        self._mark_t = now

    def freeze(self, *, version: int, param_hash: str, seconds: float,
               ended_at: float, rejected_commits: Mapping[str, int]) -> StepRecord:
        return StepRecord(
            step=self.step, status=self.status, version=version, param_hash=param_hash,
            peers=self.peers, seconds=seconds, ended_at=ended_at, error=self.error,
            weight=self.weight, leader=self.leader, bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received, resync_bytes=self.resync_bytes,
            excluded=dict(self.excluded), rejected_commits=dict(rejected_commits),
            phase_seconds=dict(self.phase_seconds), observed=dict(self.observed))


CATCH_UP = 0.3
"""Catch-up (head reads, commit walk, state fetch) ends by this share of ``deadline_s``."""
LATEST_JOIN = 0.35
"""The leader waits for the JOINs of the peers whose records it read until this share."""
REDUCE = 0.55
"""Reducers end their shard's reduction by this share."""
EXCHANGE = 0.7
"""The exchange (group formation and all-reduce) ends by this share."""
VOTES = 0.9
"""The votes are read until this share."""


@dataclass(frozen=True)
class Deadlines:
    """When each phase of one attempt must end (``time.monotonic()``), from its start."""

    catch_up: float
    latest_join: float
    reduce: float
    exchange: float
    votes: float
    end: float

    @classmethod
    def starting(cls, t0: float, deadline_s: float) -> Deadlines:
        return cls(catch_up=t0 + CATCH_UP * deadline_s,
                   latest_join=t0 + LATEST_JOIN * deadline_s, reduce=t0 + REDUCE * deadline_s,
                   exchange=t0 + EXCHANGE * deadline_s, votes=t0 + VOTES * deadline_s,
                   end=t0 + deadline_s)
