"""`swarm-node local`: the README's main command, end to end on loopback."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.e2e.procs import cli
from node.local import LOCAL_DEFAULTS
from tests.rounds import due_senders, senders

pytestmark = pytest.mark.slow

DELIVERY_S = 3.0
"""Time a published batch is allowed to reach a subscriber's inbox (one feed hop on loopback:
well under a second measured)."""
ROUNDS = 8
CONFIG = LOCAL_DEFAULTS + "slowdown_for_tests = 10.0\n"
"""``swarm-node local``'s own defaults, rounds stretched to ~1.5 s ([learner] slowdown): with
the collective started off the training thread, 4 bare rounds took about a second, so on a
quiet machine the three nodes' rounds barely overlapped and no node had a peer's rollouts
due (seen: "no node's rounds overlapped a peer's publishing")."""


def _check_received(nodes: list[dict]) -> list[str]:
    """Every node received from each peer that published in time for its rounds (see
    tests.rounds: rounds never wait for the network); the names of the nodes checked."""
    due = due_senders(nodes, delivery_s=DELIVERY_S)
    checked = []
    for node in nodes:
        if not due[node["peer_id"]]:
            continue  # its rounds ended before any peer published: nothing to expect
        missing = due[node["peer_id"]] - senders(node)
        assert not missing, (node["name"], sorted(missing),
                             [(r["received_at"], r["rollouts_received"]) for r in node["rounds"]])
        assert sum(r["external_used"] for r in node["rounds"]) > 0, node["name"]
        checked.append(node["name"])
    return checked


def _stepping(nodes: list[dict]) -> list[dict]:
    """The nodes expected to take part in outer steps: those still training when some peer's
    first outer step began. Rounds never wait for the collective either: on a loaded box one
    learner ran all 8 rounds (14:55:04-14:56:20) before the other two had their collective up
    (14:57:13, 14:57:44), and trained alone, correctly (fresh-clone run, issue 28)."""
    began = {n["peer_id"]: min((o["ended_at"] - o["seconds"] for o in n["outer_steps"]),
                               default=None) for n in nodes}
    out = []
    for node in nodes:
        ended = node["rounds"][-1]["published_at"]
        if node["outer_steps"] or any(t is not None and t <= ended for pid, t in began.items()
                                      if pid != node["peer_id"]):
            out.append(node)
    return out


FINAL_WAIT_S = tomllib.loads(CONFIG)["outer"]["schedule"]["final_wait_s"]


def _ended_together(nodes: list[dict]) -> list[dict]:
    """The nodes whose last round ended within ``final_wait_s`` of the last node's: a node
    that finished earlier stops waiting for the others and ends on its own
    (collectives/finish.py). Seen under a doubled load: node-2 ended its rounds 102 s before
    node-1 and kept the state of step 0, the other two stepped once more."""
    last = max(n["rounds"][-1]["published_at"] for n in nodes)
    return [n for n in nodes if last - n["rounds"][-1]["published_at"] <= FINAL_WAIT_S]


def _kept_state(node: dict) -> tuple[int, str]:
    """(version, state hash) of the outer state in the node's newest checkpoint."""
    latest = max((Path(node["data_dir"]) / "checkpoints").glob("round-*"))
    outer = json.loads((latest / "meta.json").read_text())["outer"]
    return outer["version"], outer["state_hash"]


def test_local_swarm_of_three_trains_on_each_others_rollouts(tmp_path):
    report = tmp_path / "r.json"
    config = tmp_path / "local.toml"
    config.write_text(CONFIG)
    out = subprocess.run(cli("local", "--nodes", "3", "--rounds", str(ROUNDS), "--report",
                             str(report), "--data-dir", str(tmp_path / "swarm"),
                             "--config", str(config)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    data = json.loads(report.read_text())
    assert len(data["nodes"]) == 3 and data["ok"]
    peer_ids = {n["peer_id"] for n in data["nodes"]}
    assert len(peer_ids) == 3
    for node in data["nodes"]:
        rounds = node["rounds"]
        assert len(rounds) == ROUNDS, node["name"]
        for key in ("round", "mean_reward", "rollouts_published", "rollouts_received",
                    "external_used", "rejected", "rollouts_from", "received_at", "published_at"):
            assert key in rounds[0], key
    # the nodes train on each other's rollouts: every node that was still training when the
    # others published received from each of them (at least the node whose rounds ended last
    # is checked: the others published during its rounds)
    assert _check_received(data["nodes"]), "no node's rounds overlapped a peer's publishing"
    # DiLoCo every 2 rounds (local's defaults): every node that was still training when a
    # peer's collective was stepping attempted outer steps, and nodes that completed the same
    # step together hold bit-identical shared state
    stepping = _stepping(data["nodes"])
    assert len(stepping) >= 2, [(n["name"], n["rounds"][-1]["published_at"]) for n in data["nodes"]]
    by_step: dict[int, set[str]] = {}
    for node in stepping:
        assert len(node["outer_steps"]) >= 1, node["name"]
        for o in node["outer_steps"]:
            assert {"step", "peers", "param_hash", "seconds", "bytes_sent"} <= set(o)
            if o["status"] == "ok":
                by_step.setdefault(o["step"], set()).add(o["param_hash"])
    assert all(len(hashes) == 1 for hashes in by_step.values()), by_step
    # ...and the nodes that ended together keep the same state: averaged together, or
    # adopted by a node that ran alone, arrived late or finished first. What a node keeps is
    # its final checkpoint's outer state: an adoption at the end has no outer-step record
    # (fresh-clone run L: node-1 adopted version 2 in its last wait; its last record says 0)
    kept = {node["name"]: _kept_state(node) for node in _ended_together(stepping)}
    assert len(set(kept.values())) == 1, kept
    assert any(o["status"] == "ok" and o["peers"] >= 2 for node in data["nodes"]
               for o in node["outer_steps"]), "no outer step averaged ≥ 2 peers"
    assert report.with_suffix(".png").stat().st_size > 1000
