"""The host speaks Noise only: a peer that offers only plaintext cannot connect."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.swarm.conftest import Procs

pytestmark = pytest.mark.slow


def dial(addr: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.swarm.plain_dialer", addr, mode],
                         capture_output=True, text=True, timeout=90, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plaintext_peer_is_refused_and_noise_peer_accepted(procs: Procs) -> None:
    node = procs.node("n", learner=False)
    plain = dial(node.addr, "plaintext")
    assert not plain["connected"] and plain["error"], plain
    noise = dial(node.addr, "noise")
    assert noise["connected"] and not noise["error"], noise
