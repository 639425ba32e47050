from __future__ import annotations

import pytest

from tests.collectives.harness import Swarm


@pytest.fixture
def swarm(tmp_path):
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        s.close()
