"""`swarm-node doctor` and join's preflight, on real sockets on 127.0.0.1 (no network mocks).

One bootstrap-only swarm process (what `swarm-node bootstrap` runs) serves every test that
needs a live peer.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.config import NodeConfig
from node.check import Verdict
from node.doctor import (CHECKPOINT_FACTOR, CHECKPOINT_FACTOR_MIN, MIN_FREE, TESTED_PYTHON,
                         check_bootstrap, check_disk, check_ports)
from node.reachable import check_reachability
from node.skew import check_clock
from protocol import Identity
from swarm.config import GossipConfig
from tests.swarm.procs import SwarmProc, short_tmpdir

SWARM = "doctor-test"
VERDICTS = ("ok  ", "warn", "FAIL")


@pytest.fixture(scope="module")
def bootstrap_addr() -> Iterator[str]:
    root = short_tmpdir()
    proc = SwarmProc(GossipConfig(data_dir=str(root / "boot"), listen=("/ip4/127.0.0.1/tcp/0",),
                                  swarm_id=SWARM, bootstrap_only=True), "boot")
    try:
        yield proc.start(timeout_s=90).addr
    finally:
        proc.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_addr() -> str:
    return f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{Identity.generate().peer_id}"


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node", "doctor", *args], capture_output=True,
                          text=True, timeout=180)


def test_tested_python_is_deploy_python_check_s() -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "python_check.py"
    spec = importlib.util.spec_from_file_location("python_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.TESTED == TESTED_PYTHON


def test_a_port_in_use_fails_naming_it(tmp_path: Path, held_port: int) -> None:
    config = NodeConfig(data_dir=tmp_path, listen=(f"/ip4/127.0.0.1/tcp/{held_port}",))
    check = check_ports(config)
    assert check.verdict is Verdict.FAIL
    assert f"port {held_port} (swarm, 127.0.0.1) is in use" in check.line()
    assert "fix: " in check.line()


def test_the_collective_port_is_the_swarm_port_plus_1(tmp_path: Path) -> None:
    for _ in range(50):  # a free port P whose P - 1 is free too
        port = closed_port()
        config = NodeConfig(data_dir=tmp_path, listen=(f"/ip4/127.0.0.1/tcp/{port - 1}",))
        if check_ports(config).verdict is Verdict.OK:
            break
    else:
        pytest.skip("no two free neighbouring ports")
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        assert f"port {port} (collective, 127.0.0.1) is in use" in check_ports(config).line()
        assert check_ports(config, collective=False).verdict is Verdict.OK


def test_join_refuses_to_start_on_a_port_in_use(tmp_path: Path, held_port: int) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "node", "join", "--bootstrap", dead_addr(), "--data-dir",
         str(tmp_path), "--listen", f"/ip4/127.0.0.1/tcp/{held_port}"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cannot start: port {held_port} "), lines
    assert not (tmp_path / "status.json").exists()  # no supervisor started


def test_join_refuses_a_model_that_cannot_fit_before_any_child(tmp_path: Path) -> None:
    """A config.json whose weights alone are far beyond this machine (~16 B parameters):
    `join` says so, with the estimate and the fix, before the supervisor or a child starts
    (node.learner.fit in a child of the preflight: no torch import)."""
    model = tmp_path / "huge"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 4_000_000, "hidden_size": 4096,
        "intermediate_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32}))
    data = tmp_path / "data"
    out = subprocess.run(
        [sys.executable, "-m", "node", "join", "--bootstrap", dead_addr(), "--data-dir",
         str(data), "--listen", "/ip4/127.0.0.1/tcp/0", "--model", str(model), "--device",
         "cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"cannot start: model {str(model)!r} does not fit cpu: its "
                               "training step needs 553.7 GiB (567032 MiB = weights "), lines
    assert "is available; fix: it fits with --model embedded" in lines[0], lines
    assert not (data / "status.json").exists() and not (data / "identity.key").exists()


def test_disk_needs_room_for_the_model_s_checkpoints(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    with open(weights, "wb") as f:  # sparse: its size counts, not its blocks
        f.truncate(free // CHECKPOINT_FACTOR_MIN)
    check = check_disk(NodeConfig(data_dir=tmp_path / "data", model=str(model)))
    assert check.verdict is Verdict.FAIL and "not room for one checkpoint" in check.detail
    with open(weights, "wb") as f:  # one checkpoint fits, keep + 1 = 3 do not
        f.truncate(free // (2 * CHECKPOINT_FACTOR))
    assert check_disk(NodeConfig(data_dir=tmp_path / "data", model=str(model))).verdict \
        is Verdict.WARN
    assert free > MIN_FREE  # else the embedded model's line below cannot be ok
    assert check_disk(NodeConfig(data_dir=tmp_path / "data")).verdict is Verdict.OK


def test_a_dead_bootstrap_fails() -> None:
    check = check_bootstrap(dead_addr(), swarm_id=SWARM)
    assert check.verdict is Verdict.FAIL, check.line()
    assert "nothing answers at 127.0.0.1:" in check.line() and "Connection refused" in check.line()


def test_a_healthy_bootstrap_is_ok(bootstrap_addr: str) -> None:
    check = check_bootstrap(bootstrap_addr, swarm_id=SWARM)
    assert check.verdict is Verdict.OK, check.line()
    assert f"swarm {SWARM!r}" in check.detail


def test_a_bootstrap_of_another_swarm_fails_naming_both_ids(bootstrap_addr: str) -> None:
    check = check_bootstrap(bootstrap_addr, swarm_id="another-swarm")
    assert check.verdict is Verdict.FAIL, check.line()
    assert f"in swarm {SWARM!r}, we are in swarm 'another-swarm'" in check.detail
    assert f"--swarm-id {SWARM}" in check.fix


def test_a_wrong_peer_id_fails_after_tcp(bootstrap_addr: str) -> None:
    wrong = bootstrap_addr.rsplit("/p2p/", 1)[0] + "/p2p/" + Identity.generate().peer_id
    check = check_bootstrap(wrong, swarm_id=SWARM)
    assert check.verdict is Verdict.FAIL and "answers TCP but the libp2p dial" in check.detail


def test_doctor_prints_one_line_per_check_and_exits_0_when_healthy(
        tmp_path: Path, bootstrap_addr: str) -> None:
    port = closed_port()
    out = doctor("--bootstrap", bootstrap_addr, "--swarm-id", SWARM, "--data-dir", str(tmp_path),
                 "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--device", "cpu")
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    assert [line.split()[1] for line in lines] == ["python", "packages", "torch", "model", "disk",
                                                   "ports", "bootstrap", "reachable",
                                                   "clock"], lines
    assert lines[3].startswith("ok    model      embedded fits cpu: training step ~"), lines
    assert all(line[:4] in VERDICTS for line in lines), lines
    assert lines[-3].startswith("ok    bootstrap"), lines
    peer = bootstrap_addr.rsplit("/p2p/", 1)[1]  # it dialled the probe's port back
    assert lines[-2].startswith(f"ok    reachable  public: {peer[:16]}… dialled us back at "
                                f"127.0.0.1:{port}"), lines
    # one machine, one clock: the bootstrap peer told the same time
    assert lines[-1].startswith(f"ok    clock      this clock agrees with {peer[:16]}…'s to "
                                "within 0.0"), lines


def test_doctor_exits_1_with_a_fail_line_per_problem(tmp_path: Path, held_port: int) -> None:
    out = doctor("--bootstrap", dead_addr(), "--data-dir", str(tmp_path),
                 "--listen", f"/ip4/127.0.0.1/tcp/{held_port}", "--device", "cpu")
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 1, out.stdout + out.stderr
    assert len(lines) == 8 and all(line[:4] in VERDICTS for line in lines), lines
    fails = [line for line in lines if line.startswith("FAIL")]
    assert [line.split()[1] for line in fails] == ["ports", "bootstrap"], lines
    assert f"port {held_port}" in fails[0] and "nothing answers" in fails[1]
    assert lines[-1] == (f"warn  reachable  not checked: the swarm port {held_port} is in use "
                         "(see ports); fix: fix the lines above, then run doctor again")


PEER = "12D3KooWAbcdefghijklmnopqrstuvwxyz"


def _answer(state: str, **extra: object) -> dict[str, object]:
    """One bootstrap peer's answer as swarm.probe reports it (doctor adds ``peer``)."""
    return {"peer": PEER, "reachability": state, "observed_ip": "203.0.113.7", "port": 4001,
            "reach_error": "", **extra}


@pytest.mark.parametrize(("answers", "fixed_port", "want"), [
    ([_answer("relayed"), _answer("public")], 4001,
     f"ok    reachable  public: {PEER[:16]}… dialled us back at 203.0.113.7:4001"),
    ([_answer("unreachable"), _answer("relayed")], 4001,
     f"warn  reachable  relayed: {PEER[:16]}… could not dial us back at 203.0.113.7:4001 (NAT or "
     "firewall) but serves a circuit relay: peers will reach this node through it; fix: this "
     "node can train as it is; to be dialled directly (faster outer steps), forward TCP ports "
     "4001 and 4002 on your router to this machine and add --announce /ip4/203.0.113.7/tcp/4001"),
    ([_answer("unreachable")], 0,
     f"FAIL  reachable  unreachable: {PEER[:16]}… could not dial us back at 203.0.113.7:4001 (NAT "
     "or firewall) and serves no relay: peers cannot reach this node first; fix: listen on a "
     "fixed port (--listen /ip4/0.0.0.0/tcp/4001), forward TCP ports 4001 and 4002 on your "
     "router to this machine and add --announce /ip4/203.0.113.7/tcp/4001, or use a bootstrap "
     "peer that serves a relay"),
    ([_answer("", reach_error="the peer refused to dial us back now (it limits dial-backs)")],
     0,
     "warn  reachable  unknown: no bootstrap peer answered the dial-back question (the peer "
     "refused to dial us back now (it limits dial-backs)); fix: run doctor again in a minute "
     "(peers limit dial-backs); the node checks again itself every few minutes"),
])
def test_reachability_verdict_is_the_node_s_rule(answers, fixed_port, want) -> None:
    """Any bootstrap peer that dialled us back makes us public (swarm.reachability.decide);
    else a relay makes us relayed; else unreachable; no answer is no verdict."""
    assert check_reachability(answers, fixed_port=fixed_port).line() == want


def _told(offset_ms: int | None, rtt_ms: int = 40, **extra: object) -> dict[str, object]:
    """One bootstrap peer's time answer as swarm.probe reports it (doctor adds ``peer``)."""
    return {"peer": PEER, "clock_offset_ms": offset_ms, "clock_rtt_ms": rtt_ms,
            "clock_error": "", **extra}


SYNC = ("fix: turn on time sync: `timedatectl set-ntp true` (systemd), or run chrony/ntpd; in "
        "a container the host's clock is the one to fix")


@pytest.mark.parametrize(("answers", "want"), [
    ([_told(12)], f"ok    clock      this clock agrees with {PEER[:16]}…'s to within 0.02 s"),
    ([_told(-1, rtt_ms=0)], f"ok    clock      this clock agrees with {PEER[:16]}…'s to within 0.00 s"),
    ([_told(-1500)], f"ok    clock      this clock is 1.5 s ahead of {PEER[:16]}…'s (±0.02 s)"),
    ([_told(800), _told(9000)],
     f"warn  clock      this clock is 9.0 s behind {PEER[:16]}…'s (±0.02 s); at 30 s messages "
     f"are dropped; {SYNC}"),
    ([_told(-45_000)],
     f"FAIL  clock      this clock is 45.0 s ahead of {PEER[:16]}…'s (±0.02 s): over the 30 s "
     f"peers accept; peers drop every message we sign as from the future; {SYNC}"),
    ([_told(31_000, rtt_ms=4000)],  # maybe only 29 s off: not certain enough to fail
     f"warn  clock      this clock is 31.0 s behind {PEER[:16]}…'s (±2.00 s); at 30 s messages "
     f"are dropped; {SYNC}"),
    ([_told(None, clock_error="ProtocolNotSupported: time")],
     "warn  clock      not checked: no bootstrap peer told its time (ProtocolNotSupported: "
     "time); fix: nothing to do if this machine syncs its time (peers running an older "
     "swarm-node do not answer the time question)"),
])
def test_clock_verdict_names_the_offset_and_when_messages_are_dropped(answers, want) -> None:
    """Peers drop messages more than max_future_s ahead of their clock: the largest offset
    against any bootstrap peer decides, and only an offset certain to be over it fails."""
    assert check_clock(answers, max_future_s=30.0).line() == want


def test_the_clock_check_takes_max_future_s_from_the_gossip_table_in_either_form() -> None:
    """``[gossip.limits] max_future_s``, or its old flat key (GossipConfig.MOVED_KEYS)."""
    from node.doctor import _max_future_s

    assert _max_future_s({}) == 30.0
    assert _max_future_s({"limits": {"max_future_s": 5.0}}) == 5.0
    assert _max_future_s({"max_future_s": 7.0, "limits": {"rate_per_s": 3.0}}) == 7.0
