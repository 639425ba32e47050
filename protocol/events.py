"""The events a node's children tell their supervisor: one JSON object a line on stdout.

    child      event        fields
    swarm      ready        peer_id, addrs, ipc          the swarm is up (its addresses)
    learner    started      model                        the model is loaded (its fingerprint)
    learner    phase        phase, done, total, stage    where the round is (progress)
    learner    peers        peers, links                 peers heard from (peer_id, model);
                                                         connected ones' links (peer_id ->
                                                         direct | relayed)
    learner    round        record                       a round's record (README: round records)
    learner    outer        record                       an outer step's record (StepRecord.to_dict)
    learner    checkpoint   round, path, seconds         a checkpoint was written
    learner    fatal        error                        a fault no restart can fix
    learner    done         rounds                       the run ended by itself
    (any)      exit         code, pid                    written by the supervisor's reader
                                                         when the child's stdout closed

``ChildEvent.line()`` writes one (the children); ``parse_event(line)`` reads one (the
supervisor's reader thread): a line that is not an event (a library printing to stdout) is
None, an event with a missing, unknown or mistyped field raises ``EventError`` naming it
(checked as config tables are, ``protocol.tables``), so a consumer reads attributes it can
rely on. The records (round, outer) stay JSON objects: their
keys are documented where they are made, and every consumer reads them with defaults.
Standard library only (and ``protocol.tables``).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from protocol.tables import TableError, build_table

__all__ = ["KINDS", "Checkpoint", "ChildEvent", "Done", "EventError", "Exit", "Fatal",
           "OuterDone", "Peers", "Phase", "Ready", "RoundDone", "Started", "parse_event"]


class EventError(ValueError):
    """A child's event line that does not say what its kind must."""


@dataclass(frozen=True)
class _Event:
    kind: ClassVar[str]

    def line(self) -> str:
        """The event as the one JSON line a child writes."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.dumps({"event": self.kind, **fields}, default=str)


@dataclass(frozen=True)
class Ready(_Event):
    kind: ClassVar[str] = "ready"
    peer_id: str
    addrs: tuple[str, ...]
    ipc: str | None = None


@dataclass(frozen=True)
class Started(_Event):
    kind: ClassVar[str] = "started"
    model: str


@dataclass(frozen=True)
class Phase(_Event):
    kind: ClassVar[str] = "phase"
    phase: str
    done: int = 0
    total: int = 0
    stage: str = ""
    """Phase "outer" (a run's last steps): the attempt's stage (rendezvous, exchange,
    commit)."""


@dataclass(frozen=True)
class Peers(_Event):
    kind: ClassVar[str] = "peers"
    peers: tuple[dict[str, Any], ...]
    links: dict[str, str] | None = None
    """Each connected peer's link, ``direct`` or ``relayed`` (swarm.holepunch); None when
    the swarm process did not tell."""


@dataclass(frozen=True)
class RoundDone(_Event):
    kind: ClassVar[str] = "round"
    record: dict[str, Any]


@dataclass(frozen=True)
class OuterDone(_Event):
    kind: ClassVar[str] = "outer"
    record: dict[str, Any]


@dataclass(frozen=True)
class Checkpoint(_Event):
    kind: ClassVar[str] = "checkpoint"
    round: int
    path: str
    seconds: float


@dataclass(frozen=True)
class Fatal(_Event):
    kind: ClassVar[str] = "fatal"
    error: str


@dataclass(frozen=True)
class Done(_Event):
    kind: ClassVar[str] = "done"
    rounds: int


@dataclass(frozen=True)
class Exit(_Event):
    kind: ClassVar[str] = "exit"
    code: int
    pid: int


ChildEvent = Union[Ready, Started, Phase, Peers, RoundDone, OuterDone, Checkpoint, Fatal, Done,
                   Exit]
KINDS: dict[str, type[_Event]] = {c.kind: c for c in typing.get_args(ChildEvent)}


def parse_event(line: str) -> ChildEvent | None:
    """The event on ``line``; None if the line is not one (not a JSON object with a known
    ``event``); ``EventError`` if it is one without the fields its kind must have."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str) \
            or data["event"] not in KINDS:
        return None
    cls = KINDS[data["event"]]
    fields = {k: v for k, v in data.items() if k != "event"}
    try:
        event = build_table(cls, fields)
    except TableError as e:
        raise EventError(f"{cls.kind} event: {e}") from None
    return event  # type: ignore[return-value]
