"""The round and outer-step records (protocol/records.py): the JSON a learner emits is the
record the supervisor reads back, and a record without its fields is refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from protocol.records import RecordError, RoundRecord, Status, StepRecord


def test_a_record_round_trips_through_its_json() -> None:
    rec = StepRecord(step=3, status=Status.OK, version=4, param_hash="ab" * 32, peers=3,
                     seconds=1.5, ended_at=100.0, weight=2.0, leader="p", bytes_sent=10,
                     excluded={"x": "norm"}, rejected_commits={"no_quorum": 1},
                     phase_seconds={"join": 0.5}, observed={"votes": 3, "late_s": None})
    data = json.loads(json.dumps(rec.to_dict()))
    assert data["status"] == "ok" and data["applied"] == 4 and data["votes"] == 3
    assert "late_s" not in data and "observed" not in data  # observations at the top level
    back = StepRecord.from_dict(data)
    assert back == dataclasses.replace(rec, observed={"votes": 3})  # None ones are not sent
    assert back.status is Status.OK


@pytest.mark.parametrize("data, reason", [
    ({"status": "ok", "version": 1, "param_hash": "h"}, "step: required"),
    ({"step": 0, "status": "done", "version": 1, "param_hash": "h"}, "status 'done' unknown"),
    ({"step": "0", "status": "ok", "version": 1, "param_hash": "h"}, "step: expected an integer"),
    ({"step": 0, "status": "ok", "version": 1, "param_hash": "h", "peers": True},
     "peers: expected an integer"),
    ({"step": 0, "status": "ok", "version": 1, "param_hash": "h", "excluded": ["a"]},
     "excluded: expected a table"),
])
def test_a_record_without_its_fields_is_refused_by_name(data: dict, reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        StepRecord.from_dict(data)


def test_a_round_record_round_trips_and_keeps_what_the_views_do_not_read() -> None:
    rec = RoundRecord(round=7, mean_reward=0.25, accuracy=0.5, rollouts_published=8,
                      rollouts_received=3, external_used=2, rejected=1,
                      rejected_by_reason={"stale": 1}, heldout={"greedy_accuracy": 0.5},
                      peers=4, reachability="public", gossip_rejected={"bad_signature": 2},
                      observed={"train": {"loss": 0.1}, "seconds": {"generate": 1.0}})
    data = json.loads(json.dumps(rec.to_dict()))
    assert data["train"] == {"loss": 0.1} and "observed" not in data  # at the top level
    assert RoundRecord.from_dict(data) == rec
    bare = RoundRecord.from_dict({"round": 0, "heldout": None, "peers": None})
    assert bare.heldout is None and bare.peers is None  # not measured this round
    assert "peers" not in bare.to_dict()


@pytest.mark.parametrize("data, reason", [
    ({"mean_reward": 0.5}, "round: required"),
    ({"round": "3"}, "round: expected an integer"),
    ({"round": 3, "mean_reward": "high"}, "mean_reward: expected a number"),
    ({"round": 3, "rejected_by_reason": {"stale": "many"}}, "rejected_by_reason"),
    ({"round": 3, "reachability": 5}, "reachability: expected"),
])
def test_a_round_record_without_its_fields_is_refused_by_name(data: dict, reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        RoundRecord.from_dict(data)
