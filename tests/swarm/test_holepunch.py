"""The shape of py-libp2p 0.8.1's private DCUtR and relay parts that swarm.holepunch leans on
(tests/swarm/holepunch_checks.py), pinned so that an upgrade fails here, not a NATed volunteer.

The checks run in a child interpreter: libp2p cannot be imported into a test process that
imported hivemind (their protobufs both define crypto.pb.KeyType; a fresh-clone CI run failed
to collect the suite with the checks imported here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_libp2p_private_parts_keep_their_shape() -> None:
    checks = Path(__file__).with_name("holepunch_checks.py")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(checks)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-2000:]
