from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.dockerfile import Stage, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TARGETS = ("cpu", "cuda")


@pytest.fixture(scope="session")
def stages() -> dict[str, Stage]:
    return parse_dockerfile(DEPLOY / "Dockerfile")
