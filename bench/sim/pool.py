"""SAPO's external pool, reduced to what decides *whose* groups a node trains on.

A compact model of ``node/learner/sapo.py``'s ``ExternalPool`` (same order of filters, same
caps, same sampling key) without the content: a group is (sender, its round, our arrival round,
arrival number, useful?). Re-scoring is a coin: a group passes the zero-advantage filter with
``p_pass`` and beats our own baseline with ``p_useful``. Reputation is the SenderRecord
posterior product (agree = 1: honest senders); a sender is trusted after ``trust_after`` useful
groups used. Untrusted senders share one bucket and one ``newcomer_round`` budget.
"""

from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass, field

from bench.sim.config import Sapo

__all__ = ["SimPool"]


@dataclass
class _Record:
    groups: int = 0
    passed: int = 0
    used: int = 0
    useful: int = 0
    newest: int = -1

    def reputation(self) -> float:
        p_pass = (self.passed + 1) / (self.groups + 2)
        p_agree = (self.groups + 1) / (self.groups + 2)
        return p_pass * p_agree * (self.useful + 1) / (self.used + 2)


@dataclass
class _Group:
    sender: int
    sender_round: int
    arrival: int
    seq: int
    useful: bool


@dataclass
class SimPool:
    """One node's pool; ``add`` per received batch, ``take`` once per round."""

    cfg: Sapo
    rng: random.Random
    book: dict[int, _Record] = field(default_factory=dict)
    entries: dict[int, _Group] = field(default_factory=dict)
    seq: int = 0
    buckets: dict[int, collections.deque[int]] | None = None
    """Live arrival numbers per bucket, oldest first (rebuilt after ``take`` moves trust)."""

    def trusted(self, sender: int) -> bool:
        rec = self.book.get(sender)
        return rec is not None and rec.useful >= self.cfg.trust_after

    def _bucket(self, sender: int) -> int:
        return sender if self.trusted(sender) else -1

    def _age(self, g: _Group, now: int) -> int:
        return max(0, now - g.arrival, self.book[g.sender].newest - g.sender_round)

    def add(self, sender: int, sender_round: int, now: int) -> None:
        """One batch of ``groups_per_batch`` groups from ``sender`` arrived in our round ``now``."""
        cfg = self.cfg
        rec = self.book.setdefault(sender, _Record())
        rec.newest = max(rec.newest, sender_round)
        cap = max(1, math.floor(cfg.sender_pool_share * cfg.pool_capacity))
        if self.buckets is None:
            self.buckets = collections.defaultdict(collections.deque)
            for e in self.entries.values():
                self.buckets[self._bucket(e.sender)].append(e.seq)
        mine = self.buckets[self._bucket(sender)]
        for _ in range(cfg.groups_per_batch):
            rec.groups += 1
            if self.rng.random() >= cfg.p_pass:
                continue
            rec.passed += 1
            g = _Group(sender, sender_round, now, self.seq, self.rng.random() < cfg.p_useful)
            self.seq += 1
            if self._age(g, now) > cfg.max_age_rounds:
                continue
            if len(mine) >= cap:
                del self.entries[mine.popleft()]
            if len(self.entries) >= cfg.pool_capacity:
                oldest = self.entries.pop(next(iter(self.entries)))  # the oldest of its bucket too
                self.buckets[self._bucket(oldest.sender)].popleft()
            self.entries[g.seq] = g
            mine.append(g.seq)

    def take(self, now: int) -> list[int]:
        """Senders of the groups trained on in round ``now`` (``external`` at most)."""
        cfg = self.cfg
        fresh = {}
        for s, g in self.entries.items():
            if self._age(g, now) > cfg.max_age_rounds:
                continue
            if not g.useful:  # judged against our baseline and dropped
                self.book[g.sender].used += 1
                continue
            fresh[s] = g
        self.entries = fresh
        self.buckets = None
        rep = {s: self.book[s].reputation() for s in {g.sender for g in fresh.values()}}
        trusted = {s: self.trusted(s) for s in rep}
        order = sorted(fresh.values(), key=lambda g: (self._age(g, now), -rep[g.sender], -g.seq))
        per_sender: collections.Counter[int] = collections.Counter()
        newcomers = 0
        picked: list[int] = []
        for g in order:
            if len(picked) >= cfg.external:
                break
            if per_sender[g.sender] >= cfg.per_sender_round or (
                    not trusted[g.sender] and newcomers >= cfg.newcomer_round):
                continue
            picked.append(g.sender)
            per_sender[g.sender] += 1
            newcomers += not trusted[g.sender]
            del self.entries[g.seq]
            rec = self.book[g.sender]
            rec.used += 1
            rec.useful += 1
        return picked
