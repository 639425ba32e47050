"""swarm.feeds without a network (budgets, choice of sources, rotation, invalid frames).

The checks live in tests/swarm/feeds_checks.py and run in one child interpreter: libp2p
cannot be imported into a test process that imported hivemind (other tests of a session do).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import pytest

NAMES = [
    "server_refuses_beyond_its_budget_and_frees_a_slot_on_hang_up",
    "server_budgets_requests_per_peer_and_checks_the_swarm",
    "a_slow_subscriber_loses_batches_instead_of_blocking_the_source",
    "sources_are_picked_uniformly_and_never_bootstrap_self_banned_or_cooling",
    "the_client_holds_k_feeds_and_rotates_the_oldest",
    "a_rotation_asks_for_live_batches_only_and_a_gap_fill_for_the_newest",
    "an_invalid_frame_closes_the_feed_and_cools_its_source_down",
    "announcements_signed_closer_than_half_the_min_gap_are_ignored",
    "a_source_behind_nat_is_dialled_through_its_relay_and_kept_when_that_fails",
    "sources_that_deliver_hold_all_but_the_exploration_slot_and_idle_ones_are_dropped",
    "the_exploration_slot_rotates_even_when_every_held_source_is_live",
    "while_signal_flows_live_candidates_go_uniform_and_silent_live_sources_rotate",
    "while_nothing_arrives_rotations_come_every_wait",
    "while_searching_every_slot_not_proven_tries_a_stranger_for_one_wait",
]


@cache
def results() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "tests.swarm.feeds_checks"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_check_is_listed() -> None:
    assert sorted(results()) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_feeds(name: str) -> None:
    assert results()[name] == "ok", results()[name]
