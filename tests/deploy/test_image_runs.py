"""The image's entrypoint, env and HEALTHCHECK, run without Docker against a real bootstrap.

Multi-process: a `swarm-node bootstrap` on 127.0.0.1 and the image's `swarm-node join`
(from the parsed Dockerfile + compose.yaml), with /data swapped for a tmp dir. A container
restart is a second start on the same data dir: same peer id, rounds resume from the
checkpoint that SIGTERM left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, START_TIMEOUT_S
from tests.deploy.container import Container, free_port, wait_until
from tests.deploy.dockerfile import interpolate

pytestmark = pytest.mark.slow

STOP_TIMEOUT_S = 150.0   # the node's own stop budget (learner 60 s + swarm 15 s) and slack


def community_node(stages, tmp_path: Path, bootstrap: str) -> Container:
    """The `node` service of compose.yaml as a host process ('container')."""
    svc = interpolate(yaml.safe_load((DEPLOY / "compose.yaml").read_text()),
                      {"SWARM_NODE_BOOTSTRAP": bootstrap})["services"]["node"]
    image = stages[svc["build"]["target"]].image
    env = {k: str(v) for k, v in svc["environment"].items()}
    env["SWARM_NODE_LISTEN"] = f"/ip4/127.0.0.1/tcp/{free_port()}"  # 4001 may be taken
    env["SWARM_NODE_METRICS_PORT"] = str(free_port())
    data = tmp_path / "data"
    return Container(image, tmp_path, env=env, paths={"/data": str(data)})


def rounds_done(node: Container) -> bool:
    status = json.loads((Path(node.env["SWARM_NODE_DATA_DIR"]) / "status.json").read_text())
    return status.get("round") is not None


def run_until_healthy_then_stop(node: Container) -> dict:
    """Start, wait for the HEALTHCHECK to pass and one round to finish, then SIGTERM."""
    assert node.health().returncode != 0, "healthy before it started?"
    node.start()
    try:
        wait_until(lambda: node.health().returncode == 0, timeout=START_TIMEOUT_S,
                   what="HEALTHCHECK never passed", alive=node.died)
        assert node.health().stdout.startswith("healthy: ")
        wait_until(lambda: rounds_done(node), timeout=START_TIMEOUT_S,
                   what="no round finished", alive=node.died)
        code = node.stop(STOP_TIMEOUT_S)
    finally:
        node.kill()
    assert code == 0, f"unclean exit {code}; log:\n{node.tail()}"
    after = node.health()
    assert after.returncode != 0 and after.stdout.startswith("unhealthy: "), after.stdout
    report = Path(node.env["SWARM_NODE_REPORT"])
    assert report.is_file(), "no node report in the data dir after SIGTERM"
    return json.loads(report.read_text())


def test_image_joins_is_healthy_stops_cleanly_and_keeps_its_peer_id(stages, tmp_path,
                                                                     bootstrap_addr):
    node = community_node(stages, tmp_path, bootstrap_addr)
    data = Path(node.env["SWARM_NODE_DATA_DIR"])
    assert data.parent == tmp_path  # the /data volume, on the host
    first = run_until_healthy_then_stop(node)
    ident = subprocess.run([sys.executable, "-m", "node", "identity",
                            "--data-dir", str(data)],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert first["peer_id"] == ident
    assert oct((data / "identity.key").stat().st_mode & 0o777) == "0o600"

    assert any((data / "checkpoints").iterdir()), "SIGTERM must leave a checkpoint"

    restarted = community_node(stages, tmp_path, bootstrap_addr)  # same volume
    second = run_until_healthy_then_stop(restarted)
    assert second["peer_id"] == ident, "a restart must keep the peer id"
    last, resumed = first["rounds"][-1]["round"], second["rounds"][0]["round"]
    assert resumed > last, f"restart began at round {resumed}, not after {last}"
