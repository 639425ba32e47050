"""A node's feed-source choice, as ``swarm/feeds.py``'s ``FeedClient`` makes it, without trio.

What a source has earned is decided by the product's own ``swarm.feed_standing.Standing``
(pure bookkeeping: the caller passes the time; it imports neither trio nor libp2p): each
picker holds one, hands it the learner's reports and the frames its feeds bring, and asks it
for kinds and verdicts. What still lives in ``FeedClient`` reads ``trio.current_time()`` and
starts tasks in a nursery, so it cannot be called from a simulation; this module mirrors it,
method for method, with time passed in and peers as ints (mirrored from ``swarm/feeds.py``
at 50d4ce5):

====================  ==========================================================
``FeedPicker``        ``swarm.feeds.FeedClient``
====================  ==========================================================
``rate``              ``rate``: ``Standing.report`` (with ``own``) and ``judge``;
                      closes, cools
``kinds``             ``kinds``: open feeds by their source's kind, and idle ones
``kind``              ``_kind``
``want``              ``_want``: ``LIVE`` until k − explore_slots held sources rank
                      (``Standing.rank``) live or proven
``maintain``          ``_maintain``: rotation (make before break; every wait while
                      starved; ``search`` while searching), filling slots
``starved``           ``_starved``: every open feed idle and silent for the wait
``search``            ``_search``: while ``Standing.searching``, the oldest feed not
                      proven and open for the wait, by an unrested stranger
``rotation``          ``_rotation``: which feed a rotation replaces (a stranger's, a
                      silent live source's, the stalest beyond the reserved), by whom
``network_full``      ``_network_full``: a feed whose network is full while a candidate
                      elsewhere is left is not opened (``_cool``)
``opened``            ``_opened``: the trial starts; a rotation's old feed closes
``frame``             ``_follow``, per frame: the trial's count, ``Standing.frame``
``refused``           ``_open`` answered BUSY (``_cool``), then ``_follow`` ends
``pick``              ``_pick`` over ``_spread(_candidates)``, by ``Standing.rank``
``full``              ``_full``: networks whose open feeds hold
                      ``feeds.max_per_network`` slots
``cool``              ``_cool``: ``RETRY_S`` doubling per failure or idle strike
====================  ==========================================================

The config (``FeedsConfig``) and ``Standing`` are the product's, so their defaults and logic
move the simulation too; the constants that still live in ``swarm/feeds.py`` (``MIRRORED``)
are copies, checked against it by a test; a change of ``FeedClient``'s logic must be mirrored
here.

A picker that is never handed a report (``rate``) is the picker before issue 32 (and today's
before the learner's first report): uniform over never-held keys, then over rested ones;
nothing is ever judged, nothing is ever starved.

Where the mirror differs, on purpose: a pick draws uniformly over the same set as ``_pick``
(by rejection from the table, or over a listed set: the reported sources, the rested ones;
the same distribution, other random numbers); bans, relayed addresses, dials that fail, invalid
frames and streams that end (so resubscription) do not exist here; a peer's network
(``swarm.networks``) is what ``network`` says, never a lie (``network_full`` still closes a
feed that would take a full network's slot: several picks are in flight before any opens); whether a feed asks for a backfill is decided when it starts (the
product decides it when ``_follow`` starts, in the same tick); ``rotation`` is passed the
time ``_maintain`` read (the product reads ``trio.current_time()`` again, in the same tick).
``rotation_due`` is the simulation's own (when a tick may next rotate), not a mirror.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Protocol, cast

from protocol.ipc import MAX_SOURCES
from swarm.config import FeedsConfig
from swarm.feed_standing import Kind, Standing, Trial, Verdict
from swarm.peers import PeerTable

__all__ = ["MIRRORED", "MIRRORED_AT", "Feed", "FeedPicker", "Kind", "MAX_SOURCES",
           "OPENS_PER_TICK", "RETRY_S", "TABLE_CAPACITY", "TICK_S", "Table"]

MIRRORED_AT = "50d4ce5"
"""The commit of ``swarm/feeds.py`` whose ``FeedClient`` this module mirrors (the docstring's)."""

# swarm/feeds.py's constants, copied: importing it imports libp2p, which a test process that
# imported hivemind cannot (tests/swarm/test_feeds_units.py); tests/sim/test_sybil.py checks
# the copies against the originals in a child interpreter
RETRY_S = 5.0
TICK_S = 0.5
OPENS_PER_TICK = 2
MIRRORED = ("RETRY_S", "TICK_S", "OPENS_PER_TICK")

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


class IntStanding(Protocol):
    """``Standing`` over the simulation's peer ids: it only hashes them (its annotations name
    the product's, ``str``), so a ``Standing`` is used as one unchanged (a cast, no copy)."""

    @property
    def reports(self) -> int: ...
    def frame(self, peer: int, now: float) -> None: ...
    def wait_s(self) -> float: ...
    def silent_s(self, peer: int) -> float: ...
    def starved(self, trials: Iterable[Trial | None], now: float) -> bool: ...
    def searching(self, trials: Iterable[Trial | None]) -> bool: ...
    def silent(self, peer: int, trial: Trial, now: float, *, starved: bool) -> bool: ...
    def kind(self, peer: int) -> Kind: ...
    def rank(self, peer: int) -> Kind: ...
    def report(self, signal: Mapping[int, int], valid: Mapping[int, int], now: float,
               own: int | None = None) -> None: ...
    def open(self, peer: int, now: float) -> Trial: ...
    def idle(self, trial: Trial) -> bool: ...
    def judge(self, trials: Mapping[int, Trial], now_s: float) -> dict[int, Verdict]: ...
    def dropped(self, peer: int, verdict: Verdict) -> int: ...


@dataclass
class Feed:
    """``swarm.feeds._Feed`` without its cancel scope."""

    peer: int
    started: float
    open: bool = False
    replaces: int | None = None
    trial: Trial | None = None
    backfill: bool = True
    """Its request asks for the source's newest batch (``_follow``'s ``backfill``)."""


class FeedPicker:
    """One node's ``FeedClient`` state and decisions over ``table``; the caller opens the
    feeds ``maintain`` starts and answers with ``opened`` or ``refused``, passes on the frames
    they bring (``frame``), and hands it the learner's reports (``rate``) unless it models
    the picker before issue 32."""

    def __init__(self, me: int, *, config: FeedsConfig, table: Table, rng: Random,
                 network: Callable[[int], int | None] = lambda _peer: None) -> None:
        self.me = me
        self.network = network
        """A peer's network (``swarm.networks``); None: in none (loopback), never capped."""
        self._avoid: frozenset[int] = frozenset()
        """The full networks a pick leaves out (``_spread``), for the pick under way."""
        self.config = config
        self.table = table
        self.rng = rng
        self.standing = cast(IntStanding, Standing(
            trial_rounds=config.trial_rounds, probe_rounds=config.probe_rounds,
            probe_s=config.probe_s, capacity=table.capacity))
        self.feeds: dict[int, Feed] = {}
        self.cooldown: dict[int, float] = {}
        self.rested: dict[int, float] = {}
        self.failures: dict[int, int] = {}
        self.last_rotation = 0.0
        self.counters: collections.Counter[str] = collections.Counter()
        self.signal: Mapping[int, int] = {}
        """The last report's signal totals: every proven source is among them."""
        self.valid: Mapping[int, int] = {}
        """The last report's valid totals: every live source is among them."""

    # -- the learner's report --------------------------------------------------------------
    def rate(self, now: float, signal: Mapping[int, int],
             valid: Mapping[int, int] | None = None, own: int | None = None) -> list[int]:
        """``FeedClient.rate``: ``own`` is the learner's count so far of its own local groups
        that carried signal (None: not reported); returns the sources whose feeds it closed."""
        valid = signal if valid is None else valid
        self.standing.report(signal, valid, now, own)
        self.signal, self.valid = signal, valid
        trials = {f.peer: f.trial for f in self.feeds.values()
                  if f.open and f.trial is not None}
        self.counters["feed_idle_slot_rounds"] += sum(map(self.standing.idle, trials.values()))
        closed = []
        for peer, verdict in self.standing.judge(trials, now).items():
            strikes = self.standing.dropped(peer, verdict)
            self.cool(now, peer, verdict.value, strikes=strikes)
            del self.feeds[peer]  # _follow's finally, once its scope is cancelled
            closed.append(peer)
        return closed

    def kinds(self) -> dict[str, int]:
        """``FeedClient.kinds``."""
        out = {kind.label: 0 for kind in Kind}
        open_ = [f for f in self.feeds.values() if f.open]
        for f in open_:
            out[self.kind(f.peer).label] += 1
        out["idle"] = sum(self.standing.idle(f.trial) for f in open_
                          if f.trial is not None) if self.standing.reports else 0
        return out

    def kind(self, peer: int) -> Kind:
        return self.standing.kind(peer)

    def want(self, held: list[Feed]) -> Kind | None:
        """``FeedClient._want``: the kind the next slot needs beside ``held`` (counted by
        ``Standing.rank``: while signal flows, proven ones)."""
        if not self.standing.reports:
            return None
        reserved = self.config.sources - self.config.explore_slots
        known = sum(self.standing.rank(f.peer) >= Kind.LIVE for f in held)
        return Kind.LIVE if known < reserved else Kind.STRANGER

    # -- maintenance (every TICK_S) --------------------------------------------------------
    def maintain(self, now: float) -> list[Feed]:
        """``FeedClient._maintain``; returns the feeds it started (the caller opens them)."""
        if self.cooldown:
            self.cooldown = {p: t for p, t in self.cooldown.items() if t > now}
        k = self.config.sources
        started = []
        open_ = [f for f in self.feeds.values() if f.open and f.replaces is None]
        rotating = any(f.replaces is not None for f in self.feeds.values())
        starved = self.starved(open_, now)
        period = min(self.config.rotate_s, self.standing.wait_s()) if starved \
            else self.config.rotate_s
        due = now - self.last_rotation >= period
        searching = self.standing.searching(f.trial for f in open_)
        if not rotating and len(open_) >= k and (due or searching):
            rotation = self.search(open_, now) if searching else None
            if rotation is not None:
                self.counters["feed_search_rotations"] += 1
            elif due:
                rotation = self.rotation(open_, now, starved=starved)
            if rotation is not None:
                old, new = rotation
                started.append(self._start(new, now, replaces=old.peer))
            if due or rotation is not None:
                self.last_rotation = now
        for _ in range(min(OPENS_PER_TICK, self.missing())):
            peer = self.pick(want=self.want(list(self.feeds.values())))
            if peer is None:
                break
            started.append(self._start(peer, now))
        return started

    def missing(self) -> int:
        """Slots ``maintain`` would fill now (> 0: it retries every tick)."""
        return self.config.sources - sum(f.replaces is None or f.replaces not in self.feeds
                                         for f in self.feeds.values())

    def rotation_due(self) -> float:
        """The earliest time ``maintain`` may rotate if no report, frame or open comes first
        (the simulation's, to sleep until then): ``rotate_s`` after the last rotation, or
        the wait after it once ``starved`` holds (every open feed idle: reports change
        that, and the wait only frames do); while ``searching``, a wait after the opening
        of the oldest feed whose source is not proven."""
        due = self.last_rotation + self.config.rotate_s
        open_ = [f for f in self.feeds.values() if f.open and f.replaces is None]
        if open_ and self.standing.searching(f.trial for f in open_):
            opened = [f.trial.opened_s for f in open_
                      if f.trial is not None and self.kind(f.peer) is not Kind.PROVEN]
            if opened:
                due = min(due, min(opened) + self.standing.wait_s())
        if not (open_ and self.standing.reports) or not all(
                f.trial is not None and self.standing.idle(f.trial) for f in open_):
            return due
        wait = self.standing.wait_s()
        starved_at = max(f.trial.valid_s for f in open_ if f.trial is not None) + wait
        return min(due, max(starved_at, self.last_rotation + wait))

    def starved(self, open_: list[Feed], now: float) -> bool:
        """``FeedClient._starved``: every open feed brought no valid group in
        ``probe_rounds`` reports and for the wait (``Standing.wait_s``)."""
        return self.standing.starved([f.trial for f in open_], now)

    def search(self, open_: list[Feed], now: float) -> tuple[Feed, int] | None:
        """``FeedClient._search``: while ``Standing.searching``, the oldest feed whose source
        is not proven, open for the wait, and a stranger to replace it."""
        wait = self.standing.wait_s()
        for feed in sorted(open_, key=lambda f: f.started):
            if feed.trial is None or self.kind(feed.peer) is Kind.PROVEN \
                    or now - feed.trial.opened_s < wait:
                continue
            peer = self.pick(want=Kind.STRANGER, unrested=True)
            return (feed, peer) if peer is not None else None
        return None

    def rotation(self, open_: list[Feed], now: float, *,
                 starved: bool = False) -> tuple[Feed, int] | None:
        """``FeedClient._rotation``: the oldest feed that can be replaced, and by whom; a
        live source silent for ``probe_s`` (``starved``: for the wait and 3 of its own gaps,
        ``Standing.silent_s``) goes like a stranger."""
        by_age = sorted(open_, key=lambda f: f.started)
        if not self.standing.reports:
            peer = self.pick()
            return (by_age[0], peer) if peer is not None else None
        reserved = self.config.sources - self.config.explore_slots
        live = [f for f in open_ if self.kind(f.peer) is Kind.LIVE and f.trial is not None]
        stalest = min(live, key=lambda f: (f.trial.valid_grew if f.trial else 0, f.started)) \
            if live and sum(self.kind(f.peer) >= Kind.LIVE for f in open_) > reserved else None
        for feed in by_age:
            silent = feed.trial is not None and self.standing.silent(
                feed.peer, feed.trial, now, starved=starved)
            if feed is stalest or silent or self.kind(feed.peer) is Kind.STRANGER:
                held = [f for f in self.feeds.values() if f is not feed]
                peer = self.pick(want=self.want(held))
            else:
                peer = self.pick(want=Kind.PROVEN, at_least=Kind.PROVEN)
            if peer is not None:
                return feed, peer
        return None

    def _start(self, peer: int, now: float, *, replaces: int | None = None) -> Feed:
        backfill = replaces is None or (self.standing.reports > 0
                                        and self.kind(peer) is Kind.STRANGER)
        feed = Feed(peer=peer, started=now, replaces=replaces, backfill=backfill)
        self.feeds[peer] = feed
        return feed

    def opened(self, feed: Feed, now: float) -> int | None:
        """``FeedClient._opened``; returns the source of the feed it closed (a rotation's)."""
        feed.open = True
        feed.trial = self.standing.open(feed.peer, now)
        self.failures.pop(feed.peer, None)
        self.counters["feed_opened"] += 1
        old_peer, feed.replaces = feed.replaces, None
        old = self.feeds.get(old_peer) if old_peer is not None else None
        if old is None or old_peer is None:
            return None
        del self.feeds[old_peer]
        self.rested[old_peer] = now
        if len(self.rested) > self.table.capacity:
            del self.rested[min(self.rested, key=self.rested.__getitem__)]
        self.counters["feed_rotated"] += 1
        return old_peer

    def frame(self, feed: Feed, now: float) -> None:
        """A frame arrived on ``feed`` at ``now`` (``_follow``: a valid one)."""
        self.counters["feed_frames"] += 1
        if feed.trial is not None:
            feed.trial.frames += 1
        self.standing.frame(feed.peer, now)

    def refused(self, feed: Feed, now: float) -> None:
        """The source answered BUSY (``_open``: ``feed_refused``); the feed ends."""
        self.cool(now, feed.peer, "feed_refused")
        if self.feeds.get(feed.peer) is feed:
            del self.feeds[feed.peer]

    def cool(self, now: float, peer: int, counter: str, *, strikes: int = 0) -> None:
        """``FeedClient._cool`` (never ``full``: no invalid frame here)."""
        self.counters[counter] += 1
        if len(self.failures) > self.table.capacity:
            self.failures.clear()
        n = self.failures[peer] = self.failures.get(peer, 0) + 1
        self.cooldown[peer] = now + min(self.config.cooldown_s,
                                        RETRY_S * 2 ** (max(n, strikes) - 1))

    # -- the pick --------------------------------------------------------------------------
    def pick(self, *, want: Kind | None = None, at_least: Kind | None = None,
             unrested: bool = False) -> int | None:
        """``FeedClient._pick``: ``want`` None, unrested then rested; ``STRANGER`` (and no
        ``at_least``), strangers first; then the best kind there is, at least ``at_least``;
        candidates by ``Standing.rank`` (while signal flows, a live one is a stranger);
        ``unrested``: unrested strangers first. All of it among the candidates outside
        the full networks (``full``) while there is one (``_spread``)."""
        self._avoid = self._outside(self.full())
        try:
            return self._pick(want=want, at_least=at_least, unrested=unrested)
        finally:
            self._avoid = frozenset()

    def _outside(self, full: frozenset[int]) -> frozenset[int]:
        """``full`` if a candidate outside it is left, else none (the cap gives way)."""
        self._avoid = full
        try:
            return full if full and self._uniform(lambda p: True, listed=None) is not None \
                else frozenset()
        finally:
            self._avoid = frozenset()

    def full(self, *, besides: Feed | None = None) -> frozenset[int]:
        """``FeedClient._full``: networks whose open feeds (not ``besides``, nor those a
        rotation replaces) hold ``feeds.max_per_network`` slots."""
        cap = self.config.max_per_network
        if not cap:
            return frozenset()
        leaving = {f.replaces for f in self.feeds.values() if f.replaces is not None}
        held = collections.Counter(
            net for f in self.feeds.values()
            if f.open and f is not besides and f.peer not in leaving
            and (net := self.network(f.peer)) is not None)
        return frozenset(net for net, n in held.items() if n >= cap)

    def network_full(self, feed: Feed, now: float) -> bool:
        """``FeedClient._network_full``: ``feed``'s network holds its slots while a candidate
        elsewhere is left; then the feed ends, its source cooled (the caller opens nothing)."""
        net = self.network(feed.peer)
        if net is None or net not in self._outside(self.full(besides=feed)):
            return False
        self.cool(now, feed.peer, "feed_network_full")
        if self.feeds.get(feed.peer) is feed:
            del self.feeds[feed.peer]
        return True

    def _pick(self, *, want: Kind | None, at_least: Kind | None,
              unrested: bool) -> int | None:
        if want is None:
            peer = self._uniform(lambda p: p not in self.rested, listed=None)
            if peer is None:
                peer = self._uniform(lambda p: p in self.rested, listed=list(self.rested))
            return peer
        strangers_first = want is Kind.STRANGER and at_least is None
        if strangers_first and unrested:
            peer = self._uniform(lambda p: self._stranger(p) and p not in self.rested,
                                 listed=None)
            if peer is not None:
                return peer
        if strangers_first:
            peer = self._uniform(self._stranger, listed=None)
            if peer is not None:
                return peer
        floor = Kind.STRANGER if at_least is None else at_least
        for kind, listed in ((Kind.PROVEN, self.signal), (Kind.LIVE, self.valid)):
            if kind < floor:
                break
            peer = self._uniform(lambda p: self.standing.rank(p) is kind, listed=list(listed))
            if peer is not None:
                return peer
        if floor is Kind.STRANGER and not strangers_first:
            return self._uniform(self._stranger, listed=None)
        return None

    def _stranger(self, peer: int) -> bool:
        return self.standing.rank(peer) is Kind.STRANGER

    def _candidate(self, peer: int) -> bool:
        return peer != self.me and peer not in self.feeds and peer not in self.cooldown \
            and (not self._avoid or self.network(peer) not in self._avoid)

    def _uniform(self, test: Callable[[int], bool], *, listed: Sequence[int] | None) -> int | None:
        """Uniform over the table's candidates that pass ``test``: over ``listed`` if given
        (a short list that holds them all), else by rejection from the table, else (none
        drawn) over the table."""
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
