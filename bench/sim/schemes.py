"""Where a node's batch goes: flood (one gossip topic) or receiver-chosen feeds (swarm/SCALING.md).

A scheme answers the engine's questions (``bench/sim/engine.py``): the topics a node joins,
whom it may graft in a topic's mesh, what it publishes each round and to whom; feeds also own
their events (``handle``) and hear when a departed peer is noticed (``on_detect``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.sim.engine import Sim

__all__ = ["Feeds", "Flood", "make_scheme"]

ROLLOUTS = "rollouts"
SCHEME_EVENT = 8  # engine.SCHEME
ARRIVE_EVENT = 0  # engine.ARRIVE


class Flood:
    """One rollout topic everybody joins; a batch reaches every peer through the mesh."""

    graft_connects = True

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def setup(self) -> None:
        for v in range(len(self.sim.online)):
            self.sim.join_topic(v, ROLLOUTS)

    def on_join(self, t: float, v: int) -> None:
        self.sim.join_topic(v, ROLLOUTS)

    def mesh_candidates(self, v: int, topic: object) -> list[int]:
        members = self.sim.members[topic]
        return [w for w in self.sim.conns[v] if w in members]

    def publish(self, t: float, v: int, k: int) -> list[tuple[int, int]]:
        sim = self.sim
        m = sim.new_message(v, ROLLOUTS, k, sim.sc.costs.batch_bytes, True, None)
        return [(m, len(sim.mesh[ROLLOUTS][v]))]

    def publish_targets(self, v: int, m: int) -> set[int]:
        return set(self.sim.mesh[self.sim.m_topic[m]].get(v, ()))

    def handle(self, t: float, node: int, a: object, b: object) -> None:
        """Flood has no events of its own."""

    def on_detect(self, t: float, v: int) -> None:
        """The mesh repair is the engine's heartbeat."""


class Feeds(Flood):
    """Each node holds ``feed_sources`` feeds to distinct peers it picked uniformly from its
    peer table; every ``feed_rotate_s`` it opens a replacement beside the oldest and closes the
    oldest when the replacement is open (make before break, swarm/feeds.py); a source pushes
    only its own batches, one hop, to at most ``feed_max_subscribers`` subscribers (beyond:
    busy, the requester cools it down and picks again); a subscription that fills a gap (not a
    rotation's) first gets the source's newest batch if it is younger than ``feed_backfill_s``.
    A pick of a departed peer (still in the table for ``Scheme.table_ttl_s``) or a source that
    leaves fails after ``detect_s``; the node picks again."""

    graft_connects = False

    def __init__(self, sim: Sim) -> None:
        super().__init__(sim)
        self.subscribers: list[set[int]] = []
        self.sources: list[dict[int, float]] = []  # source -> since (insertion order: oldest first)
        self.pending: list[set[int]] = []
        self.cooldown: list[dict[int, float]] = []
        self.newest: list[tuple[int, float] | None] = []
        self.replacing: list[int | None] = []  # a rotation's replacement being opened
        self.ttl_ms = sim.announce.table_ttl_s * 1000
        self.handshakes = 0
        self.busy_refusals = 0
        self.failed_picks = 0
        self.held = 0  # sum of sources held, sampled at each rotation
        self.held_samples = 0

    def _grow(self) -> None:
        while len(self.subscribers) < len(self.sim.online):
            self.subscribers.append(set())
            self.sources.append({})
            self.pending.append(set())
            self.cooldown.append({})
            self.newest.append(None)
            self.replacing.append(None)

    def setup(self) -> None:
        self._grow()
        sim = self.sim
        rotate_ms = sim.sc.scheme.feed_rotate_s * 1000
        for v in range(len(sim.online)):
            if not sim.is_boot[v]:
                self._fill(0.0, v)
                sim.push(sim.rng.random() * rotate_ms, SCHEME_EVENT, v, "rotate")

    def on_join(self, t: float, v: int) -> None:
        self._grow()
        self._fill(t, v)
        self.sim.push(t + self.sim.sc.scheme.feed_rotate_s * 1000, SCHEME_EVENT, v, "rotate")

    # -- picking and subscribing -----------------------------------------------------------
    def _eligible(self, t: float, v: int, s: int) -> bool:
        sim = self.sim
        return (s != v and not sim.is_boot[s] and sim.joined[s] <= t
                and t <= sim.left[s] + self.ttl_ms
                and s not in self.sources[v] and s not in self.pending[v]
                and self.cooldown[v].get(s, -1.0) <= t)

    def _pick(self, t: float, v: int) -> int | None:
        sim = self.sim
        n = len(sim.online)
        for _ in range(64):  # uniform over the table by rejection
            s = sim.rng.randrange(n)
            if self._eligible(t, v, s):
                return s
        return None  # the table has no other eligible peer now; the next rotation retries

    def _subscribe(self, t: float, v: int, s: int, *, live: bool) -> None:
        sim = self.sim
        self.pending[v].add(s)
        sim.cpu.submit(t, v, sim.sc.costs.handshake_ms)
        if sim.online[s]:
            sim.send(t, v, s, sim.sc.costs.control_bytes, SCHEME_EVENT,
                     "sublive" if live else "sub", v)
        else:  # a departed peer still in the table: the dial fails after detect_s
            self.failed_picks += 1
            sim.push(t + sim.sc.scheme.detect_s * 1000, SCHEME_EVENT, v, "failed", s)

    def _fill(self, t: float, v: int) -> None:
        """Pick sources until k are held or asked for (a rotation's replacement aside)."""
        k = self.sim.sc.scheme.feed_sources
        while len(self.sources[v]) + len(self.pending[v]) - (self.replacing[v] is not None) < k:
            s = self._pick(t, v)
            if s is None:
                return
            self._subscribe(t, v, s, live=False)

    def handle(self, t: float, node: int, a: object, b: object) -> None:
        sim = self.sim
        sch = sim.sc.scheme
        if a == "rotate":
            if not sim.online[node]:
                return
            self.held += len(self.sources[node])
            self.held_samples += 1
            if not sch.feed_make_before_break and len(self.sources[node]) >= sch.feed_sources:
                oldest = next(iter(self.sources[node]))
                del self.sources[node][oldest]
                self.subscribers[oldest].discard(node)
            elif len(self.sources[node]) >= sch.feed_sources and self.replacing[node] is None:
                s = self._pick(t, node)
                if s is not None:  # opened beside the oldest, which closes when it is open
                    self.replacing[node] = s
                    self._subscribe(t, node, s, live=True)
            self._fill(t, node)
            sim.push(t + sch.feed_rotate_s * 1000, SCHEME_EVENT, node, "rotate")
        elif a in ("sub", "sublive"):  # at the source
            assert isinstance(b, int)
            if not sim.online[node]:
                return  # the requester notices through ``failed`` (scheduled by detect)
            if len(self.subscribers[node]) >= sch.feed_max_subscribers:
                self.busy_refusals += 1
                sim.cpu.submit(t, node, sim.sc.costs.control_ms)
                sim.send(t, node, b, sim.sc.costs.control_bytes, SCHEME_EVENT, "busy", node)
                return
            self.handshakes += 1
            self.subscribers[node].add(b)
            sim.cpu.submit(t, node, sim.sc.costs.handshake_ms)
            sim.send(t, node, b, sim.sc.costs.control_bytes, SCHEME_EVENT, "ok", node)
            newest = self.newest[node]
            if a == "sub" and newest is not None and t - newest[1] <= sch.feed_backfill_s * 1000:
                sim.cpu.submit(t, node, sim.sc.costs.send_ms)
                sim.send(t, node, b, sim.m_bytes[newest[0]], ARRIVE_EVENT, newest[0], node)
        elif a in ("ok", "busy", "failed"):
            assert isinstance(b, int)
            self.pending[node].discard(b)
            rotation = self.replacing[node] == b
            if rotation:
                self.replacing[node] = None
            if not sim.online[node]:
                return
            if a == "ok" and sim.online[b]:
                self.sources[node][b] = t
                while len(self.sources[node]) > sch.feed_sources:  # the replaced (oldest) goes
                    oldest = next(iter(self.sources[node]))
                    del self.sources[node][oldest]
                    self.subscribers[oldest].discard(node)
            else:
                if a == "ok":  # the source left since it answered
                    self.subscribers[b].discard(node)
                self.busy_refusals += a == "busy"
                # a dial that failed (departed) forgets the peer (swarm/feeds.py); it never
                # announces again
                gone = a == "failed" and not sim.online[b]
                self.cooldown[node][b] = math.inf if gone else t + sch.feed_cooldown_s * 1000
                self._fill(t, node)

    def on_detect(self, t: float, v: int) -> None:
        """``v`` left ``detect_s`` ago: its subscribers pick again, its sources drop it."""
        for s in list(self.sources[v]):
            self.subscribers[s].discard(v)
        self.sources[v].clear()
        for w in list(self.subscribers[v]):
            if v in self.sources[w]:
                del self.sources[w][v]
                if self.sim.online[w]:
                    self.cooldown[w][v] = t + self.sim.sc.scheme.feed_cooldown_s * 1000
                    self._fill(t, w)
        self.subscribers[v].clear()
        for w in range(len(self.pending)):  # requests that went to v and were never answered
            if v in self.pending[w]:
                self.sim.push(t, SCHEME_EVENT, w, "failed", v)

    # -- publishing ------------------------------------------------------------------------
    def publish(self, t: float, v: int, k: int) -> list[tuple[int, int]]:
        sim = self.sim
        subs = self.subscribers[v]
        m = sim.new_message(v, None, k, sim.sc.costs.batch_bytes, True, set(subs))
        self.newest[v] = (m, t)
        return [(m, len(subs))]

    def publish_targets(self, v: int, m: int) -> set[int]:
        return set(self.subscribers[v])


def make_scheme(kind: str, sim: Sim) -> Flood:
    return {"flood": Flood, "feeds": Feeds}[kind](sim)
