"""The outer step's record (protocol/records.py): the JSON a learner emits is the record the
supervisor reads back, and a record without its fields is refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from protocol.records import RecordError, Status, StepRecord


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
