"""`swarm-node local`: the README's main command, end to end on loopback."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.procs import cli

pytestmark = pytest.mark.slow


def test_local_swarm_of_three_trains_on_each_others_rollouts(tmp_path):
    report = tmp_path / "r.json"
    out = subprocess.run(cli("local", "--nodes", "3", "--rounds", "4", "--report", str(report),
                             "--data-dir", str(tmp_path / "swarm")),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    data = json.loads(report.read_text())
    assert len(data["nodes"]) == 3 and data["ok"]
    peer_ids = {n["peer_id"] for n in data["nodes"]}
    assert len(peer_ids) == 3
    for node in data["nodes"]:
        rounds = node["rounds"]
        assert len(rounds) == 4, node["name"]
        for key in ("round", "mean_reward", "rollouts_published", "rollouts_received",
                    "external_used", "rejected"):
            assert key in rounds[0], key
        assert sum(r["rollouts_received"] for r in rounds) > 0, node["name"]
        assert sum(r["external_used"] for r in rounds) > 0, node["name"]
    # DiLoCo every 2 rounds (local's defaults): every node attempted outer steps, and nodes
    # that completed the same step together hold bit-identical shared state
    by_step: dict[int, set[str]] = {}
    for node in data["nodes"]:
        assert len(node["outer_steps"]) >= 1, node["name"]
        for o in node["outer_steps"]:
            assert {"step", "peers", "param_hash", "seconds", "bytes_sent"} <= set(o)
            if o["status"] == "ok":
                by_step.setdefault(o["step"], set()).add(o["param_hash"])
    assert all(len(hashes) == 1 for hashes in by_step.values()), by_step
    # ...and after the last outer step every node holds the same state: averaged together,
    # or adopted from the majority by a node that ran alone or arrived late
    last = [node["outer_steps"][-1] for node in data["nodes"]]
    assert len({(o["step"], o["param_hash"]) for o in last}) == 1, last
    assert any(o["status"] == "ok" and o["peers"] >= 2 for node in data["nodes"]
               for o in node["outer_steps"]), "no outer step averaged ≥ 2 peers"
    assert report.with_suffix(".png").stat().st_size > 1000
