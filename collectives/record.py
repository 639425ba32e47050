"""What one outer-step attempt reports, and the deadlines it keeps.

``StepRecord`` is the report of an attempt that did something (stepped, adopted a state,
failed, stood alone): frozen, built once when the attempt ends, never read to decide what
happens next (the attempt decides from the values its phases return). ``Passed`` is an
attempt that let its meeting pass without a step: the caller only learns when it ended and,
for a finished node, whether that was its end. ``Deadlines`` are the times (monotonic) each
phase of one attempt must end by, all computed from its start and ``deadline_s``.

``StepRecord.to_dict()`` is the JSON a node emits (the learner's ``outer`` event, the
workers of the multi-process tests): the core fields, then the optional observations
(``None`` ones left out, as before the record had a type).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Deadlines", "Draft", "Passed", "Status", "StepRecord"]


class Status(str, enum.Enum):
    """How an attempt ended (the JSON value is the enum's value)."""

    OK = "ok"
    """The group averaged and the version advanced."""
    FAILED = "failed"
    """No average applied (the group did not form, a shard failed its check, a timeout, a
    rollback after the vote); the state is what it was, or the group's (adopted)."""
    ALONE = "alone"
    """Fewer than ``min_peers`` came."""
    MINORITY = "minority"
    """The contributors held no strict majority of our version's witnesses: no fork."""
    RESYNCED = "resynced"
    """We adopted a newer state of our lineage (catch-up) and did not step."""


@dataclass(frozen=True)
class Passed:
    """An attempt that let its meeting pass without a step (nothing to report)."""

    ended_at: float
    """DHT time it ended (meetings opened meanwhile are let pass too)."""
    why: str
    """"period" (a meeting of a period we no longer hold), "late" (the others froze their
    group before our record was stored), "made" (the version we adopted was made here and
    its group has left), "waiting" (finished: a peer we expect is missing), "end"."""
    end: bool = False
    """finish(): every peer present ended and nothing is pending: our run's end."""
    waiting_for: int = 0
    """finish(): how many peers we expect were missing."""


@dataclass(frozen=True)
class StepRecord:
    """The report of one attempt (see the module docstring)."""

    step: int
    """Our version when the group was read (after any catch-up)."""
    status: Status
    version: int
    """Our version when the attempt ended."""
    param_hash: str
    """Our state hash when the attempt ended."""
    peers: int = 1
    """Members of the group (1: none formed)."""
    seconds: float = 0.0
    ended_at: float = 0.0
    """DHT time."""
    error: str | None = None
    weight: float | None = None
    leader: str | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    resync_bytes: int = 0
    excluded: Mapping[str, str] = field(default_factory=dict)
    """Contributions our reducer excluded: peer -> reason."""
    rejected_commits: Mapping[str, int] = field(default_factory=dict)
    """Newer versions this attempt refused, by reason (consistency.py)."""
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    observed: Mapping[str, Any] = field(default_factory=dict)
    """Optional observations, by name (``Draft.note``): meet, before_meet_s, discovered,
    late_s, read_early, read_after_meet_s, wait_seconds, window, allreduce_seconds,
    exchange_start_wall, exchange_marks, bad_shards, clipped, votes, settled_without,
    made_by; counters of the loop (dht_restarts, dht_failures, invalid_commits,
    rejected_streams, state_requests_refused, rejected_commits_total); and, once collected,
    rounds_pending, discarded_rounds, overlap_rounds."""

    def with_observed(self, **more: Any) -> StepRecord:
        return dataclasses.replace(self, observed={**self.observed, **more})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: core fields, ``applied`` (= version), then the observations."""
        out: dict[str, Any] = {
            "step": self.step, "status": self.status.value, "peers": self.peers,
            "version": self.version, "applied": self.version, "param_hash": self.param_hash,
            "seconds": self.seconds, "ended_at": self.ended_at, "error": self.error,
            "weight": self.weight, "leader": self.leader, "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received, "resync_bytes": self.resync_bytes,
            "excluded": dict(self.excluded), "rejected_commits": dict(self.rejected_commits),
            "phase_seconds": dict(self.phase_seconds)}
        out.update((k, v) for k, v in self.observed.items() if v is not None)
        return out


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
