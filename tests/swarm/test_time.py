"""The time protocol (swarm.clock): a peer's clock offset, exact to half a round trip, and a
budget per asker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SKEW_MS = 42_000


def test_a_peer_tells_its_time_once_per_interval_and_an_old_peer_not_at_all() -> None:
    out = subprocess.run([sys.executable, "-m", "tests.swarm.time_check", str(SKEW_MS)],
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # the server's clock runs SKEW_MS ahead: measured within half the round trip (+ 1 ms of
    # integer rounding)
    assert abs(seen["offset_ms"] - SKEW_MS) <= seen["rtt_ms"] // 2 + 1, seen
    assert seen["again"] != "answered" and seen["old"] != "answered", seen
    assert (seen["served"], seen["refused"]) == (1, 1), seen
