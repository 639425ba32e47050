"""A node killed mid-round resumes from its checkpoint; a SIGTERM'd node leaves cleanly."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.e2e.procs import Bootstrap, join, log_tail, status, wait_for

pytestmark = pytest.mark.slow
SWARM = "lifecycle"


@pytest.fixture
def bootstrap(tmp_path):
    b = Bootstrap(tmp_path / "bootstrap", SWARM)
    yield b
    b.stop()


def _pids(data_dir):
    s = status(data_dir)
    return [s["pid"]] + [c["pid"] for c in s.get("children", {}).values() if c.get("pid")]


def test_sigkilled_node_resumes_from_its_checkpoint(tmp_path, bootstrap):
    node = tmp_path / "node"
    cfg = tmp_path / "node.toml"
    cfg.write_text("[learner]\ncheckpoint_every = 1\n")  # also exercises the config file
    p = join(node, bootstrap.addr, SWARM, "--rounds", "50", "--report", str(node / "r1.json"),
             "--config", str(cfg))
    # wait until at least one checkpoint exists and the node is mid-way through later rounds
    wait_for(lambda: (status(node).get("round") or 0) >= 2, timeout_s=300,
             what=f"round 2 (log: {log_tail(node)})")
    killed_round = status(node)["round"]
    supervisor, *children = _pids(node)
    # a power cut: everything at once (children lead their own process groups, which also
    # hold hivemind's forked DHT process and p2pd)
    os.kill(supervisor, signal.SIGKILL)
    for pgid in children:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    # the newest checkpoint that survived the kill (the status file lags the learner by up
    # to a flush interval: at sub-second rounds it can be two rounds behind)
    saved = max(int(d.name.split("-")[1]) for d in (node / "checkpoints").iterdir()
                if d.name.startswith("round-"))
    assert saved >= 2 and saved >= killed_round - 1, (saved, killed_round)
    time.sleep(1)

    p2 = join(node, bootstrap.addr, SWARM, "--rounds", "2", "--report", str(node / "r2.json"),
              "--config", str(cfg))
    assert p2.wait(timeout=300) == 0, log_tail(node)
    rounds = [r["round"] for r in json.loads((node / "r2.json").read_text())["rounds"]]
    assert len(rounds) == 2
    assert rounds[0] == saved, (rounds, saved, killed_round)  # continued, not restarted
    assert rounds[1] == rounds[0] + 1
    leftovers = [f for f in node.rglob("*") if f.name.endswith((".tmp", ".new"))]
    assert not leftovers


def test_sigterm_leaves_cleanly_within_a_bounded_time(tmp_path, bootstrap):
    node = tmp_path / "node"
    p = join(node, bootstrap.addr, SWARM, "--report", str(node / "r.json"))
    wait_for(lambda: (status(node).get("round") or -1) >= 0, timeout_s=300,
             what=f"a first round (log: {log_tail(node)})")
    pids = _pids(node)
    started = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=90) == 0, log_tail(node)
    assert time.monotonic() - started < 90
    for pid in pids:  # no orphans
        wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or
                 open(f"/proc/{pid}/stat").read().split()[2] == "Z",
                 timeout_s=15, what=f"pid {pid} to exit")
    report = json.loads((node / "r.json").read_text())
    assert report["status"] == "stopped" and len(report["rounds"]) >= 1
    assert status(node)["phase"] == "stopped"


def test_unknown_model_stops_the_node_with_a_clear_error(tmp_path, bootstrap):
    """A fatal learner error is reported once and not restarted (HF offline: fails fast)."""
    node = tmp_path / "node"
    p = join(node, bootstrap.addr, SWARM, "--model", "Qwen/No-Such-Model-0.5B",
             env={"HF_HUB_OFFLINE": "1"})
    assert p.wait(timeout=240) == 1, log_tail(node)
    s = status(node)
    assert s["phase"] == "failed"
    assert "cannot load model 'Qwen/No-Such-Model-0.5B'" in s["error"]
    assert s["children"]["learner"]["restarts"] == 0
    assert "Traceback" not in (node / "node.log").read_text()
