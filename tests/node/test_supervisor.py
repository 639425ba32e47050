"""Supervisor process management with real child processes (fake_children.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from node.config import NodeConfig
from node.supervisor import EXIT_GAVE_UP, EXIT_OK, Supervisor
from tests.lock_holder import held_lock

CHILD = [sys.executable, "-m", "tests.node.fake_children"]


def make(tmp_path, *, rounds=4, crashes=0, crash_at=2, max_restarts=3):
    crash_file = tmp_path / "crashes"
    crash_file.write_text("\n".join("x" * crashes))
    cfg = NodeConfig(data_dir=tmp_path, rounds=rounds, report=tmp_path / "report.json",
                     max_restarts=max_restarts, stop_timeout_s=10)

    def learner_argv(remaining):
        return CHILD + ["learner", str(remaining), str(crash_file), str(crash_at)]

    return Supervisor(cfg, CHILD + ["swarm"], learner_argv)


def test_crashed_learner_restarts_with_the_rounds_left(tmp_path):
    sup = make(tmp_path, rounds=4, crashes=1, crash_at=2)
    assert sup.run() == EXIT_OK
    report = json.loads((tmp_path / "report.json").read_text())
    # first run: rounds 0,1 then crash; restart runs the 2 rounds still to do
    assert [r["round"] for r in report["rounds"]] == [0, 1, 0, 1]
    assert report["restarts"]["learner"] == 1
    assert report["peer_id"] == "12D3KooWfake" and report["model"] == "fake-model"
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["phase"] == "stopped"


def test_gives_up_after_repeated_crashes(tmp_path):
    sup = make(tmp_path, rounds=4, crashes=10, crash_at=0, max_restarts=2)
    assert sup.run() == EXIT_GAVE_UP
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["phase"] == "failed" and "gave up" in status["error"]
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "failed"


def test_sigterm_stops_children_and_writes_report(tmp_path):
    sup = make(tmp_path, rounds=10_000)

    def kill_after_3_rounds():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(sup.rounds) < 3:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by the supervisor

    threading.Thread(target=kill_after_3_rounds, daemon=True).start()
    assert sup.run() == EXIT_OK
    assert not sup.swarm.alive() and not sup.learner.alive()
    report = json.loads((tmp_path / "report.json").read_text())
    assert 3 <= len(report["rounds"]) < 10_000
    assert os.path.exists(tmp_path / "status.json")


def test_a_second_node_on_the_same_data_dir_is_refused(tmp_path):
    from node.locks import DataDirBusy, DirLock

    with held_lock(tmp_path / "node.lock") as pid:
        assert make(tmp_path).run() == 1
        try:
            DirLock(tmp_path / "node.lock").acquire()
            raise AssertionError("lock acquired while another process holds it")
        except DataDirBusy as e:
            assert str(pid) in str(e)
    DirLock(tmp_path / "node.lock").acquire(wait_s=5).release()  # freed when the holder died


def test_a_fatal_learner_error_is_not_restarted(tmp_path):
    cfg = NodeConfig(data_dir=tmp_path, rounds=3, report=tmp_path / "report.json")
    sup = Supervisor(cfg, CHILD + ["swarm"], lambda remaining: CHILD + ["fatal"])
    assert sup.run() == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert "cannot load model 'nope'" in status["error"]
    assert status["children"]["learner"]["restarts"] == 0


def test_a_learner_that_ignores_sigterm_is_killed_after_the_stop_timeout(tmp_path):
    cfg = NodeConfig(data_dir=tmp_path, report=tmp_path / "report.json", stop_timeout_s=3)
    sup = Supervisor(cfg, CHILD + ["swarm"], lambda remaining: CHILD + ["stuck"])

    def term_after_first_round():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not sup.rounds:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term_after_first_round, daemon=True).start()
    started = time.monotonic()
    assert sup.run() == EXIT_OK
    assert time.monotonic() - started < 40
    assert not sup.learner.alive()
    assert json.loads((tmp_path / "report.json").read_text())["rounds"]
