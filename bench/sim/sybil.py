"""A Sybil farm against the feed-source picker (issue 32): the honest share of feed slots.

N honest nodes and F Sybil identities share one peer table (they announce like honest peers;
honest peers arrived first, so a farm beyond the table's capacity keeps only what fits). Every
honest node runs ``bench/sim/picker.py``'s ``FeedPicker`` (``swarm/feeds.py``'s choice) every
``TICK_S`` it has something to do, opens the feeds it picks after ``open_s`` (dial and
handshake), passes on every batch they bring as a frame (``FeedPicker.frame``: the product's
``Standing`` reads the swarm's publishing pace from them), and once a round (``round_s``, its
own random offset) its learner re-scores what the feeds delivered and reports, per sender,
its running totals of groups that passed re-scoring (``valid``) and of those that carried
signal (``signal``), each for the ``MAX_SOURCES`` senders with most, and of its own local
groups that carried signal (``own``: ``groups_per_batch`` local groups a round, each with
signal with ``p_pass`` like an honest source's, counted after the report as
``node/learner/loop.py`` does). That is the ``new`` policy (``node/learner``); the ``old``
one, the picker before issue 32, never hears a report.

What a source delivers on an open feed (nothing is simulated byte by byte):

- an honest source publishes one batch of ``groups_per_batch`` groups a round (its own
  offset); every group is valid (its claimed rewards are ours), carries signal after
  re-scoring with ``p_pass`` and is useful (beats our baseline) with ``p_useful``
  (``bench/sim/config.py``'s ``Sapo`` defaults); it serves at most ``max_subscribers`` feeds
  (beyond: busy, the requester cools it);
- a Sybil accepts every feed and behaves as its ``Farm`` says (``FARMS``); a subscription
  that asks for a backfill (``Feed.backfill``) first gets the source's newest batch, if one
  is younger than ``backfill_s``.

Left out: churn, departures and failed dials, the network's latency beyond ``open_s``, CPU,
SAPO's pool (trust, freshness, the newcomer budget: ``usable`` only caps J and the per-sender
share), the learner's bounded sender book, the time a round's re-scoring takes (a round is
``round_s``, whatever the farm sends), and any slowdown the farm's groups cause (the groups a
farm makes us re-score are counted, not charged).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any

from bench.sim.config import Sapo
from bench.sim.picker import MAX_SOURCES, TICK_S, Feed, FeedPicker, Table
from swarm.config import FeedsConfig

__all__ = ["FARMS", "POLICIES", "Farm", "SybilScenario", "run"]

POLICIES = ("old", "new")
"""``old``: uniform over never-held keys, then rested ones, no judgement (swarm/feeds.py
before issue 32). ``new``: sources chosen by what they deliver (swarm/feeds.py now)."""


@dataclass(frozen=True, kw_only=True)
class Farm:
    """How every Sybil identity serves the feeds it is asked for."""

    batch_every_s: float = 0.0
    """Period of its batches on each feed (0: it sends nothing)."""
    signal_groups: int = 0
    """Groups of a batch that carry signal after our re-scoring (never useful: they never
    beat our baseline); the others are all-wrong, dropped as zero-advantage. Every group is
    valid: its claimed rewards are the ones we compute."""
    groups_per_batch: int = 4
    mint_every_s: float = 0.0
    """One fresh identity joins the farm (and the tables) this often; 0: never."""

    def __post_init__(self) -> None:
        for name in ("batch_every_s", "signal_groups", "mint_every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"Farm.{name} must be >= 0, got {getattr(self, name)}")
        if self.signal_groups > self.groups_per_batch:
            raise ValueError("Farm.signal_groups must be <= groups_per_batch")
        if self.signal_groups and not self.batch_every_s:
            raise ValueError("Farm.signal_groups needs batch_every_s > 0")


FARMS: dict[str, Farm] = {
    "idle": Farm(),
    "wrong": Farm(batch_every_s=1.0),
    "trickle": Farm(batch_every_s=15.0),
    "mint": Farm(mint_every_s=8.0),
    "signal": Farm(batch_every_s=15.0, signal_groups=1),
}
"""As ``tests/adversary/feeds.py`` (``bench/feed_eclipse.py``): ``idle`` accepts feeds and
sends nothing (reported: nothing); ``wrong`` a batch of all-wrong valid groups a second (valid,
no signal: a *live* source until it is closed for no signal); ``trickle`` the same every 15 s
(rarely valid); ``mint`` is idle and adds a fresh key every 8 s. ``signal`` (not in the
adversary suite): a trickle whose batches hold one group with signal that never beats our
baseline: it passes the re-scoring the learner reports, so it is *proven* without being
useful."""


@dataclass(frozen=True, kw_only=True)
class SybilScenario:
    """One run: N honest nodes, a farm of F identities, one policy."""

    n: int
    """Honest nodes (each is observed)."""
    farm_size: int
    """F: Sybil identities at the start."""
    farm: str = "idle"
    """A key of ``FARMS``."""
    policy: str = "new"
    """One of ``POLICIES``."""
    farm_networks: int = 0
    """The networks (``swarm.networks``) the farm's keys sit in, minted ones too, in turn:
    1 = one machine or one /24; 0 = each key in a network of its own (what the cap,
    ``feeds.max_per_network``, cannot bound). Each honest node is in a network of its own."""
    rounds: int = 60
    round_s: float = 10.0
    """The learner's round (``bench/sim``'s ``Scenario.round_s``)."""
    open_s: float = 1.0
    """Pick to open feed: dial and handshake over the WAN."""
    seed: int = 0
    feeds: FeedsConfig = field(default_factory=FeedsConfig)
    sapo: Sapo = field(default_factory=Sapo)

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"SybilScenario.n must be at least 2, got {self.n}")
        if self.farm_size < 0:
            raise ValueError(f"SybilScenario.farm_size must be >= 0, got {self.farm_size}")
        if self.farm_networks < 0:
            raise ValueError(f"SybilScenario.farm_networks must be >= 0, "
                             f"got {self.farm_networks}")
        if self.farm not in FARMS:
            raise ValueError(f"SybilScenario.farm must be one of {sorted(FARMS)}, "
                             f"got {self.farm!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"SybilScenario.policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("rounds", "round_s", "open_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SybilScenario.{name} must be positive")


TICK, OPENED, REPORT, MINT = range(4)


class _Run:
    """The event loop of one ``SybilScenario`` (seconds; one heap)."""

    def __init__(self, sc: SybilScenario) -> None:
        self.sc = sc
        self.farm = FARMS[sc.farm]
        self.rng = random.Random(sc.seed)
        self.heap: list[tuple[float, int, int, int, Any]] = []
        self.seq = itertools.count()
        n = sc.n
        self.table = Table(range(n + sc.farm_size))
        self.next_id = n + sc.farm_size
        self.offset: dict[int, float] = {}  # a source's publish phase
        for p in range(n + sc.farm_size):
            self._new_offset(p)
        self.pickers = [FeedPicker(v, config=sc.feeds, table=self.table,
                                   rng=random.Random(self.rng.getrandbits(64)),
                                   network=self.network) for v in range(n)]
        self.subs: dict[int, set[int]] = {}  # source -> subscribers with an open feed
        self.credited: list[dict[int, float]] = [{} for _ in range(n)]
        # the learner's running totals, sender -> groups with signal, valid groups
        self.signal_book: list[dict[int, int]] = [{} for _ in range(n)]
        self.valid_book: list[dict[int, int]] = [{} for _ in range(n)]
        self.own_signal = [0] * n  # our own local groups that carried signal so far
        # sender -> [groups with signal, valid ones, useful ones] since the last report
        self.inbox: list[dict[int, list[int]]] = [{} for _ in range(n)]
        self.tick_phase = [self.rng.random() * TICK_S for _ in range(n)]
        self.next_tick = [math.inf] * n
        k, r = sc.feeds.sources, sc.rounds
        self.honest_slots = [[0] * (k + 1) for _ in range(r)]  # round -> histogram over nodes
        self.sybil_slots = [0] * r
        self.signal = [0] * r
        self.useful = [0] * r
        self.usable = [0] * r
        self.sybil_signal = [0] * r
        self.sybil_groups = [0] * r
        self.samples = [0] * r

    # -- time ------------------------------------------------------------------------------
    def push(self, t: float, kind: int, v: int, payload: Any = None) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, v, payload))

    def tick_at(self, v: int, at: float) -> None:
        """Wake ``v``'s maintenance at its first tick at or after ``at``."""
        phase = self.tick_phase[v]
        t = phase + math.ceil(max(0.0, at - phase) / TICK_S - 1e-9) * TICK_S
        if t < self.next_tick[v]:
            self.next_tick[v] = t
            self.push(t, TICK, v)

    def _new_offset(self, p: int) -> None:
        period = self.sc.round_s if p < self.sc.n else self.farm.batch_every_s
        if period:
            self.offset[p] = self.rng.random() * period

    # -- deliveries ------------------------------------------------------------------------
    def _batch_times(self, s: int, since: float, until: float) -> list[float]:
        """When ``s`` published its batches in (since, until]."""
        period = self.sc.round_s if s < self.sc.n else self.farm.batch_every_s
        if not period:
            return []
        off = self.offset[s]
        first = math.floor((since - off) / period) + 1
        return [off + m * period for m in range(first, math.floor((until - off) / period) + 1)]

    def _receive(self, v: int, s: int, batches: int) -> None:
        if batches <= 0:
            return
        sapo = self.sc.sapo
        if s < self.sc.n:
            signal = useful = 0
            valid = batches * sapo.groups_per_batch
            p_useful = sapo.p_pass * sapo.p_useful  # one draw a group: useful, signal, none
            for _ in range(valid):
                u = self.rng.random()
                signal += u < sapo.p_pass
                useful += u < p_useful
        else:
            signal, valid, useful = (batches * self.farm.signal_groups,
                                     batches * self.farm.groups_per_batch, 0)
        got = self.inbox[v].setdefault(s, [0, 0, 0])
        got[0] += signal
        got[1] += valid
        got[2] += useful

    def credit(self, v: int, feed: Feed, until: float) -> None:
        """What ``feed``'s source published on ``v``'s open feed since it was last credited,
        each batch a frame at the time it was published."""
        s = feed.peer
        times = self._batch_times(s, self.credited[v][s], until)
        if self.sc.policy == "new":  # frames inform only the judgement, which needs reports
            for t in times:
                self.pickers[v].frame(feed, t)
        self._receive(v, s, len(times))
        self.credited[v][s] = until

    def close(self, v: int, s: int) -> None:
        """``v`` closed its feed from ``s`` (credited up to now)."""
        del self.credited[v][s]
        self.subs[s].discard(v)

    # -- events ----------------------------------------------------------------------------
    def on_tick(self, t: float, v: int) -> None:
        if t != self.next_tick[v]:
            return  # superseded by an earlier wake-up
        self.next_tick[v] = math.inf
        picker = self.pickers[v]
        for feed in picker.maintain(t):
            self.push(t + self.sc.open_s, OPENED, v, feed)
        if picker.missing() > 0:
            self.tick_at(v, t + TICK_S)
        else:
            self.tick_at(v, max(t + TICK_S, picker.rotation_due()))

    def on_opened(self, t: float, v: int, feed: Feed) -> None:
        picker, s = self.pickers[v], feed.peer
        if picker.feeds.get(s) is not feed:
            return
        subs = self.subs.setdefault(s, set())
        if s < self.sc.n and len(subs) >= self.sc.feeds.max_subscribers:
            picker.refused(feed, t)
        elif picker.network_full(feed, t):
            pass  # not opened: its network holds its slots (the picker cooled it)
        else:
            subs.add(v)
            self.credited[v][s] = t
            old = picker.feeds.get(feed.replaces) if feed.replaces is not None else None
            if old is not None and old.open:
                self.credit(v, old, t)
            if picker.opened(feed, t) is not None and old is not None:
                self.close(v, old.peer)
            if feed.backfill and self._batch_times(s, t - self.sc.feeds.backfill_s, t):
                picker.frame(feed, t)
                self._receive(v, s, 1)
        self.tick_at(v, t)

    def on_report(self, t: float, v: int, r: int) -> None:
        picker, n, sapo = self.pickers[v], self.sc.n, self.sc.sapo
        honest = sybil = 0
        for feed in picker.feeds.values():
            if feed.open:
                self.credit(v, feed, t)
                honest += feed.peer < n
                sybil += feed.peer >= n
        self.honest_slots[r][min(honest, self.sc.feeds.sources)] += 1
        self.sybil_slots[r] += sybil
        self.samples[r] += 1
        signal_book, valid_book = self.signal_book[v], self.valid_book[v]
        usable = 0
        for s, (signal, valid, useful) in self.inbox[v].items():
            if signal:
                signal_book[s] = signal_book.get(s, 0) + signal
            if valid:
                valid_book[s] = valid_book.get(s, 0) + valid
            if s < n:
                self.signal[r] += signal
                self.useful[r] += useful
                usable += min(sapo.per_sender_round, useful)
            else:
                self.sybil_signal[r] += signal
                self.sybil_groups[r] += valid
        self.usable[r] += min(sapo.external, usable)
        self.inbox[v].clear()
        if self.sc.policy == "new":
            closed = picker.rate(t, _top(signal_book), _top(valid_book), own=self.own_signal[v])
            for s in closed:
                self.close(v, s)
            # a closed slot is filled at once; a report may starve the picker (rotation_due)
            self.tick_at(v, t if closed else max(t, picker.rotation_due()))
            self.own_signal[v] += sum(self.rng.random() < sapo.p_pass
                                      for _ in range(sapo.groups_per_batch))
        if r + 1 < self.sc.rounds:
            self.push(t + self.sc.round_s, REPORT, v, r + 1)

    def on_mint(self, t: float) -> None:
        p = self.next_id
        self.next_id += 1
        self.table.add(p)
        self._new_offset(p)
        self.push(t + self.farm.mint_every_s, MINT, -1)

    def network(self, peer: int) -> int | None:
        """``SybilScenario.farm_networks``: an honest node's network is its own; a farm
        key's one of the farm's, or its own (no network: None) when that is 0."""
        n, nets = self.sc.n, self.sc.farm_networks
        if peer < n:
            return peer
        return n + peer % nets if nets else None

    def run(self) -> None:
        sc = self.sc
        reports_left = sc.n * sc.rounds
        for v in range(sc.n):
            self.tick_at(v, 0.0)
            self.push(self.rng.random() * sc.round_s, REPORT, v, 0)
        if self.farm.mint_every_s:
            self.push(self.farm.mint_every_s, MINT, -1)
        while self.heap:
            t, _, kind, v, payload = heapq.heappop(self.heap)
            if kind == REPORT:
                self.on_report(t, v, payload)
            elif kind == TICK:
                self.on_tick(t, v)
            elif kind == OPENED:
                self.on_opened(t, v, payload)
            elif kind == MINT:
                self.on_mint(t)
            if kind == REPORT:
                reports_left -= 1
                if not reports_left:
                    break  # every node's last round is done


def _top(book: dict[int, int]) -> dict[int, int]:
    """The learner's report of a running total: the ``MAX_SOURCES`` senders with most."""
    if len(book) <= MAX_SOURCES:
        return dict(book)
    return dict(heapq.nlargest(MAX_SOURCES, book.items(), key=lambda kv: kv[1]))


def run(sc: SybilScenario) -> dict[str, Any]:
    """Simulate ``sc``; per round (each node's r-th report, averaged over the nodes) and over
    the steady state (the second half of the rounds): the feeds a node holds from honest
    sources and from the farm, the honest groups with signal, useful, and usable (at most J,
    at most ``per_sender_round`` from one sender) it received, and the farm's groups it
    re-scored (``sybil_groups_per_round``) and found signal in."""
    sim = _Run(sc)
    sim.run()
    k, r0 = sc.feeds.sources, sc.rounds // 2
    samples = sum(sim.samples[r0:])

    def steady(xs: list[int]) -> float:
        return sum(xs[r0:]) / samples

    honest_per_round = [sum(i * c for i, c in enumerate(h)) / max(1, m)
                        for h, m in zip(sim.honest_slots, sim.samples)]
    honest = sum(i * c for h in sim.honest_slots[r0:] for i, c in enumerate(h)) / samples
    counters: dict[str, int] = {}
    for p in sim.pickers:
        for name, c in p.counters.items():
            counters[name] = counters.get(name, 0) + c
    return {
        "n": sc.n, "farm_size": sc.farm_size, "farm": sc.farm, "policy": sc.policy,
        "farm_networks": sc.farm_networks,
        "seed": sc.seed, "rounds": sc.rounds,
        "honest_slots": honest,
        "honest_slot_share": honest / k,
        "sybil_slots": steady(sim.sybil_slots),
        "no_honest_feed": sum(h[0] for h in sim.honest_slots[r0:]) / samples,
        "honest_signal_per_round": steady(sim.signal),
        "honest_useful_per_round": steady(sim.useful),
        "usable_per_round": steady(sim.usable),
        "sybil_signal_per_round": steady(sim.sybil_signal),
        "sybil_groups_per_round": steady(sim.sybil_groups),
        "honest_slots_per_round": [round(x, 3) for x in honest_per_round],
        "farm_at_end": len(sim.table) - sc.n,
        "identities_minted": sim.next_id - sc.n - sc.farm_size,
        "counters": counters,
    }
