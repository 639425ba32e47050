"""Prometheus metrics (opt-in port): the same counters the status view shows."""

from __future__ import annotations


from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from node.status import held_off
from protocol.records import RoundRecord, StepRecord


class Metrics:
    def __init__(self, port: int, *, addr: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.round = Gauge("swarm_node_round", "Last completed round", registry=r)
        self.reward = Gauge("swarm_node_mean_reward", "Mean reward of local rollouts, last round",
                            registry=r)
        self.heldout = Gauge("swarm_node_heldout_accuracy",
                             "Accuracy on the held-out set, newest score", ["decoding"], registry=r)
        self.peers = Gauge("swarm_node_peers", "Peers known to the swarm process", registry=r)
        self.rollouts = Counter("swarm_node_rollouts", "Rollout groups", ["direction"], registry=r)
        self.rejected = Counter("swarm_node_rejected", "Rollouts rejected on re-scoring",
                                ["reason"], registry=r)
        self.gossip_rejected = Gauge("swarm_node_gossip_rejected",
                                     "Messages the swarm process rejected at the boundary, total",
                                     ["reason"], registry=r)
        self.feed_sources = Gauge("swarm_node_feed_sources",
                                  "Open feeds by their source's kind (proven, live, trial) and "
                                  "those holding their slot for nothing now (idle)", ["kind"],
                                  registry=r)
        self.feeds_dropped = Gauge("swarm_node_feeds_dropped",
                                   "Feeds closed for delivering nothing (idle, no_signal) or "
                                   "for a source's network holding its slots already "
                                   "(network_full), total", ["reason"],
                                   registry=r)
        self.feed_idle_slot_rounds = Gauge("swarm_node_feed_idle_slot_rounds",
                                           "Slot-rounds held by idle feed sources, total",
                                           registry=r)
        self.feed_searched = Gauge("swarm_node_feed_searched",
                                   "Feed sources tried while our own groups carried signal and "
                                   "no held feed brought any, total", registry=r)
        self.busy = Gauge("swarm_node_busy", "Fraction of the last round the generator and the "
                          "trainer were busy (engine.staleness overlaps them)", ["part"], registry=r)
        self.dropped_stale = Counter("swarm_node_dropped_stale_groups",
                                     "Own groups dropped for being older than engine.staleness",
                                     registry=r)
        self.outer = Counter("swarm_node_outer_steps", "Outer steps", ["status"], registry=r)
        self.outer_held_off = Gauge("swarm_node_outer_held_off",
                                    "Peers held off our outer steps' groups, by reason, total",
                                    ["reason"], registry=r)
        self.restarts = Counter("swarm_node_child_restarts", "Child restarts", ["child"],
                                registry=r)
        self.server, self._thread = start_http_server(port, addr=addr, registry=r)

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def on_round(self, rec: RoundRecord) -> None:
        self.round.set(rec.round)
        self.reward.set(rec.mean_reward)
        if rec.peers is not None:
            self.peers.set(rec.peers)
        if rec.heldout is not None:
            for decoding in ("greedy", "sampled"):
                value = rec.heldout.get(f"{decoding}_accuracy")
                if isinstance(value, (int, float)):
                    self.heldout.labels(decoding).set(value)
        self.rollouts.labels("published").inc(max(0, rec.rollouts_published))
        self.rollouts.labels("received").inc(max(0, rec.rollouts_received))
        self.rollouts.labels("used").inc(max(0, rec.external_used))
        for reason, n in rec.rejected_by_reason.items():
            self.rejected.labels(reason).inc(max(0, n))
        for reason, total in rec.gossip_rejected.items():
            self.gossip_rejected.labels(reason).set(total)
        for part in ("generator", "trainer"):
            value = rec.observed.get(f"{part}_busy")
            if isinstance(value, (int, float)):
                self.busy.labels(part).set(value)
        dropped = rec.observed.get("dropped_stale")
        if isinstance(dropped, int) and dropped > 0:
            self.dropped_stale.inc(dropped)
        feeds = rec.observed.get("feeds")
        if isinstance(feeds, dict):  # feeds mode (swarm.feed_standing)
            for kind in ("proven", "live", "trial", "idle"):
                self.feed_sources.labels(kind).set(int(feeds.get(kind) or 0))
            for reason in ("idle", "no_signal"):
                self.feeds_dropped.labels(reason).set(int(feeds.get(f"dropped_{reason}") or 0))
            self.feeds_dropped.labels("network_full").set(int(feeds.get("network_full") or 0))
            self.feed_idle_slot_rounds.set(int(feeds.get("idle_slot_rounds") or 0))
            self.feed_searched.set(int(feeds.get("searched") or 0))

    def on_outer(self, rec: StepRecord) -> None:
        self.outer.labels(rec.status.value).inc()
        for reason, total in held_off(rec.observed.get("blames_total")).items():
            self.outer_held_off.labels(reason).set(total)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
