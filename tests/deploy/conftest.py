from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.container import read_line_with
from tests.deploy.dockerfile import Stage, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TARGETS = ("cpu", "cuda")
START_TIMEOUT_S = 300.0  # 2 cores shared with other suites; model load + swarm start


@pytest.fixture(scope="session")
def stages() -> dict[str, Stage]:
    return parse_dockerfile(DEPLOY / "Dockerfile")


@pytest.fixture
def bootstrap_addr(tmp_path):
    log_path = tmp_path / "bootstrap.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "node", "bootstrap", "--listen", "/ip4/127.0.0.1/tcp/0",
             "--data-dir", str(tmp_path / "bootstrap")],
            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        try:
            addr = read_line_with(proc, "/p2p/", timeout=START_TIMEOUT_S)
        except AssertionError as e:
            raise AssertionError(f"{e}\nbootstrap log:\n{log_path.read_text()[-3000:]}") from None
        yield addr
    finally:
        proc.terminate()
        proc.wait(60)
