from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from node.learner.tiny_model import ensure_embedded


@pytest.fixture(scope="session")
def embedded_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded base model (its shipped weights), materialised once per session."""
    return ensure_embedded(tmp_path_factory.mktemp("embedded") / "base")


@pytest.fixture
def data_dir(tmp_path: Path, embedded_base: Path) -> Path:
    """A fresh learner data dir with the embedded base already materialised."""
    d = tmp_path / "node"
    d.mkdir()
    shutil.copytree(embedded_base, d / "base")
    return d


def make_data_dir(root: Path, embedded_base: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    shutil.copytree(embedded_base, d / "base")
    return d


@pytest.fixture(scope="session")
def local_qwen() -> Path:
    """The TINY Qwen2-architecture model dir (node.learner.local_qwen), built once per cache
    (``$SWARM_NODE_MODEL_CACHE`` or the temp dir; ~10 s of CPU the first time)."""
    from node.learner.local_qwen import ensure_local_qwen

    return ensure_local_qwen()
