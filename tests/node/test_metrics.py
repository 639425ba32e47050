"""The opt-in Prometheus endpoint serves the same counters as the status view."""

from __future__ import annotations

import urllib.request

from node.metrics import Metrics
from protocol.records import RoundRecord, Status, StepRecord


def test_metrics_endpoint_serves_round_counters():
    m = Metrics(0, addr="127.0.0.1")
    try:
        m.on_round(RoundRecord.from_dict({"round": 4, "mean_reward": 0.25, "peers": 3, "rollouts_published": 8,
                    "rollouts_received": 5, "external_used": 4,
                    "rejected_by_reason": {"bad_signature": 2},
                    "gossip_rejected": {"stale": 3},
                    "heldout": {"greedy_accuracy": 0.5, "sampled_accuracy": 0.375},
                    "feeds": {"proven": 1, "live": 2, "trial": 1, "idle": 1, "dropped_idle": 7,
                              "dropped_no_signal": 1, "idle_slot_rounds": 30,
                              "searched": 6, "network_full": 4},
                    "generator_busy": 0.875, "trainer_busy": 0.75, "dropped_stale": 8}))
        m.on_outer(StepRecord(step=0, status=Status.OK, version=1, param_hash="h",
                              observed={"blames_total": {"no_show": 3, "leader_stalled": 1,
                                                         "made_up": 9}}))
        body = urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10).read()
        text = body.decode()
    finally:
        m.close()
    assert "swarm_node_round 4.0" in text
    assert "swarm_node_mean_reward 0.25" in text
    assert 'swarm_node_rollouts_total{direction="received"} 5.0' in text
    assert 'swarm_node_rejected_total{reason="bad_signature"} 2.0' in text
    assert 'swarm_node_outer_steps_total{status="ok"} 1.0' in text
    assert 'swarm_node_outer_held_off{reason="no_show"} 3.0' in text
    assert 'swarm_node_outer_held_off{reason="leader_stalled"} 1.0' in text
    assert "made_up" not in text
    assert 'swarm_node_gossip_rejected{reason="stale"} 3.0' in text
    assert 'swarm_node_heldout_accuracy{decoding="greedy"} 0.5' in text
    assert 'swarm_node_heldout_accuracy{decoding="sampled"} 0.375' in text
    assert 'swarm_node_feed_sources{kind="live"} 2.0' in text
    assert 'swarm_node_feed_sources{kind="idle"} 1.0' in text
    assert 'swarm_node_feeds_dropped{reason="idle"} 7.0' in text
    assert "swarm_node_feed_idle_slot_rounds 30.0" in text
    assert 'swarm_node_feeds_dropped{reason="network_full"} 4.0' in text
    assert "swarm_node_feed_searched 6.0" in text
    assert 'swarm_node_busy{part="generator"} 0.875' in text
    assert 'swarm_node_busy{part="trainer"} 0.75' in text
    assert "swarm_node_dropped_stale_groups_total 8.0" in text
