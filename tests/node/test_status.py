"""The health check behind `swarm-node status` and the Docker HEALTHCHECK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from node.status import StatusBoard, check_status, compute_text
from node.tables import ipc_path_for
from protocol.records import RoundRecord, Status, StepRecord


def test_fresh_status_of_a_live_node_is_healthy(tmp_path):
    board = StatusBoard(tmp_path / "status.json")
    board.child("swarm", pid=os.getpid(), alive=True, restarts=0)
    board.set(phase="training")
    board.on_round(RoundRecord.from_dict({"round": 3, "mean_reward": 0.5, "rollouts_published": 4}))
    board.flush()
    healthy, summary = check_status(tmp_path, max_age_s=30)
    assert healthy, summary
    assert "round=3" in summary
    out = subprocess.run([sys.executable, "-m", "node", "status", "--data-dir", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_stale_dead_or_failed_nodes_are_unhealthy(tmp_path):
    board = StatusBoard(tmp_path / "status.json")
    board.flush()
    assert not check_status(tmp_path, max_age_s=-1)[0]          # stale
    board.child("learner", pid=None, alive=False, restarts=2)
    board.flush()
    healthy, summary = check_status(tmp_path, max_age_s=30)      # a child is down
    assert not healthy and "learner" in summary
    s = json.loads((tmp_path / "status.json").read_text())
    s.update(pid=2**22 + 12345, children={}, time=time.time())   # supervisor gone
    (tmp_path / "status.json").write_text(json.dumps(s))
    assert not check_status(tmp_path, max_age_s=30)[0]
    out = subprocess.run([sys.executable, "-m", "node", "status", "--data-dir", str(tmp_path / "x")],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "no node status" in out.stdout


def test_ipc_path_stays_short_enough_for_unix_sockets(tmp_path):
    assert ipc_path_for(tmp_path) == (tmp_path / "swarm.sock").resolve()
    deep = tmp_path / ("x" * 120)
    assert len(str(ipc_path_for(deep))) <= 100
    assert ipc_path_for(deep) == ipc_path_for(deep)


def test_the_newest_heldout_score_stays_in_the_status_and_its_line(tmp_path):
    board = StatusBoard(tmp_path / "status.json")
    board.child("learner", pid=os.getpid(), alive=True, restarts=0)
    board.flush()
    assert "heldout=none" in check_status(tmp_path, max_age_s=30)[1]
    score = {"after_rounds": 10, "greedy_accuracy": 0.625, "sampled_accuracy": 0.5,
             "questions": 32, "samples": 1, "seconds": 0.4, "by_family": {}}
    board.on_round(RoundRecord.from_dict({"round": 9, "mean_reward": 0.5, "heldout": score}))
    board.on_round(RoundRecord.from_dict({"round": 10, "mean_reward": 0.6}))  # rounds between scores keep the last one
    board.flush()
    s = json.loads((tmp_path / "status.json").read_text())
    assert s["heldout"] == {k: score[k] for k in ("after_rounds", "greedy_accuracy",
                                                  "sampled_accuracy", "questions", "samples",
                                                  "seconds")}
    assert "heldout=0.62/0.50@10" in check_status(tmp_path, max_age_s=30)[1]


FEEDS = {"proven": 1, "live": 0, "trial": 3, "idle": 3, "dropped_idle": 12,
         "dropped_no_signal": 1, "idle_slot_rounds": 40, "searched": 5, "network_full": 2}
"""A round record's feeds under a farm of idle identities (issue 32)."""


def test_the_feed_sources_by_kind_and_an_attacks_idle_slots_are_in_the_status_line(tmp_path):
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.child("learner", pid=os.getpid(), alive=True, restarts=0)
    board.on_round(RoundRecord.from_dict({"round": 1, "mean_reward": 0.1}))
    board.flush()
    assert "feeds=" not in check_status(tmp_path, max_age_s=30)[1]  # flood mode: nothing said
    board.on_round(RoundRecord.from_dict({"round": 2, "mean_reward": 0.1, "feeds": FEEDS}))
    board.flush()
    s = json.loads((tmp_path / "status.json").read_text())
    assert s["feeds"] == FEEDS
    healthy, summary = check_status(tmp_path, max_age_s=30)
    assert healthy  # an attack is shown, not a failure of this node
    assert ("feeds=1 proven · 0 live · 3 on trial · 3 idle now · dropped 12 idle, 1 without "
            "signal · 40 slot-rounds held by idle sources · 5 tried in searches · 2 refused for "
            "a full network (most feed slots "
            "are held by sources "
            "that deliver nothing") in summary, summary
    calm = {**FEEDS, "proven": 3, "trial": 1, "idle": 0}
    board.on_round(RoundRecord.from_dict({"round": 3, "mean_reward": 0.1, "feeds": calm}))
    board.flush()
    summary = check_status(tmp_path, max_age_s=30)[1]
    assert "feeds=3 proven" in summary and "deliver nothing" not in summary


def test_peers_held_off_the_outer_step_are_in_the_status_line(tmp_path):
    """Issue 32: what peers did to our outer steps' groups (collectives/leader.py) shows."""
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.child("learner", pid=os.getpid(), alive=True, restarts=0)
    board.on_outer(StepRecord(step=0, status=Status.OK, version=1, param_hash="h"), 1)
    board.flush()
    assert "outer_held_off" not in check_status(tmp_path, max_age_s=30)[1]
    board.on_outer(StepRecord(step=1, status=Status.OK, version=2, param_hash="h", observed={
        "blames_total": {"exchange_missing": 1, "no_show": 4, "bogus": "x"}}), 2)
    board.flush()
    s = json.loads((tmp_path / "status.json").read_text())
    assert s["last_outer"]["held_off"] == {"exchange_missing": 1, "no_show": 4}
    summary = check_status(tmp_path, max_age_s=30)[1]
    assert "outer_held_off=1 member that never reduced · 4 no-shows" in summary, summary


RELAYED = "12D3KooW" + "r" * 44
DIRECT = "12D3KooW" + "d" * 44


def test_each_connected_peer_s_link_and_their_counts_are_in_the_status(tmp_path):
    """Issue 33: whether a peer is reached directly or only through a circuit relay."""
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.child("learner", pid=os.getpid(), alive=True, restarts=0)
    board.flush()
    assert json.loads((tmp_path / "status.json").read_text())["links"] is None
    assert "links=none" in check_status(tmp_path, max_age_s=30)[1]
    gone = "12D3KooW" + "g" * 44
    board.on_peers([{"peer_id": p, "model": "m"} for p in (RELAYED, DIRECT, gone)],
                   links={RELAYED: "relayed", DIRECT: "direct", "12D3KooWboot": "direct",
                          "12D3KooWodd": "bogus"})
    board.flush()
    s = json.loads((tmp_path / "status.json").read_text())
    assert s["links"] == {"direct": 2, "relayed": 1, "peers": {
        RELAYED: "relayed", DIRECT: "direct", "12D3KooWboot": "direct"}}
    assert {p["peer_id"]: p["link"] for p in s["peers_seen"]} == {
        RELAYED: "relayed", DIRECT: "direct", gone: None}
    assert "links=2 direct · 1 relayed" in check_status(tmp_path, max_age_s=30)[1]
    # a report without links (the swarm process could not tell) keeps the last ones
    board.on_peers([{"peer_id": DIRECT, "model": "m"}])
    assert board.state["links"]["relayed"] == 1
    # the punch went through: the relayed peer is direct now
    board.on_peers([], links={RELAYED: "direct", DIRECT: "direct"})
    assert board.state["links"] == {"direct": 2, "relayed": 0,
                                    "peers": {RELAYED: "direct", DIRECT: "direct"}}
    assert {p["peer_id"]: p["link"] for p in board.state["peers_seen"]}[RELAYED] == "direct"


def test_the_generator_and_trainer_busy_fractions_and_stale_drops_are_in_the_status(tmp_path):
    """Issue 34: how much of a round each phase idled, and what staleness cost."""
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    assert compute_text(board.state["compute"]) == "-"
    board.on_round(RoundRecord.from_dict({"round": 1, "mean_reward": 0.1, "generator_busy": 0.55,
                                          "trainer_busy": 0.4, "local_staleness": 0,
                                          "dropped_stale": 0}))
    board.on_round(RoundRecord.from_dict({"round": 2, "mean_reward": 0.1, "generator_busy": 0.9,
                                          "trainer_busy": 0.8, "local_staleness": 2,
                                          "dropped_stale": 8}))
    board.on_round(RoundRecord.from_dict({"round": 3, "mean_reward": 0.1, "generator_busy": 0.91,
                                          "trainer_busy": 0.82, "local_staleness": 1,
                                          "dropped_stale": 8}))
    board.flush()
    s = json.loads((tmp_path / "status.json").read_text())
    assert s["compute"] == {"generator_busy": 0.91, "trainer_busy": 0.82, "staleness": 1,
                            "dropped_stale_total": 16}
    assert compute_text(s["compute"]) == ("generator 91% busy · trainer 82% busy · staleness 1"
                                          " · dropped stale 16")
