"""GossipConfig: every knob of the swarm process, JSON-able so a supervisor can pass it on."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from protocol.tables import TableError, build_table

__all__ = ["ROLLOUT_MODES", "GossipConfig"]

ROLLOUT_MODES = ("feeds", "flood")
_TUPLES = ("listen", "announce", "bootstrap", "capabilities", "collective_addrs")
_POSITIVE = ("target_peers", "max_peers", "bootstrap_timeout_s", "dial_timeout_s",
             "announce_interval_s", "announce_rate_per_s", "announce_interval_max_s",
             "announce_min_gap_s", "peer_ttl_s", "maintain_interval_s", "heartbeat_interval_s",
             "gossip_degree", "outbox_size", "inbox_size", "rate_per_s", "rate_burst",
             "replay_window_s", "log_every_s", "graylist_ban_s", "feed_sources", "feed_rotate_s",
             "feed_max_subscribers", "feed_queue", "feed_backfill_s", "feed_cooldown_s",
             "feed_subscribe_per_s", "feed_subscribe_burst", "feed_write_timeout_s",
             "feed_explore_slots",
             "reachability_interval_s", "relay_reservations", "relay_max_reservations",
             "relay_max_circuits", "relay_circuit_s", "relay_circuit_bytes",
             "relay_reservation_ttl_s")


@dataclass(frozen=True, kw_only=True)
class GossipConfig:
    """Configuration of one swarm process (``python -m swarm --config-json ...``)."""

    data_dir: str
    """Node data directory; the identity key is ``protocol.load_or_create_identity(data_dir)``."""
    listen: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/4001",)
    """TCP multiaddrs to listen on; port 0 picks a free port (the ready line reports it)."""
    announce: tuple[str, ...] = ()
    """Multiaddrs to advertise instead of the listen ones (NAT / port forwarding)."""
    bootstrap: tuple[str, ...] = ()
    """Full multiaddrs (``.../p2p/<peer id>``) of peers to join through."""
    swarm_id: str = "swarm-node-main"
    """Swarm namespace: part of every topic name and of every signed envelope."""
    bootstrap_only: bool = False
    """Relay gossip and announce, but serve no learner (a bootstrap peer)."""
    ipc_path: str | None = None
    """Unix socket path the learner connects to; None = no learner."""
    model: str = ""
    """Model fingerprint announced until the learner announces its own."""
    capabilities: tuple[str, ...] = ()
    """Capabilities announced until the learner announces its own."""
    collective_addrs: tuple[str, ...] = ()
    """hivemind multiaddrs announced until the learner announces its own."""
    target_peers: int = 8
    """Connections to keep: dial peers learned from announcements while below this."""
    max_peers: int = 64
    """Upper bound for target_peers; sets the host's connection watermarks (swarm.host)."""
    bootstrap_timeout_s: float = 60.0
    """Give up (exit non-zero) when no bootstrap peer answered within this time."""
    dial_timeout_s: float = 10.0
    """Limit for one dial."""
    announce_interval_s: float = 5.0
    """Shortest period of this peer's signed PeerAnnouncement (used while the swarm is small)."""
    announce_rate_per_s: float = 4.0
    """Announcements per second a node should receive from the whole swarm: this peer's period
    is the number of peers on schedule in its table / this, within [announce_interval_s,
    announce_interval_max_s] (swarm/peers.py, swarm/SCALING.md), so the announcement traffic
    per node stays flat as the swarm grows."""
    announce_interval_max_s: float = 600.0
    """Longest announcement period, and the longest period honoured when a peer states one (a
    farm of fresh keys cannot make honest peers announce more rarely than this)."""
    announce_min_gap_s: float = 1.0
    """Least spacing of this peer's announcements (profile changes are coalesced); one from a
    peer less than half of this after its previous one is ignored, not relayed."""
    peer_ttl_s: float = 30.0
    """Forget a peer whose last announcement is older than this, or than 3 times the period
    it states when longer (swarm/peers.py: its period grows with the swarm)."""
    maintain_interval_s: float = 2.0
    """Period of the connection-maintenance loop (dial up to target_peers)."""
    heartbeat_interval_s: int = 1
    """Gossipsub heartbeat period (mesh maintenance, score decay), whole seconds."""
    gossip_degree: int = 6
    """Gossipsub mesh degree D (D_low = D - 2, D_high = 2 D)."""
    publish_interval_s: float = 0.02
    """Minimum spacing between two of this peer's publishes (the outbound queue is 32)."""
    outbox_size: int = 64
    """Messages waiting to be published; a learner publishing faster waits."""
    inbox_size: int = 1024
    """Validated messages held per type for the learner; beyond, the oldest are dropped."""
    rate_per_s: float = 20.0
    """Token-bucket refill rate: messages per second accepted from one sender."""
    rate_burst: int = 40
    """Token-bucket capacity per sender."""
    replay_window_s: float = 300.0
    """Accept messages created at most this long ago (and remember their nonces)."""
    max_future_s: float = 30.0
    """Accept messages created at most this far in the future (clock skew)."""
    invalid_message_weight: float = 10.0
    """Gossipsub score penalty per invalid message (P4; positive: py-libp2p subtracts it)."""
    graylist_threshold: float = -100.0
    """Score below which a peer is graylisted: disconnected and banned (graylist_ban_s)."""
    graylist_ban_s: float = 120.0
    """How long a graylisted peer is refused (its score is forgotten when it disconnects)."""
    log_every_s: float = 10.0
    """At most one log line per rejection reason and period (rate-limited logging)."""
    rollout_mode: str = "feeds"
    """How rollouts travel: "feeds" (each node subscribes to feed_sources peers it picks and
    rotates; inbound bounded whatever the swarm size, swarm/SCALING.md) or "flood" (every
    batch to every node on the rollouts gossip topic; O(N) per node, kept as the baseline)."""
    feed_sources: int = 4
    """Feeds a node holds open at once (distinct source peers)."""
    feed_rotate_s: float = 10.0
    """Every this many seconds the oldest feed is closed and another source is picked."""
    feed_max_subscribers: int = 12
    """Feeds this node serves at once; further subscription requests are answered busy."""
    feed_queue: int = 8
    """Batches queued per subscriber; a subscriber that does not keep up loses the newest."""
    feed_backfill_s: float = 30.0
    """A new subscriber first receives our newest batch if it is at most this old."""
    feed_cooldown_s: float = 60.0
    """A source that sent an invalid frame is not picked for this long (one that refused,
    failed or delivered nothing (below): 5 s, doubling per consecutive time, up to this)."""
    feed_trial_rounds: int = 8
    """A feed whose source delivered no group that carried signal in this many of the
    learner's rounds (its reports, swarm.feeds) while another feed delivered is closed and
    its source cooled (5 s, doubling); 0 = never."""
    feed_explore_slots: int = 1
    """Of ``feed_sources``, the slots left to sources that have delivered nothing yet once
    enough sources that did are known (swarm.feeds: a farm of fresh keys gets these only)."""
    feed_subscribe_per_s: float = 0.5
    """Subscription requests accepted per second from one peer (token bucket refill)."""
    feed_subscribe_burst: int = 4
    """Token-bucket capacity of subscription requests per peer."""
    feed_write_timeout_s: float = 10.0
    """A feed whose write stalls this long is ended (the subscriber stopped reading)."""
    reachability_interval_s: float = 300.0
    """Re-check reachability (dial-back requests to peers, swarm.reachability) this often."""
    relay_service: bool = True
    """Act as a circuit relay for peers behind NAT when reachable (a bootstrap peer always)."""
    relay_reservations: int = 2
    """Relays to hold a reservation on when peers cannot dial this node."""
    relay_max_reservations: int = 32
    """As a relay: peers that may hold a reservation here at once."""
    relay_max_circuits: int = 64
    """As a relay: relayed connections open at once."""
    relay_circuit_s: float = 3600.0
    """As a relay: a relayed connection is reset after this long (the dialer re-dials)."""
    relay_circuit_bytes: int = 1 << 30
    """As a relay: a relayed connection is reset after this many bytes."""
    relay_reservation_ttl_s: float = 3600.0
    """As a relay: reservations expire after this long unless refreshed."""

    def __post_init__(self) -> None:
        for name in _TUPLES:
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise TableError(name, "must be a sequence of non-empty strings")
            object.__setattr__(self, name, tuple(value))
        if not self.data_dir:
            raise TableError("data_dir", "must be set")
        if not self.listen:
            raise TableError("listen", "needs at least one multiaddr")
        if not self.swarm_id or len(self.swarm_id) > 64 or "/" in self.swarm_id:
            raise TableError("swarm_id", "must be 1..64 characters without '/'")
        if self.ipc_path is not None and not self.ipc_path:
            raise TableError("ipc_path", "must be a path or None")
        if self.ipc_path is not None and self.bootstrap_only:
            raise TableError("bootstrap_only", "a bootstrap_only peer serves no learner (ipc_path)")
        for name in _POSITIVE:
            if not getattr(self, name) > 0:
                raise TableError(name, f"must be positive, got {getattr(self, name)}")
        if self.gossip_degree < 3:
            raise TableError("gossip_degree", "must be at least 3")
        if self.max_peers < self.target_peers:
            raise TableError("max_peers", "must be >= target_peers")
        if self.feed_explore_slots > self.feed_sources:
            raise TableError("feed_explore_slots", "must be <= feed_sources")
        for name in ("publish_interval_s", "max_future_s", "feed_trial_rounds"):
            if getattr(self, name) < 0:
                raise TableError(name, "must be >= 0")
        if self.invalid_message_weight < 0:
            raise TableError("invalid_message_weight", "must be >= 0 (it is subtracted)")
        if self.graylist_threshold >= 0:
            raise TableError("graylist_threshold", "must be negative")
        if self.rollout_mode not in ROLLOUT_MODES:
            raise TableError("rollout_mode", f"must be one of {list(ROLLOUT_MODES)}, "
                                             f"got {self.rollout_mode!r}")
        if not isinstance(self.relay_service, bool):
            raise TableError("relay_service", "must be a bool")
        if self.relay_reservation_ttl_s < 120:
            raise TableError("relay_reservation_ttl_s", "must be >= 120 (refreshed 60 s before "
                                                        "expiry)")
        if self.peer_ttl_s <= self.announce_interval_s:
            raise TableError("peer_ttl_s", "must exceed announce_interval_s")
        if not self.announce_interval_s <= self.announce_interval_max_s <= 86_400:
            raise TableError("announce_interval_max_s", "must be in [announce_interval_s, 86400]")
        if self.announce_min_gap_s > self.announce_interval_s:
            raise TableError("announce_min_gap_s", "must not exceed announce_interval_s")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (tuples become lists)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GossipConfig:
        """Inverse of to_dict. Unknown keys (a typo must not pass silently), wrong types and
        values out of range raise ``protocol.tables.TableError`` (a ValueError) naming the key."""
        return build_table(cls, d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> GossipConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"GossipConfig: invalid JSON: {e}") from None
        return cls.from_dict(d)
