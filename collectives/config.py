"""OuterConfig: the DiLoCo outer loop's knobs, one frozen table per concern, validated on
construction.

    [outer]                 every_rounds, compression, swarm_id
    [outer.sparse]          k, error_decay                    (compression = "sparse")
    [outer.optimizer]       lr, momentum                      (holding.py, landing.py)
    [outer.schedule]        deadline_s, join_window_s, period_s, min_period_s, max_period_s,
                            prepare_s, final_wait_s           (schedule.py, attempt.py, finish.py)
    [outer.group]           min_peers, max_peers, minority_patience   (matchmaking, consistency)
    [outer.bounds]          weight, max_weight, max_norm, max_norm_ratio  (member, reducer)
    [outer.catchup]         anchor, trusted_peers, requests_per_minute (catchup.py, allreduce.py)
    [outer.transport]       dht_min_interval_s, dht_timeout_s, startup_timeout_s,
                            slow_start_for_tests_s, host_maddrs, announce_maddrs  (transport.py)

Every key that moved into a sub-table (``deadline_s`` was ``[outer] deadline_s``, ``lr`` was
``outer_lr``) still works under its old flat name (``OuterConfig.MOVED_KEYS``, with a
warning naming the new place). Imports neither torch nor hivemind: the supervisor checks a
node's ``[outer]`` table with it before any child starts (node/tables.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from protocol.tables import TableError, build_table

__all__ = ["BoundsConfig", "CatchupConfig", "COMPRESSIONS", "GroupConfig", "OptimizerConfig",
           "OuterConfig", "ScheduleConfig", "SparseConfig", "TransportConfig"]

COMPRESSIONS = ("none", "fp16", "int8", "sparse")
"""Codec names ``OuterConfig.compression`` may take: ``collectives.codec.CODEC_NAMES``
(a test holds the two equal; the registry imports torch, this list does not)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The outer optimizer: Nesterov SGD on the averaged pseudo-gradient."""

    lr: float = 1.0
    """Learning rate of the outer Nesterov SGD. With ``momentum`` 0, lr 1 is the plain mean:
    every member ends at the (robust, weighted) mean of the members' params."""
    momentum: float = 0.0
    """Nesterov momentum of the outer SGD (0 disables momentum). Off by default (issue 29):
    DiLoCo's 0.9 (with lr 0.7) is tuned for pre-training with ~500 inner steps per outer
    step. Between our steps (a few GRPO steps) consecutive averaged pseudo-gradients point
    the same way (cosine 0.74-0.97 measured), so momentum multiplies every step by up to
    lr/(1-mu) = 7 and keeps pushing after the signal is gone: the embedded model collapsed
    to accuracy 0 (bench/outer_learning.py). Worth trying only with H in the hundreds."""

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TableError("lr", "must be a positive finite number")
        if not 0 <= self.momentum < 1:
            raise TableError("momentum", "must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class SparseConfig:
    """``compression = "sparse"``: top-k of each 4096 values with 2-bit values, and error
    feedback (SparseLoCo, notes/compression.md). A member contributes the top ``k`` of its
    accumulator ``e = error_decay * e + delta`` per 4096 values and keeps the rest
    (``e -= what it sent``) for its next steps (collectives/feedback.py)."""

    k: int = 64
    """Values a member sends per 4096 (even; 64 = 1.6 %: ~0.027 bytes per parameter up)."""
    error_decay: float = 0.95
    """How much of what was left unsent carries into the next step (0: none, plain top-k)."""

    def __post_init__(self) -> None:
        if not (2 <= self.k <= 4096 and self.k % 2 == 0):
            raise TableError("k", "must be an even number in [2, 4096]")
        if not 0 <= self.error_decay <= 1:
            raise TableError("error_decay", "must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """When peers meet and how long a step may take."""

    deadline_s: float = 30.0
    """An outer step attempt never blocks the caller longer than this (plus ~1 s slack)."""
    join_window_s: float = 3.0
    """Time peers wait after announcing themselves for step k before the group is read."""
    period_s: float = 0.0
    """Clock rendezvous (``OuterLoop.after_round``): seconds between meetings on DHT time;
    0 adapts it to ``every_rounds`` x the slowest grouped peer's round time, on the ladder
    ``min_period_s`` x 2^j (see schedule.py)."""
    min_period_s: float = 2.0
    """Shortest adaptive period (the ladder's base: keep it equal across a swarm)."""
    max_period_s: float = 600.0
    """Longest adaptive period (bounds how far a peer's proposal can slow the pace)."""
    prepare_s: float = 1.0
    """Clock rendezvous, once the period is agreed: an attempt starts at the first round
    boundary up to this long before its meeting opens (at most a quarter of the period), so
    that the snapshot, the catch-up, the join record and the local delta are ready when it
    opens; the group is read from the opening on, never before (schedule.py ``due``)."""
    final_wait_s: float = 30.0
    """``OuterLoop.finish`` (a node whose run ended keeps attending the meetings until its
    peers ended too, see finish.py): how long it waits for a peer it expects (its version's
    witnesses, its last group, the peers it discovered) that neither came to a meeting nor
    said it left; ``finish`` takes at most about twice this plus ``deadline_s``."""

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise TableError("deadline_s", "must be > 0")
        if not 0 < self.join_window_s < self.deadline_s / 2:
            raise TableError("join_window_s", "must be in (0, deadline_s / 2)")
        if not (0 <= self.period_s and math.isfinite(self.period_s)):
            raise TableError("period_s", "must be >= 0 (0 = adaptive)")
        if not 0 < self.min_period_s <= self.max_period_s:
            raise TableError("min_period_s", "need 0 < min_period_s <= max_period_s")
        if not self.max_period_s <= 100_000:
            raise TableError("max_period_s", "must be <= 100000")
        if not (0 <= self.prepare_s and math.isfinite(self.prepare_s)):
            raise TableError("prepare_s", "must be >= 0")
        if not (self.final_wait_s > 0 and math.isfinite(self.final_wait_s)):
            raise TableError("final_wait_s", "must be a positive finite number")

    @property
    def dht_op_timeout_s(self) -> float:
        """Timeout of one DHT store or head read inside an attempt: a quarter of its
        deadline, at most 5 s (a record stored late is no use to the peers reading it)."""
        return min(5.0, self.deadline_s / 4)

    @property
    def vote_ttl_s(self) -> float:
        """How long a vote lives in the DHT: past the slowest member's read of the votes."""
        return 3 * self.deadline_s + 60


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """Who makes a group, and when a group may move the swarm's version."""

    min_peers: int = 2
    """Fewest peers (self included) that make a group; fewer means status "alone"."""
    max_peers: int = 64
    """Largest group the leader admits (peers in id order)."""
    minority_patience: int = 3
    """A group without a strict majority of the current version's contributors does not
    advance (no forks); after this many such attempts in a row it advances anyway (the
    majority is gone: liveness over fork safety)."""

    def __post_init__(self) -> None:
        if self.min_peers < 2:
            raise TableError("min_peers", "must be >= 2")
        if self.max_peers < self.min_peers:
            raise TableError("max_peers", "must be >= min_peers")
        if self.minority_patience < 0:
            raise TableError("minority_patience", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class BoundsConfig:
    """What a contribution may weigh and how large it and a returned mean may be."""

    weight: float = 1.0
    """Weight of one inner round: a contribution declares ``weight`` x the rounds since this
    node's delta was last counted (reducers cap it by the group's median)."""
    max_weight: float = 1000.0
    """A contribution whose declared weight is outside (0, max_weight] is excluded."""
    max_norm: float = math.inf
    """Absolute bound on the L2 norm of a contribution's shard and of a returned mean shard."""
    max_norm_ratio: float = 10.0
    """Reducer: a shard whose norm exceeds this multiple of the median shard norm (in a group
    of two: of the larger of the reducer's own shard's norm and the last accepted mean's
    size for that shard's length, reduce.py) is excluded. Member: a returned mean shard whose
    norm exceeds this multiple of the larger of its own input's norm for that shard and the
    last accepted mean's size fails the step (member.py)."""

    def __post_init__(self) -> None:
        if not 0 < self.weight <= self.max_weight:
            raise TableError("weight", "must be in (0, max_weight]")
        if not self.max_norm > 0:
            raise TableError("max_norm", "must be > 0")
        if not self.max_norm_ratio > 1:
            raise TableError("max_norm_ratio", "must be > 1")


_BASE58 = set("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")


@dataclass(frozen=True, kw_only=True)
class CatchupConfig:
    """Which versions a behind or fresh node adopts, and how much state this node serves."""

    anchor: str = ""
    """Operator-pinned state hash a joiner may adopt from anyone who serves it ("" = none)."""
    trusted_peers: tuple[str, ...] = ()
    """Operator-pinned peer ids (as ``swarm-node identity`` prints them) whose signed version
    heads a joiner adopts as it would those of peers it trusts from their rollouts, and
    whom a node whose run ended waits for (up to ``schedule.final_wait_s``) before its last
    step, discovered or not (finish.py): pin the nodes you run yourself (``swarm-node
    local`` pins its own)."""
    requests_per_minute: int = 6
    """State transfers this node serves to one peer per minute; more are refused."""

    def __post_init__(self) -> None:
        if self.anchor and not (len(self.anchor) == 64
                                and all(c in "0123456789abcdef" for c in self.anchor)):
            raise TableError("anchor", "must be empty or a 64-character hex sha256")
        for peer in self.trusted_peers:
            if not (isinstance(peer, str) and 32 <= len(peer) <= 128
                    and set(peer) <= _BASE58):
                raise TableError("trusted_peers", f"{peer!r} is not a peer id (base58, as "
                                 "`swarm-node identity` prints)")
        if self.requests_per_minute < 1:
            raise TableError("requests_per_minute", "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class TransportConfig:
    """The collective's p2pd and DHT (the node fills the addresses from its own)."""

    dht_min_interval_s: float = 0.05
    """Throttle: this long between two DHT calls of this node on average (up to
    ``transport.DHT_BURST`` calls back to back)."""
    dht_timeout_s: float = 10.0
    """Timeout of one DHT call."""
    startup_timeout_s: float = 30.0
    """Timeout for p2pd and the DHT to start."""
    slow_start_for_tests_s: float = 0.0
    """Test knob (0 in production): the transport waits this long before it starts p2pd,
    emulating a host too loaded to bring the collective up quickly (seen: ~110 s on a busy
    2-core box), so that tests can stop a node while its collective is starting."""
    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    """Multiaddrs p2pd listens on."""
    announce_maddrs: tuple[str, ...] = ()
    """Multiaddrs p2pd announces (empty: the listen addresses)."""

    def __post_init__(self) -> None:
        if self.dht_min_interval_s < 0:
            raise TableError("dht_min_interval_s", "must be >= 0")
        if not self.dht_timeout_s > 0:
            raise TableError("dht_timeout_s", "must be > 0")
        if not self.startup_timeout_s > 0:
            raise TableError("startup_timeout_s", "must be > 0")
        if not (0 <= self.slow_start_for_tests_s <= 3600):
            raise TableError("slow_start_for_tests_s", "must be in [0, 3600]")
        if not self.host_maddrs:
            raise TableError("host_maddrs", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class OuterConfig:
    """Configuration of :class:`collectives.OuterLoop`: the two knobs a user sets most at the
    top, the rest by concern."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "outer_lr": "optimizer.lr", "outer_momentum": "optimizer.momentum",
        **{k: f"schedule.{k}" for k in ("deadline_s", "join_window_s", "period_s",
                                         "min_period_s", "max_period_s", "prepare_s",
                                         "final_wait_s")},
        **{k: f"group.{k}" for k in ("min_peers", "max_peers", "minority_patience")},
        **{k: f"bounds.{k}" for k in ("weight", "max_weight", "max_norm", "max_norm_ratio")},
        "anchor": "catchup.anchor",
        "state_requests_per_minute": "catchup.requests_per_minute",
        **{k: f"transport.{k}" for k in ("dht_min_interval_s", "dht_timeout_s",
                                          "startup_timeout_s", "slow_start_for_tests_s",
                                          "host_maddrs", "announce_maddrs")},
    }
    """Flat ``[outer]`` keys of earlier releases and where they live now."""

    every_rounds: int = 10
    """H: an outer step is attempted after every H inner rounds."""
    compression: str = "fp16"
    """Codec on the wire: "none" (fp32), "fp16", "int8" (blockwise absmax) or "sparse" (top-k
    with error feedback, ``[outer.sparse]``; 19x fewer bytes than int8 at 2 peers, 11x at 4)."""
    swarm_id: str = "swarm-node"
    """Swarm id that signed commits are sealed for (see protocol.seal)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    sparse: SparseConfig = field(default_factory=SparseConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    group: GroupConfig = field(default_factory=GroupConfig)
    bounds: BoundsConfig = field(default_factory=BoundsConfig)
    catchup: CatchupConfig = field(default_factory=CatchupConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)

    def __post_init__(self) -> None:
        if self.every_rounds < 1:
            raise TableError("every_rounds", "must be >= 1")
        if self.compression not in COMPRESSIONS:
            raise TableError("compression", f"must be one of {list(COMPRESSIONS)}, "
                                            f"got {self.compression!r}")
        if not 0 < len(self.swarm_id) <= 64:
            raise TableError("swarm_id", "must be 1..64 characters")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OuterConfig:
        """From a JSON/TOML table: unknown keys, wrong types and values out of range raise
        ``protocol.tables.TableError`` (a ValueError) naming the key."""
        return build_table(cls, data)
