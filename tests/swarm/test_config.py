"""GossipConfig: its sub-tables by concern, the JSON a supervisor hands the swarm child, and
the flat keys of the table before the split (issue 30), which still work."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from protocol.tables import TableError
from swarm.config import (
    AnnouncementsConfig,
    FeedsConfig,
    GossipConfig,
    LimitsConfig,
    PeersConfig,
    PubsubConfig,
    RelayConfig,
    ScoringConfig,
)

OLD_FLAT = {  # every key of the flat [gossip] table before the split, none at its default
    "data_dir": "/d", "listen": ["/ip4/127.0.0.1/tcp/0"], "announce": ["/ip4/1.2.3.4/tcp/4001"],
    "bootstrap": ["/ip4/1.2.3.4/tcp/1/p2p/x"], "swarm_id": "old-swarm", "bootstrap_only": False,
    "ipc_path": "/s", "model": "m", "capabilities": ["train"], "collective_addrs": ["/ip4/a"],
    "target_peers": 5, "max_peers": 50, "bootstrap_timeout_s": 61.0, "dial_timeout_s": 11.0,
    "announce_interval_s": 4.0, "announce_rate_per_s": 3.0, "announce_interval_max_s": 500.0,
    "announce_min_gap_s": 0.5, "peer_ttl_s": 31.0, "maintain_interval_s": 2.5,
    "heartbeat_interval_s": 2, "gossip_degree": 5, "publish_interval_s": 0.03, "outbox_size": 65,
    "inbox_size": 1025, "rate_per_s": 21.0, "rate_burst": 41, "replay_window_s": 301.0,
    "max_future_s": 31.0, "invalid_message_weight": 11.0, "graylist_threshold": -99.0,
    "graylist_ban_s": 121.0, "log_every_s": 11.0, "rollout_mode": "flood", "feed_sources": 5,
    "feed_rotate_s": 11.0, "feed_max_subscribers": 13, "feed_queue": 9, "feed_backfill_s": 31.0,
    "feed_cooldown_s": 61.0, "feed_trial_rounds": 9, "feed_explore_slots": 2,
    "feed_subscribe_per_s": 0.6, "feed_subscribe_burst": 5, "feed_write_timeout_s": 11.0,
    "reachability_interval_s": 301.0, "relay_service": False, "relay_reservations": 3,
    "relay_max_reservations": 33, "relay_max_circuits": 65, "relay_circuit_s": 3601.0,
    "relay_circuit_bytes": 1 << 29, "relay_reservation_ttl_s": 3601.0,
}
SECTIONS = {"peers": PeersConfig, "announcements": AnnouncementsConfig, "pubsub": PubsubConfig,
            "limits": LimitsConfig, "scoring": ScoringConfig, "feeds": FeedsConfig,
            "relay": RelayConfig}


def _at(config: GossipConfig, dotted: str) -> object:
    value: object = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


ADDED_SINCE = {"feeds.probe_rounds", "feeds.probe_s", "relay.hole_punch", "relay.hole_punch_idle_s",
               "relay.upnp", "relay.upnp_lease_s", "feeds.max_per_network",
               "feeds.network_prefix_v4", "feeds.network_prefix_v6", "feeds.loopback_networks"}
"""Sub-table keys added after the split (issues 32, 33): they never had a flat name."""


def test_every_moved_key_names_a_field_of_its_sub_table_and_every_old_key_has_a_place():
    top = {f.name for f in dataclasses.fields(GossipConfig)} - set(SECTIONS)
    assert set(GossipConfig.MOVED_KEYS) == set(OLD_FLAT) - top
    assert len(GossipConfig.MOVED_KEYS) == 41
    for old, new in GossipConfig.MOVED_KEYS.items():
        section, key = new.split(".")
        assert key in {f.name for f in dataclasses.fields(SECTIONS[section])}, old
    placed = {new for new in GossipConfig.MOVED_KEYS.values()}  # no two old keys on one place
    assert len(placed) == len(GossipConfig.MOVED_KEYS)
    fields = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert placed == fields - ADDED_SINCE  # and every other sub-table field was a flat key once


def test_an_old_flat_table_lands_every_value_at_its_new_place_with_a_warning(caplog):
    default = GossipConfig(data_dir="/elsewhere")
    with caplog.at_level(logging.WARNING, logger="protocol.tables"):
        config = GossipConfig.from_dict(OLD_FLAT)
    for old, value in OLD_FLAT.items():
        new = GossipConfig.MOVED_KEYS.get(old, old)
        want = tuple(value) if isinstance(value, list) else value
        assert _at(config, new) == want, old
        assert _at(default, new) != want or old == "bootstrap_only", old  # a test of the move
        if old in GossipConfig.MOVED_KEYS:
            section, key = new.split(".")
            assert f"key {old} is now {key} in [{section}]" in caplog.text
    assert GossipConfig.from_json(config.to_json()) == config


def test_the_nested_form_builds_without_a_warning_and_round_trips(caplog):
    table = {"data_dir": "/d", "rollout_mode": "flood", "peers": {"target": 4, "ttl_s": 12.0},
             "feeds": {"sources": 3, "explore_slots": 3}, "relay": {"service": False}}
    with caplog.at_level(logging.WARNING, logger="protocol.tables"):
        config = GossipConfig.from_dict(table)
    assert caplog.text == ""
    assert config.peers == PeersConfig(target=4, ttl_s=12.0)
    assert config.feeds == FeedsConfig(sources=3, explore_slots=3)
    assert config.relay == RelayConfig(service=False) and config.limits == LimitsConfig()
    d = config.to_dict()
    assert d["peers"]["target"] == 4 and d["listen"] == ["/ip4/0.0.0.0/tcp/4001"]
    assert json.loads(json.dumps(d)) == d  # JSON-able: lists and dicts only
    assert GossipConfig.from_dict(d) == config
    assert GossipConfig.from_json(config.to_json()) == config


def test_config_round_trips_through_json_and_rejects_bad_values() -> None:
    c = GossipConfig(data_dir="/d", bootstrap=("/ip4/1.2.3.4/tcp/1/p2p/x",), ipc_path="/s",
                     feeds=FeedsConfig(sources=2, explore_slots=2))
    again = GossipConfig.from_json(json.dumps(c.to_dict()))
    assert again == c and isinstance(again.listen, tuple)
    with pytest.raises(ValueError, match=r"lisen: unknown key \(did you mean listen\?\)"):
        GossipConfig.from_dict({"data_dir": "/d", "lisen": []})
    with pytest.raises(ValueError, match="listen"):
        GossipConfig(data_dir="/d", listen="/ip4/0.0.0.0/tcp/1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bootstrap_only"):
        GossipConfig(data_dir="/d", bootstrap_only=True, ipc_path="/s")
    with pytest.raises(ValueError, match="rollout_mode"):
        GossipConfig(data_dir="/d", rollout_mode="gossip")
    assert GossipConfig(data_dir="/d").rollout_mode == "feeds"


@pytest.mark.parametrize("table, error", [
    ({"limits": {"rate_per_s": 0}}, "limits.rate_per_s: must be positive, got 0"),
    ({"scoring": {"graylist_threshold": 1.0}}, "scoring.graylist_threshold: must be negative"),
    ({"feeds": {"sources": 0}}, "feeds.sources: must be positive, got 0"),
    ({"feeds": {"sources": 2, "explore_slots": 3}}, "feeds.explore_slots: must be <= sources"),
    ({"feeds": {"network_prefix_v4": 33}}, r"feeds.network_prefix_v4: must be in \[8, 32\]"),
    ({"feeds": {"max_per_network": -1}}, "feeds.max_per_network: must be >= 0"),
    ({"peers": {"target": 9, "max": 8}}, "peers.max: must be >= target"),
    ({"pubsub": {"degree": 2}}, "pubsub.degree: must be at least 3"),
    ({"announcements": {"min_gap_s": 6.0}}, "announcements.min_gap_s: must not exceed"),
    ({"relay": {"reservation_ttl_s": 60}}, "relay.reservation_ttl_s: must be >= 120"),
    ({"peers": {"ttl_s": 5.0}}, "peers.ttl_s: must exceed announcements.interval_s"),
    ({"peer_ttl_s": 5.0}, "peers.ttl_s: must exceed announcements.interval_s"),  # old key
    ({"feeds": {"sorces": 3}}, r"feeds.sorces: unknown key \(did you mean sources\?\)"),
    ({"feeds": 3}, "feeds: must be a table, got int 3"),
    ({"feed_sources": 3, "feeds": {"sources": 4}}, "feed_sources: given twice"),
])
def test_a_bad_sub_table_is_refused_naming_the_dotted_key(table, error):
    with pytest.raises(TableError, match=f"^{error}"):
        GossipConfig.from_dict({"data_dir": "/d", **table})


def test_a_sub_config_is_checked_on_its_own_and_must_be_one():
    with pytest.raises(TableError, match="^sources: must be positive"):
        FeedsConfig(sources=0)
    with pytest.raises(TableError, match="^feeds: must be a FeedsConfig"):
        GossipConfig(data_dir="/d", feeds={"sources": 3})  # type: ignore[arg-type]
