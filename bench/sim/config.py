"""The simulation's inputs: per-message costs, the network, the gossip scheme, SAPO's sampling.

Every knob is a frozen keyword-only dataclass field with its meaning written next to it; the
defaults are the values of today's swarm (``swarm/config.py``, py-libp2p 0.8.1's gossipsub as
``swarm/host.py`` builds it, ``node/learner/config.py``'s ``SapoConfig``) or, for costs, the
calibrated values of ``bench/sim/calibrate.py`` (see ``bench/results/sim.json``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Costs", "Network", "Scheme", "Sapo", "Scenario", "SCHEMES"]

SCHEMES = ("flood", "feeds")
"""flood: one gossipsub topic everybody joins (main before issue 15). feeds: each node holds
``feed_sources`` one-hop feeds to peers it picks at random and replaces the oldest every
``feed_rotate_s`` (branch gossip, swarm/SCALING.md)."""


def _check_positive(obj: object, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) > 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be positive, got {getattr(obj, name)}")


def _check_non_negative(obj: object, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) >= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be >= 0, got {getattr(obj, name)}")


@dataclass(frozen=True, kw_only=True)
class Costs:
    """CPU and bytes one swarm process spends per message (one trio loop: one core)."""

    copy_ms: float = 1.0
    """Reading one inbound copy of a batch: yamux frame, Noise decrypt, varint, protobuf parse,
    the seen-cache check. Every copy pays it, the redundant ones included."""
    first_ms: float = 6.0
    """On top of ``copy_ms`` for the first copy: pubsub signature, our envelope validation,
    rate limit, replay window, inbox and IPC to the learner, mcache."""
    send_ms: float = 0.5
    """One outbound copy: protobuf serialise, Noise encrypt, yamux write."""
    publish_ms: float = 2.0
    """Publishing our own batch: sign, serialise (its copies cost ``send_ms`` each)."""
    control_ms: float = 0.3
    """One control RPC (IHAVE, IWANT, a feed subscription request or answer)."""
    control_id_ms: float = 0.005
    """Per message id listed in an IHAVE (hex decode, seen-cache lookup)."""
    batch_bytes: int = 4_000
    """Wire size of one RolloutBatch copy (envelope + pubsub framing)."""
    announce_bytes: int = 400
    """Wire size of one signed PeerAnnouncement copy (gossip, every ``announce_interval_s``)."""
    handshake_ms: float = 10.0
    """Opening (either side) one feed: stream open, protocol select, request and answer."""
    id_bytes: int = 50
    """Wire size of one message id in IHAVE/IWANT (py-libp2p: hex of from + seqno)."""
    control_bytes: int = 100
    """Fixed wire overhead of one control RPC."""

    def __post_init__(self) -> None:
        _check_non_negative(self, "copy_ms", "first_ms", "send_ms", "publish_ms", "control_ms",
                            "control_id_ms", "handshake_ms")
        _check_positive(self, "batch_bytes", "announce_bytes", "id_bytes", "control_bytes")


@dataclass(frozen=True, kw_only=True)
class Network:
    """Where the peers run: one process per machine on a WAN, or all on one shared box."""

    mode: str = "wan"
    """``wan``: each node has its own core and uplink, latency from ``bench/sim/wan.py``'s
    region matrix. ``testbed``: every process shares ``cores`` cores of one machine over
    loopback (the setting of ``bench/gossip_bench.py``)."""
    cores: int = 2
    """Cores of the shared machine (testbed only)."""
    background_load: float = 0.0
    """Cores' worth of other work on the shared machine (testbed only; the load average)."""
    loopback_ms: float = 0.05
    """One-way latency on loopback (testbed only)."""
    uplink_mbps: float = 20.0
    """A node's upload bandwidth (wan only): copies leave one after another."""
    jitter: float = 0.1
    """Relative jitter of a WAN one-way latency (log-normal sigma)."""

    def __post_init__(self) -> None:
        if self.mode not in ("wan", "testbed"):
            raise ValueError(f"Network.mode must be 'wan' or 'testbed', got {self.mode!r}")
        _check_positive(self, "cores", "loopback_ms", "uplink_mbps")
        _check_non_negative(self, "background_load", "jitter")
        if self.background_load >= self.cores:
            raise ValueError("Network.background_load must be below cores")


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """How rollout batches travel (gossipsub parameters as swarm/host.py sets them)."""

    kind: str = "flood"
    """One of ``SCHEMES``."""
    degree: int = 6
    """Gossipsub D (D_low = D - 2, D_high = 2 D)."""
    connections: int = 8
    """Peers a node dials (``GossipConfig.peers.target``); it also accepts others' dials."""
    heartbeat_s: float = 1.0
    """Gossipsub heartbeat: mesh repair and IHAVE emission."""
    gossip_window: int = 3
    """Heartbeats of message ids an IHAVE lists (py-libp2p's mcache window)."""
    gossip_lazy: int = 6
    """IHAVE goes to max(gossip_lazy, 0.25 x non-mesh peers) connected non-mesh peers."""
    detect_s: float = 5.0
    """How long until neighbours notice that a peer left (connection closed or timed out)."""
    announce_interval_s: float = 5.0
    """Shortest period of every peer's signed PeerAnnouncement on gossip (both schemes;
    accounted analytically: see ``bench/sim/announce.py``)."""
    announce_rate_per_s: float = 4.0
    """As ``swarm/peers.py``'s ``announce_interval``: the period is N / this, within
    [announce_interval_s, announce_interval_max_s], so a node receives about this many
    announcements per second whatever N. 0: a fixed ``announce_interval_s`` (O(N) per node,
    the swarm before this was built)."""
    announce_interval_max_s: float = 600.0
    """Longest announcement period (``GossipConfig.announcements.interval_max_s``)."""
    peer_ttl_s: float = 30.0
    """A departed peer stays in others' tables (and may be picked as a source) this long, or
    3 announcement periods when longer (swarm/peers.py), unless a failed dial forgets it."""
    feed_sources: int = 4
    """feeds: k, the feeds a node holds."""
    feed_rotate_s: float = 10.0
    """feeds: the oldest feed is replaced every this many seconds."""
    feed_max_subscribers: int = 12
    """feeds: feeds a source serves at once; beyond, it answers busy."""
    feed_backfill_s: float = 30.0
    """feeds: a new subscriber first gets the source's newest batch if younger than this."""
    feed_make_before_break: bool = True
    """feeds: a rotation opens the replacement (asking for no backfill) before it closes the
    oldest (swarm/feeds.py now). False: the oldest is closed first and the replacement asks
    for a backfill, as the code measured in gossip_quiet_16.json did (to replay such rows)."""
    feed_cooldown_s: float = 60.0
    """feeds: a source that refused or failed is not picked again for this long."""

    def __post_init__(self) -> None:
        if self.kind not in SCHEMES:
            raise ValueError(f"Scheme.kind must be one of {SCHEMES}, got {self.kind!r}")
        _check_positive(self, "connections", "heartbeat_s", "gossip_window", "detect_s",
                        "announce_interval_s", "peer_ttl_s", "feed_sources", "feed_rotate_s",
                        "feed_max_subscribers")
        _check_non_negative(self, "gossip_lazy", "feed_backfill_s", "feed_cooldown_s",
                            "announce_rate_per_s")
        if self.announce_rate_per_s > 0 and self.announce_interval_max_s < self.announce_interval_s:
            raise ValueError("Scheme.announce_interval_max_s must be >= announce_interval_s")
        if self.degree < 3:
            raise ValueError("Scheme.degree must be at least 3")


    def announce_period_s(self, counted: float) -> float:
        """Every peer's announcement period when its table counts ``counted`` peers on
        schedule (swarm/peers.py; the tables of a swarm agree)."""
        if self.announce_rate_per_s <= 0:
            return self.announce_interval_s
        return min(self.announce_interval_max_s,
                   max(self.announce_interval_s, counted / self.announce_rate_per_s))

    def table_ttl_s(self, period_s: float) -> float:
        """How long a departed peer stays in the others' tables (swarm/peers.py TTL_PERIODS)."""
        if self.announce_rate_per_s <= 0:
            return self.peer_ttl_s
        return max(self.peer_ttl_s, 3.0 * period_s)


@dataclass(frozen=True, kw_only=True)
class Sapo:
    """SAPO's consumption (node/learner/sapo.py with SapoConfig's defaults)."""

    groups_per_batch: int = 4
    """Question groups in one batch (the I local groups a node shares per round)."""
    external: int = 4
    """J: external groups taken per round."""
    pool_capacity: int = 256
    per_sender_round: int = 2
    """Most groups from one trusted sender in one round."""
    newcomer_round: int = 2
    """Most groups from all untrusted senders together in one round."""
    sender_pool_share: float = 0.25
    """Largest fraction of the pool one trusted sender (or all untrusted ones) may hold."""
    max_age_rounds: int = 2
    trust_after: int = 4
    """Useful groups used before a sender is trusted."""
    p_pass: float = 0.6
    """Chance a received group has reward variance (passes the zero-advantage filter)."""
    p_useful: float = 0.7
    """Chance a passing group beats the receiver's own baseline (else dropped at sampling)."""

    def __post_init__(self) -> None:
        _check_positive(self, "groups_per_batch", "pool_capacity", "per_sender_round")
        _check_non_negative(self, "external", "newcomer_round", "max_age_rounds", "trust_after")
        for name in ("sender_pool_share", "p_pass", "p_useful"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"Sapo.{name} must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One simulated run."""

    n: int
    """Peers online at the start (churn replaces leavers with fresh identities)."""
    rounds: int = 20
    round_s: float = 10.0
    """Seconds between a node's batches (one SAPO round)."""
    synchronized: bool = False
    """All nodes publish at the same instant each round (gossip_bench does); otherwise each
    node's round starts at its own random offset."""
    churn_per_min: float = 0.0
    """Fraction of peers that leave per minute (each replaced by a fresh identity)."""
    rejoin_s: float = 10.0
    """Mean delay before a leaver's replacement joins."""
    deadline_rounds: float = 3.0
    """A batch counts as delivered if it arrives within this many rounds (SAPO's freshness:
    max_age_rounds + 1)."""
    seed: int = 0
    costs: Costs = Costs()
    network: Network = Network()
    scheme: Scheme = Scheme()
    sapo: Sapo = Sapo()

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError("Scenario.n must be at least 2")
        _check_positive(self, "rounds", "round_s", "rejoin_s", "deadline_rounds")
        _check_non_negative(self, "churn_per_min")
