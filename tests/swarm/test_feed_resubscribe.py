"""A feed whose stream the source ends while the connection stays up is opened again at once
(swarm.feeds, issue 33: hole punching replaces the relayed connection a feed ran on), once per
``feeds.cooldown_s``: real hosts on loopback (tests/swarm/feed_resubscribe_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


RETRY_S = 5.0
"""swarm.feeds.RETRY_S: the failure path's first cool-down (not imported: libp2p stays out of
this process)."""


def test_a_feed_ended_by_its_connected_source_is_reopened_at_once_and_only_once() -> None:
    out = subprocess.run([sys.executable, "-m", "tests.swarm.feed_resubscribe_check"],
                         capture_output=True, text=True, timeout=240, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # 1. reset: subscribed again in the same slot and trial, with no failure and no
    # cool-down, and every batch published afterwards arrived (each waited for in turn)
    assert seen["reset_ended"] == 1, seen
    assert seen["reset_counts"] == {"feed_opened": 1, "feed_resubscribed": 1, "feed_failed": 0,
                                    "feed_refused": 0, "accepted": 2, "rejected_rate": 0}, seen
    assert seen["same_slot"] and not seen["cooling_after_reset"], seen
    assert len(seen["after_reset"]) == 5, seen
    # the first batch after the reset came sooner than the failure path could bring it
    assert seen["reset_gap_s"] < RETRY_S, seen
    # 2. a second end within feeds.cooldown_s: the failure path (cooled, no new stream)
    assert seen["eof_ended"] == 1, seen
    assert seen["eof_counts"] == {"feed_opened": 1, "feed_resubscribed": 1, "feed_failed": 1,
                                  "feed_refused": 0, "accepted": 2, "rejected_rate": 0}, seen
    assert seen["cooling_after_eof"], seen
    assert len(seen["after_eof"]) == 2, seen  # picked again after the cool-down
    # 3. past the window, the source drops the connection: no stream on a closed connection
    assert seen["disconnect_ended"] == 1 and seen["disconnect_after_s"] >= 10.0, seen
    assert seen["disconnect_counts"]["feed_resubscribed"] == 1, seen
    assert seen["disconnect_counts"]["feed_failed"] == 2, seen
