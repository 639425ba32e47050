"""The children's event lines (protocol/events.py): what a child writes is what the
supervisor reads, and a line that does not hold its kind's fields is refused by name."""

from __future__ import annotations

import json

import pytest

from protocol.events import (KINDS, Checkpoint, Done, EventError, Exit, Fatal, OuterDone, Peers,
                             Phase, Ready, RoundDone, Started, parse_event)

EXAMPLES = [
    Ready(peer_id="12D3KooWx", addrs=("/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWx",), ipc="/tmp/s"),
    Started(model="fp"),
    Phase(phase="generate", done=3, total=6),
    Phase(phase="outer", stage="exchange"),
    Peers(peers=({"peer_id": "a", "model": "fp", "capabilities": ["train"]},)),
    Peers(peers=(), links={"a": "direct", "b": "relayed"}),
    RoundDone(record={"round": 1, "mean_reward": 0.5}),
    OuterDone(record={"step": 0, "status": "ok", "peers": 3}),
    Checkpoint(round=4, path="/d/ckpt", seconds=0.25),
    Fatal(error="invalid configuration: x"),
    Done(rounds=8),
    Exit(code=0, pid=123),
]


def test_every_kind_round_trips_through_its_line() -> None:
    assert {type(e) for e in EXAMPLES} == set(KINDS.values())
    for event in EXAMPLES:
        line = event.line()
        assert json.loads(line)["event"] == event.kind and "\n" not in line
        assert parse_event(line) == event


@pytest.mark.parametrize("line, reason", [
    ('{"event": "round"}', "round event: record: required"),
    ('{"event": "exit", "code": "0", "pid": 1}', "exit event: code: expected an integer"),
    ('{"event": "exit", "code": true, "pid": 1}', "code: expected an integer, got true"),
    ('{"event": "ready", "peer_id": "p", "addrs": ["a", 5]}', "addrs: expected a list of str"),
    ('{"event": "checkpoint", "round": 1, "path": "p", "seconds": null}',
     "seconds: expected a number"),
    ('{"event": "done", "rounds": 3, "extra": 1}', "extra: unknown key"),
])
def test_an_event_without_its_fields_is_refused_by_name(line: str, reason: str) -> None:
    with pytest.raises(EventError, match=reason):
        parse_event(line)


@pytest.mark.parametrize("line", ["hello", "[1, 2]", '{"level": "info"}', '{"event": "nope"}',
                                  '{"event": 5}', '{"event": []}'])
def test_a_line_that_is_no_event_is_left_to_the_log(line: str) -> None:
    assert parse_event(line) is None


def test_optional_fields_take_their_defaults_and_ints_read_as_floats() -> None:
    assert parse_event('{"event": "phase", "phase": "train"}') == Phase(phase="train")
    assert parse_event('{"event": "checkpoint", "round": 1, "path": "p", "seconds": 2}') \
        == Checkpoint(round=1, path="p", seconds=2)
