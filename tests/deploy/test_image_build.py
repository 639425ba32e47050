"""deploy/Dockerfile built and run for real (podman, as root): the `cpu` image, built offline
from a wheelhouse, joins a swarm on the host network, reports healthy through its own
HEALTHCHECK, stops gracefully on `podman stop` and resumes after `podman start` with the
same peer id, as uid 10001 on a named volume.

Setup installs podman/runc/debootstrap with apt-get where missing (skips with the reason
where that or root is missing). Timings go to stdout and to $SWARM_NODE_IMAGE_CACHE
(/var/tmp/swarm-node-image-test)/last-run.json.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.deploy import podman as pm
from tests.deploy.conftest import DEPLOY, START_TIMEOUT_S
from tests.deploy.container import free_port, wait_until
from tests.deploy.dockerfile import interpolate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

UID = 10001
# compose.yaml's stop_grace_period: the node must be out before podman would SIGKILL it.
GRACE_S = int(yaml.safe_load((DEPLOY / "compose.yaml").read_text())
              ["services"]["node"]["stop_grace_period"].rstrip("s"))
MEASURED: dict[str, float] = {}  # seconds and sizes, published by the test


@pytest.fixture(scope="module")
def built():
    """(podman, image tag) from the session's background build (podman.IMAGE_BUILD, started
    at collection by tests/conftest.py so that it overlaps the tests before this one)."""
    try:
        yield pm.IMAGE_BUILD.result(timeout=1500)
    except pm.Unavailable as e:
        pytest.skip(str(e))
    finally:
        MEASURED.update(pm.IMAGE_BUILD.measured)
        pm.IMAGE_BUILD.cleanup()


@pytest.fixture(scope="module")
def podman(built):
    return built[0]


@pytest.fixture(scope="module")
def image(built):
    return built[1]


class Node:
    """One container of the image on the host network, its /data on a named volume."""

    def __init__(self, podman: pm.Podman, image: str, bootstrap: str):
        self.podman, self.image = podman, image
        self.name = f"swarm-node-test-{uuid.uuid4().hex[:12]}"
        svc = interpolate(yaml.safe_load((DEPLOY / "compose.yaml").read_text()),
                          {"SWARM_NODE_BOOTSTRAP": bootstrap})["services"]["node"]
        self.env = {k: str(v) for k, v in svc["environment"].items()}
        self.env["SWARM_NODE_LISTEN"] = f"/ip4/127.0.0.1/tcp/{free_port()}"  # 4001 may be taken
        self.env["SWARM_NODE_METRICS_PORT"] = str(free_port())
        podman.run("volume", "create", self.name)
        self.data = Path(podman.run("volume", "inspect", "--format", "{{.Mountpoint}}",
                                    self.name).stdout.strip())

    def run(self) -> None:
        env = [a for k, v in self.env.items() for a in ("-e", f"{k}={v}")]
        self.podman.run("run", "-d", "--name", self.name, "--network", "host",
                        "-v", f"{self.name}:/data", *env, self.image, timeout=300)

    def died(self) -> str | None:
        state = self.podman.inspect(self.name, "{{.State.Status}}")
        if state == "running":
            return None
        return f"container {state}; log:\n{self.logs()}"

    def logs(self, tail: int = 60) -> str:
        out = self.podman.run("logs", "--tail", str(tail), self.name, check=False)
        return out.stdout + out.stderr

    def status(self) -> dict:
        return pm.read_json(self.data / "status.json") or {}

    def healthy(self) -> bool:
        out = self.podman.run("healthcheck", "run", self.name, check=False, timeout=60)
        return out.returncode == 0

    def wait_round_after(self, since: float, last: int) -> float:
        """Seconds until this run's status shows a round after ``last``, healthy."""
        wait_until(self.healthy, timeout=START_TIMEOUT_S, alive=self.died,
                   what="the image's HEALTHCHECK never passed")
        assert self.podman.inspect(self.name, "{{.State.Health.Status}}") == "healthy"

        def trained() -> bool:
            s = self.status()
            return s.get("time", 0) >= since and s.get("round") is not None and s["round"] > last

        wait_until(trained, timeout=START_TIMEOUT_S, alive=self.died, what="no round finished")
        return time.time() - since

    def stop(self) -> tuple[float, dict]:
        """`podman stop` (SIGTERM, SIGKILL after the grace period): seconds and the report."""
        start = time.monotonic()
        self.podman.run("stop", "--time", str(GRACE_S), self.name, timeout=GRACE_S + 60)
        seconds = time.monotonic() - start
        code = self.podman.inspect(self.name, "{{.State.ExitCode}}")
        assert code == "0" and seconds < GRACE_S, \
            f"exit code {code} after {seconds:.0f} s (grace {GRACE_S} s); log:\n{self.logs()}"
        report = pm.read_json(self.data / "node-report.json")
        assert report, f"no node report on the volume; log:\n{self.logs()}"
        # The node's own stop budget may kill a slow child: still a clean exit, but counted
        # (the log holds every run of this container).
        MEASURED["children_killed_on_stop"] = sum(
            "node.supervisor" in line and "did not stop within" in line
            for line in self.logs(-1).splitlines())
        return seconds, report

    def remove(self) -> None:
        self.podman.run("rm", "-f", self.name, check=False)
        self.podman.run("volume", "rm", "-f", self.name, check=False)


def test_image_builds_offline_joins_heals_stops_and_resumes(podman, image, bootstrap_addr):
    user = podman.run("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == f"{UID}:{UID}"
    node = Node(podman, image, bootstrap_addr)
    try:
        started = time.time()
        node.run()
        MEASURED["first_round_s"] = round(node.wait_round_after(started, -1), 1)
        assert podman.run("exec", node.name, "id", "-u").stdout.strip() == str(UID)
        podman.run("exec", node.name, "sh", "-c", "touch /data/.probe && rm /data/.probe")
        key = (node.data / "identity.key").stat()
        assert (key.st_uid, oct(key.st_mode & 0o777)) == (UID, "0o600")
        assert node.data.stat().st_uid == UID, "the volume must belong to the node user"
        peer_id = node.status()["peer_id"]

        MEASURED["stop_s"], first = node.stop()
        assert first["peer_id"] == peer_id and first["rounds"], first
        assert any((node.data / "checkpoints").iterdir()), "SIGTERM must leave a checkpoint"
        last = first["rounds"][-1]["round"]

        restarted = time.time()
        podman.run("start", node.name, timeout=300)
        MEASURED["restart_round_s"] = round(node.wait_round_after(restarted, last), 1)
        MEASURED["second_stop_s"], second = node.stop()
        assert second["peer_id"] == peer_id, "a restart must keep the peer id"
        resumed = second["rounds"][0]["round"]
        assert resumed > last, f"restart began at round {resumed}, not after {last}"
    finally:
        node.remove()
        _publish()


def _publish() -> None:
    text = json.dumps({k: round(v, 1) for k, v in MEASURED.items()}, sort_keys=True)
    print(f"image test measurements: {text}")
    pm.CACHE.mkdir(parents=True, exist_ok=True)
    (pm.CACHE / "last-run.json").write_text(text + "\n")
