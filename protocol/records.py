"""The records a node reports: what one round did (``RoundRecord``) and what one outer-step
attempt did (``StepRecord``).

``RoundRecord`` is made by the learner at the end of each round (node/learner/loop.py), with
the swarm process's counters added by the learner process, emitted as JSON (``to_dict``, the
``round`` event) and read back by the supervisor, its status board and metrics
(``from_dict``).

``StepRecord`` is made by the attempt (collectives/attempt.py) when it ends, emitted by the
learner as JSON (``to_dict``, the ``outer`` event: protocol/events.py) and read back by the
supervisor, its status board and metrics (``from_dict``). Frozen; ``status`` is a
``Status``. Standard library only (and ``protocol.tables``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.tables import TableError, check_table

__all__ = ["RecordError", "RoundRecord", "Status", "StepRecord"]


class RecordError(ValueError):
    """A step record without the fields it must have."""


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
class StepRecord:
    """The report of one outer-step attempt that did something (see the module docstring)."""

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
    excluded: dict[str, str] = field(default_factory=dict)
    """Contributions our reducer excluded: peer -> reason."""
    rejected_commits: dict[str, int] = field(default_factory=dict)
    """Newer versions this attempt refused, by reason (collectives/consistency.py)."""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    """Optional observations, by name: meet, before_meet_s, discovered, late_s, read_early,
    read_after_meet_s, wait_seconds, window, allreduce_seconds, exchange_start_wall,
    exchange_marks, bad_shards, clipped, votes, settled_without, made_by; the outer loop's
    counters (dht_restarts, dht_failures, invalid_commits, rejected_streams,
    state_requests_refused, rejected_commits_total, blames_total: what peers did to our
    groups by reason, collectives/leader.py); and, once the attempt was applied to
    the params, rounds_pending, discarded_rounds, overlap_rounds."""

    def with_observed(self, **more: Any) -> StepRecord:
        return dataclasses.replace(self, observed={**self.observed, **more})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the fields, ``applied`` (= version), then the observations (None
        ones left out)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                               if f.name != "observed"}
        out["status"] = self.status.value
        out["applied"] = self.version
        for k in ("excluded", "rejected_commits", "phase_seconds"):
            out[k] = dict(out[k])
        out.update((k, v) for k, v in self.observed.items() if v is not None)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        """A record from its JSON form; ``RecordError`` naming the field at fault (checked
        as config tables are, ``protocol.tables``)."""
        if not isinstance(data, Mapping):
            raise RecordError("a step record must be a JSON object")
        core = {f.name for f in dataclasses.fields(cls)} - {"observed", "status"}
        try:
            status = Status(data.get("status"))
        except ValueError:
            raise RecordError(f"step record status {data.get('status')!r} unknown") from None
        fields = {k: v for k, v in data.items() if k in core}
        observed = {k: v for k, v in data.items() if k not in core | {"status", "applied"}}
        try:
            kwargs = check_table(cls, {**fields, "observed": observed})
        except TableError as e:
            raise RecordError(f"step record {e}") from None
        for key in ("step", "version", "param_hash"):
            if key not in kwargs:
                raise RecordError(f"step record {key}: required")
        return cls(**kwargs, status=status)


@dataclass(frozen=True)
class RoundRecord:
    """The report of one inner round. The fields are what the node's views read; every
    other measurement (node/report.py lists the contract keys) is in ``observed``."""

    round: int
    mean_reward: float = 0.0
    """Over our own completions this round."""
    accuracy: float = 0.0
    rollouts_published: int = 0
    rollouts_received: int = 0
    external_used: int = 0
    """Other peers' groups trained on this round."""
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    heldout: dict[str, Any] | None = None
    """The held-out evaluation, on the rounds it ran."""
    peers: int | None = None
    """From the swarm process (None: its counters were not read this round)."""
    reachability: str | None = None
    gossip_rejected: dict[str, int] = field(default_factory=dict)
    """The swarm process's rejections since it started, by reason."""
    observed: dict[str, Any] = field(default_factory=dict)
    """Everything else the round measured, by name (external_*, tokens_generated, train,
    seconds, received_at, published_at, compute_utilisation, feeds, ...)."""

    def with_observed(self, **more: Any) -> RoundRecord:
        return dataclasses.replace(self, observed={**self.observed, **more})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the fields (None ones left out), then the observations."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                               if f.name != "observed" and getattr(self, f.name) is not None}
        for k in ("rejected_by_reason", "gossip_rejected"):
            out[k] = dict(out[k])
        out.update(self.observed)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        """A record from its JSON form; ``RecordError`` naming the field at fault."""
        if not isinstance(data, Mapping):
            raise RecordError("a round record must be a JSON object")
        core = {f.name for f in dataclasses.fields(cls)} - {"observed"}
        fields = {k: v for k, v in data.items() if k in core and v is not None}
        observed = {k: v for k, v in data.items() if k not in core}
        try:
            kwargs = check_table(cls, {**fields, "observed": observed})
        except TableError as e:
            raise RecordError(f"round record {e}") from None
        if "round" not in kwargs:
            raise RecordError("round record round: required")
        return cls(**kwargs)
