"""The discrete-event simulation: peers, connections, gossipsub meshes, churn, SAPO rounds.

Time is in milliseconds; one heap of events ``(t, seq, kind, node, a, b)``. What is modelled
(py-libp2p 0.8.1 gossipsub as ``swarm/host.py`` configures it, ``swarm/discovery.py``):

- connections: a node dials peers until it holds ``connections``; of two peers only the one
  ranked lower dials (discovery's dial rule), so degrees are uneven; a joiner dials at once;
- a mesh per topic: a joining node grafts up to D connected members; grafts are accepted; every
  heartbeat a node below D_low grafts up to D and one above D_high prunes to D;
- a message is forwarded to the mesh minus its forwarder and origin; a copy of a message the
  node already has (or has queued) costs ``copy_ms`` and is dropped; the first costs
  ``copy_ms + first_ms`` plus ``send_ms`` per copy forwarded;
- every heartbeat a node sends IHAVE (the ids it processed in the last ``gossip_window``
  heartbeats) to up to max(6, 1/4) of its connected non-mesh members; the receiver IWANTs each
  id it has not *processed* yet (py-libp2p checks its seen cache, which a message enters after
  validation), so a node whose queue lags pulls extra copies;
- a node's CPU is ``bench/sim/cpu.py``'s; a WAN node's copies leave its uplink one at a time;
- churn: each peer leaves at rate ``churn_per_min`` (Poisson); neighbours notice after
  ``detect_s``; a fresh identity joins ``rejoin_s`` (exponential mean) later;
- SAPO: every round a node feeds the batches it received into its ``SimPool`` and takes J.

Schemes (``bench/sim/schemes.py``) decide which topics a node joins and publishes to.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque

from bench.sim.announce import announce_load
from bench.sim.config import Scenario
from bench.sim.cpu import OwnCore, SharedCores
from bench.sim.pool import SimPool
from bench.sim.schemes import make_scheme
from bench.sim.wan import WanLatency

__all__ = ["Sim"]

ARRIVE, JOB, PUBLISH, HEARTBEAT, IHAVE, LEAVE, DETECT, JOIN, SCHEME = range(9)
INF = math.inf


class Sim:
    """One scenario; ``run()`` then read the per-node and per-message records."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed)
        self.heap: list[tuple] = []
        self.counter = itertools.count()
        self.now = 0.0
        self.end_ms = sc.rounds * sc.round_s * 1000
        self.deadline_ms = sc.deadline_rounds * sc.round_s * 1000
        net = sc.network
        self.announce = announce_load(sc, sc.n + (net.mode == "testbed"))
        if net.mode == "wan":
            # announcements take this fraction of each node's core; beyond 95% the node is
            # saturated (metrics.summarize flags it) and the rollout latencies mean little
            busy = min(0.95, self.announce.cpu_ms_per_s / 1000)
            self.cpu: OwnCore | SharedCores = OwnCore(self._schedule_job, slowdown=1 / (1 - busy))
            self.wan: WanLatency | None = WanLatency(self.rng, jitter=net.jitter)
        else:
            other = net.background_load + (sc.n + 1) * self.announce.cpu_ms_per_s / 1000
            free = max(0.05 * net.cores, net.cores - other)
            self.cpu = SharedCores(self._schedule_job, cores=net.cores, slowdown=net.cores / free)
            self.wan = None
        self.ms_per_byte = 8 / (net.uplink_mbps * 1000)
        d = sc.scheme.degree
        self.d, self.d_low, self.d_high = d, max(2, d - 2), 2 * d
        # per node
        self.online: list[bool] = []
        self.joined: list[float] = []
        self.left: list[float] = []
        self.rank: list[float] = []
        self.offset: list[float] = []
        self.up_free: list[float] = []
        self.conns: list[set[int]] = []
        self.dead_known: list[set[int]] = []
        self.topics: list[set] = []
        self.claimed: list[set[int]] = []
        self.seen: list[set[int]] = []
        self.mcache: list[deque[set[int]]] = []
        self.inbox: list[list[int]] = []
        self.pools: list[SimPool] = []
        self.taken: list[list[tuple[int, int]]] = []  # (round, sender)
        self.bytes_in: list[int] = []
        self.bytes_out: list[int] = []
        self.copies_in: list[int] = []
        self.firsts: list[int] = []
        self.dups: list[int] = []
        self.is_boot: list[bool] = []
        # per topic: members, mesh
        self.members: dict[object, set[int]] = {}
        self.mesh: dict[object, dict[int, set[int]]] = {}
        # per message
        self.m_origin: list[int] = []
        self.m_topic: list[object] = []
        self.m_t: list[float] = []
        self.m_round: list[int] = []
        self.m_bytes: list[int] = []
        self.m_batch: list[bool] = []
        self.m_intended: list[set[int] | None] = []  # None: every peer online throughout
        self.m_pullers: dict[int, set[int]] = {}
        self.deliveries: list[tuple[int, int, float]] = []  # (msg, node, latency ms)
        self.lost_copies = 0
        self.scheme = make_scheme(sc.scheme.kind, self)

    # -- events ----------------------------------------------------------------------------
    def push(self, t: float, kind: int, node: int, a: object = None, b: object = None) -> None:
        heapq.heappush(self.heap, (t, next(self.counter), kind, node, a, b))

    def _schedule_job(self, t: float, node: int, action: object) -> None:
        self.push(t, JOB, node, action)

    def run(self) -> Sim:
        sc = self.sc
        for _ in range(sc.n + (1 if self.testbed_boot else 0)):
            self._new_node(0.0)
        self.scheme.setup()
        self._connect_initial()
        for v in range(len(self.online)):
            for topic in self.topics[v]:
                self._graft_up(v, topic)
        self.push(sc.scheme.heartbeat_s * 1000, HEARTBEAT, -1)
        for v in range(len(self.online)):
            self._schedule_rounds(v, 0.0)
        handlers = {ARRIVE: self._arrive, JOB: self._job, PUBLISH: self._publish,
                    HEARTBEAT: self._heartbeat, IHAVE: self._ihave, LEAVE: self._leave,
                    DETECT: self._detect, JOIN: self._join, SCHEME: self.scheme.handle}
        stop = self.end_ms + self.deadline_ms
        heap = self.heap
        while heap:
            t, _, kind, node, a, b = heapq.heappop(heap)
            if t > stop:
                break
            self.now = t
            handlers[kind](t, node, a, b)
        return self

    @property
    def testbed_boot(self) -> bool:
        """gossip_bench's bootstrap peer: connected to all, relays, publishes nothing."""
        return self.sc.network.mode == "testbed"

    # -- nodes -----------------------------------------------------------------------------
    def _new_node(self, t: float) -> int:
        v = len(self.online)
        self.online.append(True)
        self.joined.append(t)
        self.left.append(INF)
        self.rank.append(self.rng.random())
        self.offset.append(0.0 if self.sc.synchronized else self.rng.random() * self.sc.round_s * 1000)
        self.up_free.append(0.0)
        for lst in (self.conns, self.dead_known, self.topics, self.claimed, self.seen):
            lst.append(set())
        self.mcache.append(deque([set()], maxlen=self.sc.scheme.gossip_window))
        self.inbox.append([])
        self.pools.append(SimPool(self.sc.sapo, random.Random(self.rng.random())))
        self.taken.append([])
        for lst in (self.bytes_in, self.bytes_out, self.copies_in, self.firsts, self.dups):
            lst.append(0)
        self.is_boot.append(self.testbed_boot and v == 0)
        self.cpu.add_node()
        if self.wan is not None:
            self.wan.add_peer()
        if self.sc.churn_per_min > 0 and not self.is_boot[v]:
            leave = t + self.rng.expovariate(self.sc.churn_per_min / 60_000)
            if leave < self.end_ms:
                self.push(leave, LEAVE, v)
        return v

    def _connect(self, a: int, b: int) -> None:
        self.conns[a].add(b)
        self.conns[b].add(a)

    def _connect_initial(self) -> None:
        """Dial rule of swarm/discovery.py: only the lower-ranked of two peers dials."""
        target = self.sc.scheme.connections
        nodes = list(range(len(self.online)))
        if self.testbed_boot:
            for v in nodes[1:]:
                self._connect(0, v)
        order = nodes[:]
        self.rng.shuffle(order)
        for v in order:
            if self.is_boot[v]:
                continue
            cands = [w for w in nodes if self.rank[w] > self.rank[v] and not self.is_boot[w]
                     and w not in self.conns[v]]
            self.rng.shuffle(cands)
            while len(self.conns[v]) < target and cands:
                self._connect(v, cands.pop())

    def _dial_up(self, v: int) -> None:
        """A joiner (or a node that lost peers) dials random online peers up to the target."""
        need = self.sc.scheme.connections - len(self.conns[v])
        if need <= 0:
            return
        n = len(self.online)
        for _ in range(4 * need):
            w = self.rng.randrange(n)
            if w != v and self.online[w] and w not in self.conns[v] and not self.is_boot[w]:
                self._connect(v, w)
                need -= 1
                if need == 0:
                    return

    def _schedule_rounds(self, v: int, t: float) -> None:
        round_ms = self.sc.round_s * 1000
        k = math.ceil(max(0.0, t - self.offset[v]) / round_ms)
        if not self.is_boot[v] and self.offset[v] + k * round_ms < self.end_ms:
            self.push(self.offset[v] + k * round_ms, PUBLISH, v, k)

    # -- meshes ----------------------------------------------------------------------------
    def join_topic(self, v: int, topic: object) -> None:
        self.topics[v].add(topic)
        self.members.setdefault(topic, set()).add(v)
        self.mesh.setdefault(topic, {}).setdefault(v, set())

    def leave_topic(self, v: int, topic: object) -> None:
        self.topics[v].discard(topic)
        self.members.get(topic, set()).discard(v)
        mesh = self.mesh.get(topic, {})
        for w in mesh.pop(v, ()):
            mesh.get(w, set()).discard(v)

    def _graft_up(self, v: int, topic: object) -> None:
        mesh = self.mesh[topic]
        mine = mesh[v]
        if len(mine) >= self.d_low and mine:
            return
        cands = [w for w in self.scheme.mesh_candidates(v, topic)
                 if w not in mine and self.online[w] and w not in self.dead_known[v]]
        self.rng.shuffle(cands)
        while len(mine) < self.d and cands:
            w = cands.pop()
            if self.scheme.graft_connects:
                self._connect(v, w)
            mine.add(w)
            mesh.setdefault(w, set()).add(v)

    def _prune_down(self, v: int, topic: object) -> None:
        mine = self.mesh[topic][v]
        if len(mine) <= self.d_high:
            return
        for w in self.rng.sample(sorted(mine), len(mine) - self.d):
            mine.discard(w)
            self.mesh[topic].get(w, set()).discard(v)

    # -- messages --------------------------------------------------------------------------
    def new_message(self, origin: int, topic: object, rnd: int, nbytes: int, batch: bool,
                    intended: set[int] | None) -> int:
        m = len(self.m_origin)
        self.m_origin.append(origin)
        self.m_topic.append(topic)
        self.m_t.append(self.now)
        self.m_round.append(rnd)
        self.m_bytes.append(nbytes)
        self.m_batch.append(batch)
        self.m_intended.append(intended)
        self.claimed[origin].add(m)
        self.seen[origin].add(m)
        self.mcache[origin][-1].add(m)
        return m

    def latency_ms(self, a: int, b: int) -> float:
        if self.wan is None:
            return self.sc.network.loopback_ms
        return self.wan.one_way_ms(a, b)

    def send(self, t: float, v: int, w: int, nbytes: int, kind: int, a: object, b: object) -> None:
        """One copy from ``v`` to ``w``: through v's uplink, then the path's latency."""
        self.bytes_out[v] += nbytes
        if self.wan is None:
            self.push(t + self.sc.network.loopback_ms, kind, w, a, b)
            return
        start = max(t, self.up_free[v])
        t = self.up_free[v] = start + nbytes * self.ms_per_byte
        t += self.wan.one_way_ms(v, w)
        if kind == ARRIVE and a in self.claimed[w] and self.online[w]:
            # w already holds a copy: this one is a duplicate whatever happens meanwhile.
            # Account it now instead of as an event (most of a flood's events).
            self.bytes_in[w] += nbytes
            self.copies_in[w] += 1
            self.dups[w] += 1
            self.cpu.account_later(t, w, self.sc.costs.copy_ms)  # type: ignore[union-attr]
            return
        self.push(t, kind, w, a, b)

    def forward_targets(self, v: int, m: int, forwarder: int) -> set[int]:
        topic = self.m_topic[m]
        mesh = self.mesh.get(topic, {}).get(v)
        if mesh is None:
            return set()
        return mesh - {forwarder, self.m_origin[m]}

    def _arrive(self, t: float, v: int, m: object, u: object) -> None:
        assert isinstance(m, int) and isinstance(u, int)
        if not self.online[v]:
            self.lost_copies += 1
            return
        c = self.sc.costs
        self.bytes_in[v] += self.m_bytes[m]
        self.copies_in[v] += 1
        copy_ms = c.copy_ms if self.m_batch[m] else c.control_ms
        if m in self.claimed[v] or (self.m_topic[m] is not None and self.m_topic[m] not in self.topics[v]):
            self.dups[v] += 1
            self.cpu.submit(t, v, copy_ms)
            return
        self.claimed[v].add(m)
        first_ms = c.first_ms if self.m_batch[m] else c.control_ms
        n_fwd = len(self.forward_targets(v, m, u))
        self.cpu.submit(t, v, copy_ms + first_ms + n_fwd * c.send_ms, ("first", m, u))

    def _job(self, t: float, v: int, action: object, _b: object) -> None:
        self.cpu.finished(t, v)
        if action is None:
            return
        what, m, u = action  # type: ignore[misc]
        if what == "first":
            self._processed(t, v, m, u)
        elif what == "publish":
            self._fan_out(t, v, m)

    def _processed(self, t: float, v: int, m: int, u: int) -> None:
        self.seen[v].add(m)
        self.firsts[v] += 1
        self.mcache[v][-1].add(m)
        if self.m_batch[m]:
            self.deliveries.append((m, v, t - self.m_t[m]))
            if not self.is_boot[v]:
                self.inbox[v].append(m)
        else:
            self.scheme.on_announcement(t, v, m)
        for w in self.forward_targets(v, m, u):
            self.send(t, v, w, self.m_bytes[m], ARRIVE, m, v)

    def _fan_out(self, t: float, v: int, m: int) -> None:
        for w in self.scheme.publish_targets(v, m):
            self.send(t, v, w, self.m_bytes[m], ARRIVE, m, v)

    def _publish(self, t: float, v: int, k: object, _b: object) -> None:
        assert isinstance(k, int)
        if not self.online[v]:
            return
        self._sapo_round(v, k)
        if self.offset[v] + (k + 1) * self.sc.round_s * 1000 < self.end_ms:
            self.push(self.offset[v] + (k + 1) * self.sc.round_s * 1000, PUBLISH, v, k + 1)
        for m, n_targets in self.scheme.publish(t, v, k):
            c = self.sc.costs
            self.cpu.submit(t, v, c.publish_ms + n_targets * c.send_ms, ("publish", m, v))

    def _sapo_round(self, v: int, k: int) -> None:
        pool = self.pools[v]
        for m in self.inbox[v]:
            pool.add(self.m_origin[m], self.m_round[m], k)
        self.inbox[v].clear()
        for s in pool.take(k):
            self.taken[v].append((k, s))

    # -- heartbeat: mesh repair and IHAVE --------------------------------------------------
    def _heartbeat(self, t: float, _v: int, _a: object, _b: object) -> None:
        sc = self.sc.scheme
        c = self.sc.costs
        for v in range(len(self.online)):
            if not self.online[v]:
                continue
            if len(self.conns[v]) < sc.connections and not self.is_boot[v]:
                self._dial_up(v)
            window: set[int] = set().union(*self.mcache[v])
            self.mcache[v].append(set())
            for topic in list(self.topics[v]):
                self._graft_up(v, topic)
                self._prune_down(v, topic)
                ids = {m for m in window if self.m_topic[m] == topic} if len(self.topics[v]) > 1 else window
                if not ids:
                    continue
                members = self.members[topic]
                others = [w for w in self.conns[v] if w in members and w not in self.mesh[topic][v]]
                if not others:
                    continue
                count = max(sc.gossip_lazy, len(others) // 4)
                targets = others if count >= len(others) else self.rng.sample(others, count)
                nbytes = c.control_bytes + c.id_bytes * len(ids)
                frozen = frozenset(ids)
                for w in targets:
                    self.cpu.submit(t, v, c.control_ms)
                    self.send(t, v, w, nbytes, IHAVE, v, frozen)
        if t + sc.heartbeat_s * 1000 <= self.end_ms + self.deadline_ms:
            self.push(t + sc.heartbeat_s * 1000, HEARTBEAT, -1)

    def _ihave(self, t: float, w: int, v: object, ids: object) -> None:
        assert isinstance(v, int) and isinstance(ids, frozenset)
        if not self.online[w]:
            return
        c = self.sc.costs
        self.bytes_in[w] += c.control_bytes + c.id_bytes * len(ids)
        self.cpu.submit(t, w, c.control_ms + c.control_id_ms * len(ids))
        wanted = ids - self.seen[w]
        if not wanted or not self.online[v]:
            return
        # IWANT to v, which serves each copy from its mcache
        nbytes = c.control_bytes + c.id_bytes * len(wanted)
        self.bytes_out[w] += nbytes
        self.bytes_in[v] += nbytes
        t_v = t + self.latency_ms(w, v)
        self.cpu.submit(t_v, v, c.control_ms + len(wanted) * c.send_ms)
        for m in wanted:
            self.send(t_v, v, w, self.m_bytes[m], ARRIVE, m, v)

    # -- churn -----------------------------------------------------------------------------
    def _leave(self, t: float, v: int, _a: object, _b: object) -> None:
        self.online[v] = False
        self.left[v] = t
        self.push(t + self.sc.scheme.detect_s * 1000, DETECT, v)
        self.push(t + self.rng.expovariate(1 / (self.sc.rejoin_s * 1000)), JOIN, -1)

    def _detect(self, t: float, v: int, _a: object, _b: object) -> None:
        for w in list(self.conns[v]):
            self.conns[w].discard(v)
            self.dead_known[w].add(v)
        self.conns[v].clear()
        for topic in list(self.topics[v]):
            self.leave_topic(v, topic)
        self.scheme.on_detect(t, v)

    def _join(self, t: float, _v: int, _a: object, _b: object) -> None:
        v = self._new_node(t)
        self._dial_up(v)
        self.scheme.on_join(t, v)
        for topic in self.topics[v]:
            self._graft_up(v, topic)
        self._schedule_rounds(v, t)
