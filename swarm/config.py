"""GossipConfig: every knob of the swarm process, JSON-able so a supervisor can pass it on.

The node's identity and addresses sit at the top; the rest is grouped by concern, one frozen
dataclass per sub-table (``[gossip.peers]``, ``[gossip.feeds]``, ...)::

    GossipConfig ─┬─ peers          PeersConfig          connections (swarm.discovery)
                  ├─ announcements  AnnouncementsConfig  this peer's announcements
                  ├─ pubsub         PubsubConfig         gossipsub and the learner's queues
                  ├─ limits         LimitsConfig         per-sender rate and time window
                  ├─ scoring        ScoringConfig        invalid-message penalty, graylist
                  ├─ feeds          FeedsConfig          rollout feeds (swarm.feeds)
                  └─ relay          RelayConfig          reachability and circuit relays

The flat keys these replaced (``target_peers``, ``feed_sources``, ...) still work in a table
(``GossipConfig.MOVED_KEYS``), with a warning that names their new place.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from protocol.tables import TableError, build_table, non_negative, positive

__all__ = ["ROLLOUT_MODES", "AnnouncementsConfig", "FeedsConfig", "GossipConfig", "LimitsConfig",
           "PeersConfig", "PubsubConfig", "RelayConfig", "ScoringConfig"]

ROLLOUT_MODES = ("feeds", "flood")
_TUPLES = ("listen", "announce", "bootstrap", "capabilities", "collective_addrs")


@dataclass(frozen=True, kw_only=True)
class PeersConfig:
    """Which connections the node keeps (swarm.discovery) and how long it remembers a peer."""

    target: int = 8
    """Connections to keep: dial peers learned from announcements while below this."""
    max: int = 64
    """Upper bound for ``target``; sets the host's connection watermarks (swarm.host)."""
    bootstrap_timeout_s: float = 60.0
    """Give up (exit non-zero) when no bootstrap peer answered within this time."""
    dial_timeout_s: float = 10.0
    """Limit for one dial (peers, feeds, relays, dial-back checks)."""
    ttl_s: float = 30.0
    """Forget a peer whose last announcement is older than this, or than 3 times the period
    it states when longer (swarm/peers.py: its period grows with the swarm). Must exceed
    ``announcements.interval_s``."""
    maintain_interval_s: float = 2.0
    """Period of the connection-maintenance loop (dial up to ``target``)."""

    def __post_init__(self) -> None:
        positive(self, "target", "max", "bootstrap_timeout_s", "dial_timeout_s", "ttl_s",
                  "maintain_interval_s")
        if self.max < self.target:
            raise TableError("max", "must be >= target")


@dataclass(frozen=True, kw_only=True)
class AnnouncementsConfig:
    """This peer's signed PeerAnnouncement: how often it is sent (swarm/peers.py,
    swarm/SCALING.md) and how often one from a peer is taken."""

    interval_s: float = 5.0
    """Shortest announcement period (used while the swarm is small)."""
    rate_per_s: float = 4.0
    """Announcements per second a node should receive from the whole swarm: this peer's period
    is the number of peers on schedule in its table / this, within [``interval_s``,
    ``interval_max_s``], so the announcement traffic per node stays flat as the swarm grows."""
    interval_max_s: float = 600.0
    """Longest announcement period, and the longest period honoured when a peer states one (a
    farm of fresh keys cannot make honest peers announce more rarely than this)."""
    min_gap_s: float = 1.0
    """Least spacing of this peer's announcements (profile changes are coalesced); one from a
    peer less than half of this after its previous one is ignored, not relayed."""

    def __post_init__(self) -> None:
        positive(self, "interval_s", "rate_per_s", "interval_max_s", "min_gap_s")
        if not self.interval_s <= self.interval_max_s <= 86_400:
            raise TableError("interval_max_s", "must be in [interval_s, 86400]")
        if self.min_gap_s > self.interval_s:
            raise TableError("min_gap_s", "must not exceed interval_s")


@dataclass(frozen=True, kw_only=True)
class PubsubConfig:
    """The gossipsub router (swarm.host) and the queues between it and the learner."""

    heartbeat_interval_s: int = 1
    """Gossipsub heartbeat period (mesh maintenance, score decay), whole seconds."""
    degree: int = 6
    """Gossipsub mesh degree D (D_low = D - 2, D_high = 2 D); at least 3."""
    publish_interval_s: float = 0.02
    """Minimum spacing between two of this peer's publishes (the outbound queue is 32)."""
    outbox_size: int = 64
    """Messages waiting to be published; a learner publishing faster waits."""
    inbox_size: int = 1024
    """Validated messages held per type for the learner; beyond, the oldest are dropped."""

    def __post_init__(self) -> None:
        positive(self, "heartbeat_interval_s", "degree", "outbox_size", "inbox_size")
        non_negative(self, "publish_interval_s")
        if self.degree < 3:
            raise TableError("degree", "must be at least 3")


@dataclass(frozen=True, kw_only=True)
class LimitsConfig:
    """What one sender may send (swarm.validation: token buckets and the replay guard)."""

    rate_per_s: float = 20.0
    """Token-bucket refill rate: messages per second accepted from one sender."""
    rate_burst: int = 40
    """Token-bucket capacity per sender."""
    replay_window_s: float = 300.0
    """Accept messages created at most this long ago (and remember their nonces)."""
    max_future_s: float = 30.0
    """Accept messages created at most this far in the future (clock skew; ``swarm-node
    doctor`` checks the node's clock against it)."""

    def __post_init__(self) -> None:
        positive(self, "rate_per_s", "rate_burst", "replay_window_s")
        non_negative(self, "max_future_s")


@dataclass(frozen=True, kw_only=True)
class ScoringConfig:
    """The gossipsub peer score: invalid messages lower it, below a threshold a peer is
    graylisted (swarm.host, swarm.pubsub)."""

    invalid_message_weight: float = 10.0
    """Score penalty per invalid message (P4; positive: py-libp2p subtracts it)."""
    graylist_threshold: float = -100.0
    """Score below which a peer is graylisted: disconnected and banned (``graylist_ban_s``)."""
    graylist_ban_s: float = 120.0
    """How long a graylisted peer is refused (its score is forgotten when it disconnects)."""

    def __post_init__(self) -> None:
        if self.invalid_message_weight < 0:
            raise TableError("invalid_message_weight", "must be >= 0 (it is subtracted)")
        if self.graylist_threshold >= 0:
            raise TableError("graylist_threshold", "must be negative")
        positive(self, "graylist_ban_s")


@dataclass(frozen=True, kw_only=True)
class FeedsConfig:
    """Rollout feeds (``rollout_mode = "feeds"``, swarm.feeds, swarm/SCALING.md): the feeds
    this node holds to sources it picks, and the ones it serves."""

    sources: int = 4
    """Feeds a node holds open at once (distinct source peers)."""
    rotate_s: float = 10.0
    """Every this many seconds the oldest feed is closed and another source is picked."""
    max_subscribers: int = 12
    """Feeds this node serves at once; further subscription requests are answered busy."""
    queue: int = 8
    """Batches queued per subscriber; a subscriber that does not keep up loses the newest."""
    backfill_s: float = 30.0
    """A new subscriber first receives our newest batch if it is at most this old."""
    cooldown_s: float = 60.0
    """A source that sent an invalid frame is not picked for this long (one that refused,
    failed or delivered nothing (below): 5 s, doubling per consecutive time, up to this)."""
    trial_rounds: int = 8
    """A feed that delivered no group passing re-scoring in this many of the learner's
    rounds (its reports, swarm.feed_standing) is closed and its source cooled (5 s, doubling
    per time): a new source's at once, a known source's while another feed delivered. One
    that delivered such groups but none with signal is closed after 2x this (a proven
    source's 4x) while another feed delivered signal. 0 = no feed is judged."""
    probe_rounds: int = 2
    """A feed from a source that has delivered nothing yet and that brings no frame at all
    in this many of the learner's rounds (and ``probe_s``) is closed (an honest source
    answers a new subscription with its newest batch, or publishes within its round);
    0 = never."""
    probe_s: float = 10.0
    """The longest wait before a feed is closed for bringing nothing (no frame, or no group
    passing re-scoring), and the wait until some feed delivered; then 3 of the swarm's gaps
    between two batches of one source, at least 1 s (swarm.feed_standing): a learner whose
    rounds skip training reports faster than honest sources publish."""
    explore_slots: int = 1
    """Of ``sources``, the slots left to sources that have delivered nothing yet once enough
    sources that did are known (swarm.feeds: a farm of fresh keys gets these only)."""
    subscribe_per_s: float = 0.5
    """Subscription requests accepted per second from one peer (token bucket refill)."""
    subscribe_burst: int = 4
    """Token-bucket capacity of subscription requests per peer."""
    write_timeout_s: float = 10.0
    """A feed whose write stalls this long is ended (the subscriber stopped reading)."""
    max_per_network: int = 2
    """Slots that sources of one network (swarm.networks: an IPv4 /``network_prefix_v4``,
    an IPv6 /``network_prefix_v6``, a relay) hold while candidates from other networks are
    left: a farm of keys on one machine holds at most these; 0 = no cap."""
    network_prefix_v4: int = 24
    """IPv4 addresses that share this many leading bits are one network."""
    network_prefix_v6: int = 48
    """IPv6 addresses that share this many leading bits are one network."""
    loopback_networks: bool = False
    """Count loopback addresses as networks too (tests on one machine, listening on
    distinct 127/8 addresses); off, every loopback source is in no network (a one-machine
    swarm shares 127.0.0.1)."""

    def __post_init__(self) -> None:
        non_negative(self, "max_per_network")
        if not 8 <= self.network_prefix_v4 <= 32:
            raise TableError("network_prefix_v4", "must be in [8, 32]")
        if not 16 <= self.network_prefix_v6 <= 128:
            raise TableError("network_prefix_v6", "must be in [16, 128]")
        positive(self, "sources", "rotate_s", "max_subscribers", "queue", "backfill_s",
                  "cooldown_s", "probe_s", "explore_slots", "subscribe_per_s",
                  "subscribe_burst", "write_timeout_s")
        non_negative(self, "trial_rounds", "probe_rounds")
        if self.explore_slots > self.sources:
            raise TableError("explore_slots", "must be <= sources")


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """Reachability (swarm.reachability, swarm.nat) and circuit relays: the relays this node
    reserves a slot on when peers cannot dial it, and the relay it serves when they can."""

    reachability_interval_s: float = 300.0
    """Re-check reachability (dial-back requests to peers) this often."""
    service: bool = True
    """Act as a circuit relay for peers behind NAT when reachable (a bootstrap peer always)."""
    reservations: int = 2
    """Relays to hold a reservation on when peers cannot dial this node."""
    max_reservations: int = 32
    """As a relay: peers that may hold a reservation here at once."""
    max_circuits: int = 64
    """As a relay: relayed connections open at once."""
    circuit_s: float = 3600.0
    """As a relay: a relayed connection is reset after this long (the dialer re-dials)."""
    circuit_bytes: int = 1 << 30
    """As a relay: a relayed connection is reset after this many bytes."""
    reservation_ttl_s: float = 3600.0
    """As a relay: reservations expire after this long unless refreshed (>= 120: they are
    refreshed 60 s before expiry)."""
    hole_punch: bool = True
    """Upgrade a relayed connection to a direct one by hole punching (DCUtR, swarm.holepunch):
    the peer with the lower id drives, at most 3 attempts per peer; a failed punch leaves the
    connection relayed."""
    hole_punch_idle_s: float = 10.0
    """After a punch, the relayed connection is closed once none of its collective tunnels
    moved a byte for this long (new tunnels already go direct; a running exchange is not cut)."""
    upnp: bool = True
    """Ask the router on the LAN (UPnP-IGD, swarm.upnp) to forward the swarm port and the
    collective port to this node, so that peers dial it directly (``public``, no relay); the
    mappings are renewed and removed when the node stops. Not tried with ``announce`` set or
    when listening on loopback only; a node without such a router carries on as without it."""
    upnp_lease_s: float = 3600.0
    """Lease asked for each UPnP mapping (>= 10); renewed at half of it, so a node that dies
    without removing its mappings leaves them to the router for at most this long."""

    def __post_init__(self) -> None:
        for name in ("service", "hole_punch", "upnp"):
            if not isinstance(getattr(self, name), bool):
                raise TableError(name, "must be a bool")
        positive(self, "reachability_interval_s", "reservations", "max_reservations",
                  "max_circuits", "circuit_s", "circuit_bytes", "reservation_ttl_s",
                  "hole_punch_idle_s")
        if self.reservation_ttl_s < 120:
            raise TableError("reservation_ttl_s", "must be >= 120 (refreshed 60 s before expiry)")
        if not self.upnp_lease_s >= 10:
            raise TableError("upnp_lease_s", "must be >= 10 (renewed at half of it)")


_SECTIONS: dict[str, type] = {"peers": PeersConfig, "announcements": AnnouncementsConfig,
                              "pubsub": PubsubConfig, "limits": LimitsConfig,
                              "scoring": ScoringConfig, "feeds": FeedsConfig,
                              "relay": RelayConfig}


@dataclass(frozen=True, kw_only=True)
class GossipConfig:
    """Configuration of one swarm process (``python -m swarm --config-json ...``)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "target_peers": "peers.target", "max_peers": "peers.max",
        "bootstrap_timeout_s": "peers.bootstrap_timeout_s",
        "dial_timeout_s": "peers.dial_timeout_s", "peer_ttl_s": "peers.ttl_s",
        "maintain_interval_s": "peers.maintain_interval_s",
        "announce_interval_s": "announcements.interval_s",
        "announce_rate_per_s": "announcements.rate_per_s",
        "announce_interval_max_s": "announcements.interval_max_s",
        "announce_min_gap_s": "announcements.min_gap_s",
        "heartbeat_interval_s": "pubsub.heartbeat_interval_s", "gossip_degree": "pubsub.degree",
        "publish_interval_s": "pubsub.publish_interval_s", "outbox_size": "pubsub.outbox_size",
        "inbox_size": "pubsub.inbox_size",
        "rate_per_s": "limits.rate_per_s", "rate_burst": "limits.rate_burst",
        "replay_window_s": "limits.replay_window_s", "max_future_s": "limits.max_future_s",
        "invalid_message_weight": "scoring.invalid_message_weight",
        "graylist_threshold": "scoring.graylist_threshold",
        "graylist_ban_s": "scoring.graylist_ban_s",
        "feed_sources": "feeds.sources", "feed_rotate_s": "feeds.rotate_s",
        "feed_max_subscribers": "feeds.max_subscribers", "feed_queue": "feeds.queue",
        "feed_backfill_s": "feeds.backfill_s", "feed_cooldown_s": "feeds.cooldown_s",
        "feed_trial_rounds": "feeds.trial_rounds", "feed_explore_slots": "feeds.explore_slots",
        "feed_subscribe_per_s": "feeds.subscribe_per_s",
        "feed_subscribe_burst": "feeds.subscribe_burst",
        "feed_write_timeout_s": "feeds.write_timeout_s",
        "reachability_interval_s": "relay.reachability_interval_s",
        "relay_service": "relay.service", "relay_reservations": "relay.reservations",
        "relay_max_reservations": "relay.max_reservations",
        "relay_max_circuits": "relay.max_circuits", "relay_circuit_s": "relay.circuit_s",
        "relay_circuit_bytes": "relay.circuit_bytes",
        "relay_reservation_ttl_s": "relay.reservation_ttl_s",
    }
    """The flat keys of the single table before it was split (issue 30), each at its new
    place: an old config file's ``[gossip]`` still works (protocol.tables)."""

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
    rollout_mode: str = "feeds"
    """How rollouts travel: "feeds" (each node subscribes to ``feeds.sources`` peers it picks
    and rotates; inbound bounded whatever the swarm size, swarm/SCALING.md) or "flood" (every
    batch to every node on the rollouts gossip topic; O(N) per node, kept as the baseline)."""
    log_every_s: float = 10.0
    """At most one log line per rejection reason and period (rate-limited logging)."""
    peers: PeersConfig = field(default_factory=PeersConfig)
    """Connections and the peer table."""
    announcements: AnnouncementsConfig = field(default_factory=AnnouncementsConfig)
    """This peer's announcements."""
    pubsub: PubsubConfig = field(default_factory=PubsubConfig)
    """Gossipsub and the learner's queues."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Per-sender rate and time window."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    """Peer score and graylist."""
    feeds: FeedsConfig = field(default_factory=FeedsConfig)
    """Rollout feeds."""
    relay: RelayConfig = field(default_factory=RelayConfig)
    """Reachability and circuit relays."""

    def __post_init__(self) -> None:
        for name in _TUPLES:
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise TableError(name, "must be a sequence of non-empty strings")
            object.__setattr__(self, name, tuple(value))
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TableError(name, f"must be a {cls.__name__}")
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
        if not self.log_every_s > 0:
            raise TableError("log_every_s", f"must be positive, got {self.log_every_s}")
        if self.rollout_mode not in ROLLOUT_MODES:
            raise TableError("rollout_mode", f"must be one of {list(ROLLOUT_MODES)}, "
                                             f"got {self.rollout_mode!r}")
        if self.peers.ttl_s <= self.announcements.interval_s:
            raise TableError("peers.ttl_s", "must exceed announcements.interval_s")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict, nested as the tables are (tuples become lists)."""
        return _jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GossipConfig:
        """Inverse of to_dict. Unknown keys (a typo must not pass silently), wrong types and
        values out of range raise ``protocol.tables.TableError`` (a ValueError) naming the key,
        dotted within a sub-table (``feeds.sources``); an old flat key (``MOVED_KEYS``) is
        taken at its new place with a warning."""
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


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
