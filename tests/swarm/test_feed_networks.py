"""A network's keys hold at most ``feeds.max_per_network`` feed slots while sources elsewhere
are left, placed by the connection a feed runs on (swarm.networks, issue 32): real hosts on
loopback in three 127/8 networks (tests/swarm/feed_networks_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_a_farm_in_one_network_holds_at_most_its_cap_of_a_nodes_feed_slots() -> None:
    out = subprocess.run([sys.executable, "-m", "tests.swarm.feed_networks_check"],
                         capture_output=True, text=True, timeout=240, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # an IPv4 /24, an IPv6 /48 (a mapped IPv4 as IPv4), loopback none unless asked, a
    # circuit's relay, and one shared network for what names no address
    assert seen["of"] == ["203.0.113.0/24", "2001:db8:1::/48", "198.51.100.0/24", None,
                          "127.0.1.0/24", "unknown", "198.51.100.0/24", "unknown"], seen
    # 1. 6 farm keys and 2 honest sources, 4 slots, 2 per network: both honest ones held
    assert seen["spread"]["honest"] == 2 and seen["spread"]["farm"] == 2, seen
    assert seen["spread"]["networks"] == ["127.0.1.0/24", "127.0.1.0/24", "127.0.2.0/24",
                                          "127.0.3.0/24"], seen
    # 2. a farm key announcing a free network's address is picked for it (about half the
    # picks beside one honest candidate) until its connection shows the farm's network
    assert seen["held_refused"] == [False, False], seen
    assert seen["liar_placed_before"] == ["127.0.1.0/24", "127.0.9.0/24"], seen
    assert seen["liar_picked_before"] > 50, seen
    assert seen["liar_refused"] and seen["network_full"] == 1, seen
    assert seen["liar_placed_after"] == ["127.0.1.0/24"], seen
    assert seen["liar_picked_after"] == 0 and seen["honest_picked_after"] == 200, seen
