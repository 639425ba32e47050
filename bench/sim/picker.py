"""A node's feed-source choice, as ``swarm/feeds.py``'s ``FeedClient`` makes it, without trio.

``FeedClient``'s decisions live in methods that read ``trio.current_time()`` and start tasks in
a nursery, so they cannot be called from a simulation; this module mirrors them, method for
method, with time passed in and peers as ints (mirrored from ``swarm/feeds.py`` at ee61d7d):

====================  ==========================================================
``FeedPicker``        ``swarm.feeds.FeedClient``
====================  ==========================================================
``rate``              ``rate``: the learner's report ends idle trials
``proven``            ``_proven``
``want_proven``       ``_want_proven``
``maintain``          ``_maintain``: rotation (make before break), filling slots
``opened``            ``_opened``: a feed is open; a rotation's old feed closes
``refused``           ``_open`` answered BUSY, or ``_follow``'s failure: ``_cool``
``pick``              ``_pick`` over ``_candidates``
``cool``              ``_cool``: 5 s doubling per consecutive failure, up to cooldown_s
====================  ==========================================================

The config (``FeedsConfig``) is the product's, so its defaults move the simulation too; the
constants (``MIRRORED``) are copies, checked against ``swarm/feeds.py`` by a test; a change of
logic there must be mirrored here.

A picker that is never handed a report (``rate``) is the picker before issue 32 (and today's
before the learner's first report): uniform over never-held keys, then over rested ones;
nothing is ever judged.

Where the mirror differs, on purpose: a pick draws uniformly over the same set as ``_pick``
(by rejection from the table, or over a listed set; the same distribution, other random
numbers); bans and relayed addresses do not exist here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.ipc import MAX_SOURCES
from swarm.config import FeedsConfig
from swarm.peers import PeerTable

__all__ = ["MIRRORED", "Feed", "FeedPicker", "MAX_SOURCES", "OPENS_PER_TICK", "PROVEN_PATIENCE",
           "RETRY_S", "TABLE_CAPACITY", "TICK_S", "Table"]

# swarm/feeds.py's constants, copied: importing it imports libp2p, which a test process that
# imported hivemind cannot (tests/swarm/test_feeds_units.py); tests/sim/test_sybil.py checks
# the copies against the originals in a child interpreter
PROVEN_PATIENCE = 4
RETRY_S = 5.0
TICK_S = 0.5
OPENS_PER_TICK = 2
MIRRORED = ("PROVEN_PATIENCE", "RETRY_S", "TICK_S", "OPENS_PER_TICK")

TABLE_CAPACITY = PeerTable(ttl_s=1.0).capacity
"""Entries of a node's peer table (``swarm.peers.PeerTable``; the service keeps the default)."""
REJECTION_TRIES = 32
"""Draws from the table before a pick lists its pool instead (both are uniform over it)."""


class Table:
    """The peer table every node holds (all hear the same announcements): peer ids in order
    of arrival, at most ``capacity``; a new peer in a full table displaces the newest arrival
    (``PeerTable.update``). Nobody leaves: no churn, no expiry."""

    def __init__(self, peers: Sequence[int], *, capacity: int = TABLE_CAPACITY) -> None:
        self.capacity = capacity
        self.peers: list[int] = []
        self.members: set[int] = set()
        for p in peers:
            self.add(p)

    def add(self, peer: int) -> None:
        if len(self.peers) >= self.capacity:
            self.members.discard(self.peers.pop())
        self.peers.append(peer)
        self.members.add(peer)

    def __len__(self) -> int:
        return len(self.peers)


@dataclass
class Feed:
    """``swarm.feeds._Feed`` without its cancel scope."""

    peer: int
    started: float
    open: bool = False
    replaces: int | None = None
    delivered: int = 0
    since: int = 0
    grew: int = -(10**9)
    stranger: bool = True


class FeedPicker:
    """One node's ``FeedClient`` state and decisions over ``table``; the caller opens the
    feeds ``maintain`` starts and answers with ``opened`` or ``refused``, and hands it the
    learner's reports (``rate``) unless it models the picker before issue 32."""

    def __init__(self, me: int, *, config: FeedsConfig, table: Table,
                 rng: random.Random) -> None:
        self.me = me
        self.config = config
        self.table = table
        self.rng = rng
        self.feeds: dict[int, Feed] = {}
        self.cooldown: dict[int, float] = {}
        self.rested: dict[int, float] = {}
        self.failures: dict[int, int] = {}
        self.last_rotation = 0.0
        self.delivered: dict[int, int] = {}
        self.idle: set[int] = set()
        self.reports = 0
        self.counters: dict[str, int] = {}

    # -- the learner's report --------------------------------------------------------------
    def rate(self, now: float, delivered: dict[int, int]) -> list[int]:
        """``FeedClient.rate``; returns the sources whose feeds it closed."""
        self.delivered = dict(delivered)
        self.reports += 1
        trial = self.config.trial_rounds
        open_ = [f for f in self.feeds.values() if f.open]
        for feed in open_:
            got = self.delivered.get(feed.peer, 0)
            if got > feed.delivered:
                feed.delivered, feed.since, feed.grew = got, self.reports, self.reports
                self.idle.discard(feed.peer)
        if not trial:
            return []
        closed = []
        for feed in open_:
            patience = trial if feed.stranger else PROVEN_PATIENCE * trial
            if self.reports - feed.since < patience or not any(
                    f.grew > self.reports - trial for f in open_ if f is not feed):
                continue
            self.idle.add(feed.peer)
            if len(self.idle) > TABLE_CAPACITY:
                self.idle.pop()
            self.cool(now, feed.peer, "feed_dropped_idle")
            if self.feeds.get(feed.peer) is feed:  # _follow's finally, once cancelled
                del self.feeds[feed.peer]
            closed.append(feed.peer)
        return closed

    def proven(self, peer: int) -> bool:
        return self.delivered.get(peer, 0) > 0 and peer not in self.idle

    def want_proven(self, held: list[Feed]) -> bool | None:
        if not self.reports:
            return None
        k = self.config.sources
        return sum(self.proven(f.peer) for f in held) < k - self.config.explore_slots

    # -- maintenance (every TICK_S) --------------------------------------------------------
    def maintain(self, now: float) -> list[Feed]:
        """``FeedClient._maintain``; returns the feeds it started (the caller opens them)."""
        if self.cooldown:
            self.cooldown = {p: t for p, t in self.cooldown.items() if t > now}
        k = self.config.sources
        started = []
        open_ = [f for f in self.feeds.values() if f.open and f.replaces is None]
        rotating = any(f.replaces is not None for f in self.feeds.values())
        if not rotating and len(open_) >= k and now - self.last_rotation >= self.config.rotate_s:
            oldest = min(open_, key=lambda f: f.started)
            want = self.want_proven([f for f in self.feeds.values() if f is not oldest])
            peer = self.pick(proven=want, strict=want is not None and self.proven(oldest.peer))
            if peer is not None:
                started.append(self._start(peer, now, replaces=oldest.peer))
            self.last_rotation = now
        slots = sum(f.replaces is None or f.replaces not in self.feeds
                    for f in self.feeds.values())
        for _ in range(min(OPENS_PER_TICK, k - slots)):
            peer = self.pick(proven=self.want_proven(list(self.feeds.values())))
            if peer is None:
                break
            started.append(self._start(peer, now))
        return started

    def missing(self) -> int:
        """Slots ``maintain`` would fill now (> 0: it retries every tick)."""
        return self.config.sources - sum(f.replaces is None or f.replaces not in self.feeds
                                         for f in self.feeds.values())

    def _start(self, peer: int, now: float, *, replaces: int | None = None) -> Feed:
        feed = Feed(peer=peer, started=now, replaces=replaces)
        self.feeds[peer] = feed
        return feed

    def opened(self, feed: Feed, now: float) -> int | None:
        """``FeedClient._opened``; returns the source of the feed it closed (a rotation's)."""
        feed.open = True
        feed.delivered, feed.since = self.delivered.get(feed.peer, 0), self.reports
        feed.stranger = not self.proven(feed.peer)
        self.failures.pop(feed.peer, None)
        old_peer, feed.replaces = feed.replaces, None
        old = self.feeds.get(old_peer) if old_peer is not None else None
        if old is None or old_peer is None:
            return None
        del self.feeds[old_peer]
        self.rested[old_peer] = now
        if len(self.rested) > TABLE_CAPACITY:
            del self.rested[min(self.rested, key=self.rested.__getitem__)]
        self._count("feed_rotated")
        return old_peer

    def refused(self, feed: Feed, now: float) -> None:
        """The source answered BUSY (``_open``: ``feed_refused``); the feed ends."""
        self.cool(now, feed.peer, "feed_refused")
        if self.feeds.get(feed.peer) is feed:
            del self.feeds[feed.peer]

    def cool(self, now: float, peer: int, counter: str) -> None:
        self._count(counter)
        if len(self.failures) > TABLE_CAPACITY:
            self.failures.clear()
        n = self.failures[peer] = self.failures.get(peer, 0) + 1
        self.cooldown[peer] = now + min(self.config.cooldown_s, RETRY_S * 2 ** (n - 1))

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # -- the pick --------------------------------------------------------------------------
    def _candidate(self, peer: int) -> bool:
        return peer != self.me and peer not in self.feeds and peer not in self.cooldown

    def pick(self, *, proven: bool | None = None, strict: bool = False) -> int | None:
        """``FeedClient._pick``: ``pool = fresh or rested or ([] if strict else other)``."""
        if proven is None:
            pool_tests: list[Callable[[int], bool]] = [
                lambda p: p not in self.rested, lambda p: p in self.rested]
        else:
            pool_tests = [lambda p: self.proven(p) == proven]
            if not strict:
                pool_tests.append(lambda p: self.proven(p) != proven)
        for test in pool_tests:
            peer = self._uniform(test, listed=self._listed(proven, test is pool_tests[0]))
            if peer is not None:
                return peer
        return None

    def _listed(self, proven: bool | None, first: bool) -> Sequence[int] | None:
        """A short list that holds the whole pool, when there is one: the proven sources
        (they delivered: at most ``MAX_SOURCES`` are reported), the rested ones."""
        if proven is not None and proven == first:
            return list(self.delivered)
        if proven is None and not first:
            return list(self.rested)
        return None

    def _uniform(self, test: Callable[[int], bool], *, listed: Sequence[int] | None) -> int | None:
        """Uniform over the candidates that pass ``test``: over ``listed`` if given, else by
        rejection from the table, else (none drawn) over the listed pool."""
        members = self.table.members

        def ok(p: int) -> bool:
            return p in members and self._candidate(p) and test(p)

        peers = self.table.peers
        if listed is None and peers:
            for _ in range(REJECTION_TRIES):
                p = peers[self.rng.randrange(len(peers))]
                if ok(p):
                    return p
        pool = [p for p in (peers if listed is None else listed) if ok(p)]
        return pool[self.rng.randrange(len(pool))] if pool else None
