"""A node killed mid-round resumes from its checkpoint; a SIGTERM'd node leaves cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
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


STOP_DURING_START_S = 30.0
"""How long a node may take to leave when SIGTERM lands while its collective starts: the
round in progress, the final checkpoint, the swarm process (about 5 s on an idle box). A
learner that waited for the start took the supervisor's whole 60 s stop budget and was killed
before it checkpointed."""


def _processes_of(data_dir) -> list[str]:
    """Live processes whose command line names ``data_dir`` (the node's children, hivemind's
    DHT fork, p2pd: its -id is the data dir's hivemind_identity.key)."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, ValueError, IndexError):
            continue
        if str(data_dir) in cmd and not zombie:
            found.append(f"{d}: {cmd[:200]}")
    return found


def test_sigterm_while_the_collective_starts_checkpoints_and_leaves_promptly(tmp_path, bootstrap):
    """Issue 28: the learner starts its collective (p2pd, DHT, reachability, genesis) after
    the first round; a SIGTERM during that start must not wait for it."""
    node = tmp_path / "node"
    cfg = tmp_path / "node.toml"
    cfg.write_text("[outer]\nslow_start_for_tests_s = 300.0\n")  # the start lasts 5 minutes
    p = join(node, bootstrap.addr, SWARM, "--report", str(node / "r.json"), "--config", str(cfg))
    try:
        # round 0 reported: the learner is now starting its collective
        wait_for(lambda: status(node).get("round") is not None, timeout_s=300, poll_s=0.1,
                 what="a first round")
        started = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=STOP_DURING_START_S)
        except subprocess.TimeoutExpired:
            rc = p.wait(timeout=120)  # let it leave (the supervisor kills at 60 s), then fail
            pytest.fail(f"the node took {time.monotonic() - started:.0f} s to stop (exit {rc}), "
                        f"over {STOP_DURING_START_S:.0f} s:\n{log_tail(node)}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    took = time.monotonic() - started
    assert rc == 0, log_tail(node)
    report = json.loads((node / "r.json").read_text())
    assert report["status"] == "stopped" and report["rounds"], report.get("status")
    last = report["rounds"][-1]["round"]  # the final checkpoint holds every trained round
    assert (node / "checkpoints" / f"round-{last + 1:08d}").is_dir(), \
        (last, sorted(d.name for d in (node / "checkpoints").iterdir()), log_tail(node))
    wait_for(lambda: not _processes_of(node), timeout_s=15,
             what=f"the node's processes to exit: {_processes_of(node)}")
    print(f"stopped {took:.1f} s after SIGTERM, {len(report['rounds'])} rounds")


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
