"""SAPO's training-set construction: a fresh, per-sender-bounded pool of re-scored external groups.

Received rollouts are never trusted: ``rescore.py`` rebuilds each one from its ``TaskSpec`` and
re-scores every completion with the local verifier. What survives comes here. The paper's
nodes discard zero-advantage groups and sample J of the rest uniformly; ours face strangers,
so ``ExternalPool`` adds, in this order:

1. **Dedupe.** A group whose content (prompt + the multiset of completions) was seen recently,
   from anyone, is dropped; so is a second live group on the same prompt from one sender
   (``external_duplicate``). This stops replays and copies, not steering (a sender can vary a
   companion); steering is the next points' job.
2. **Reputation** (``reputation.py``): every re-scored group updates its sender's record (passed
   the filter? claimed rewards equal ours?), and so does every group judged against our own
   expected reward (did any completion beat it?). New identities start below any sender with
   a good record.
3. **Zero-advantage filter** (the paper), then **freshness**: a group's age is
   ``max(our rounds since it arrived, its sender's newest round - the group's round)``; above
   ``max_age_rounds`` it is dropped (``external_stale``), never used. A sender inflating its
   round numbers only ages its own groups. Then the **own-baseline filter**: a group none of
   whose completions beats our own expected reward for its family carries no anchored
   advantage (``grpo.anchored_advantages``), so it is dropped before sampling
   (``external_not_useful``) instead of taking a slot, and counts against its sender.
4. **Shares.** A *trusted* sender may hold at most ``sender_pool_share`` of the pool and give at
   most ``per_sender_round`` groups to one round. All untrusted senders together form **one**
   bucket with the same pool share and ``newcomer_round`` groups per round. That is the Sybil
   answer: a count-based cap per identity hands N identities N shares, so we do not give
   untrusted identities shares of their own. Twenty fresh keys get exactly the newcomer budget
   one key gets, and each earns trust (``trust_after`` useful groups) only through groups we
   chose to use from that shared budget, i.e. by being useful, one at a time.
   What this does not claim: identities cost nothing, so a farm that keeps sending groups
   that beat our own baseline does, over time, promote several identities, each with its own
   share; it promotes them no faster than the shared budget allows, each keeps its share only
   while at least ``trust_min`` of its judged groups are useful, and whatever slots it holds
   cannot pull the policy toward completions worse than our own (the anchor, point 5). Sybils
   can buy slots with useful work; they cannot buy steering.
5. **Sampling**: fresh groups in order of (age, then sender reputation, then newest arrival),
   greedily under the per-round caps. ``take`` attaches the receiver's own baseline for the
   family (``grpo.Anchor``), so what the sender chose as companions cannot make a poor
   completion look good, and every group weighs the same in the loss (``grpo.py``).

``plan_round`` is the I/J split; with ``SapoConfig.adaptive_external`` it picks J from
measured ``RoundSignals`` (``SignalTracker``), see ``adaptive_target``.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from node.learner.baseline import OwnBaseline
from node.learner.config import SapoConfig
from node.learner.grpo import Anchor, TrainingGroup
from node.learner.rescore import ScoredGroup
from node.learner.reputation import SenderBook, claims_agree

__all__ = ["ExternalPool", "RoundSignals", "SignalTracker", "Taken", "adaptive_target", "plan_round"]

log = logging.getLogger(__name__)

_TREND_SCALE = 0.05
"""A fall of the own reward's fast EMA below its slow EMA by this much halves the adaptive J."""


@dataclass(frozen=True, kw_only=True)
class RoundSignals:
    """What a node measured about its recent rounds (inputs of the adaptive J)."""

    local_flat: float = 0.5
    """Fraction of recent local groups with no reward variance (no GRPO signal of their own)."""
    external_signal: float = 0.5
    """Advantage signal of the external groups used vs our local ones: mean positive advantage
    mass per external group / (that + the same per local group); 0.5 = equally informative.
    Measured on groups actually trained on, so a flood of useless groups (dropped before
    sampling) cannot move it."""
    reward_trend: float = 0.0
    """Fast minus slow moving average of the node's own mean reward (< 0: falling)."""


def adaptive_target(config: SapoConfig, signals: RoundSignals) -> int:
    """J wanted this round, in ``[min_external, external]``.

    ``score = min(1, 2 * signal) * (0.5 + 0.5 * flat) - 0.5 * falling``: external groups are
    worth their slots as far as they carry as much advantage signal (against our own baseline)
    as our local groups do; they matter most when our own groups are flat (nothing to learn
    from locally); a falling own reward (the paper's oscillation with too much external data)
    pulls J down.
    """
    falling = min(1.0, max(0.0, -signals.reward_trend) / _TREND_SCALE)
    worth = min(1.0, 2.0 * signals.external_signal)
    score = worth * (0.5 + 0.5 * signals.local_flat) - 0.5 * falling
    score = min(1.0, max(0.0, score))
    return config.min_external + round((config.external - config.min_external) * score)


def plan_round(config: SapoConfig, available_external: int,
               signals: RoundSignals | None = None) -> tuple[int, int]:
    """(I local questions to generate, J external groups to take) for this round.

    J is the wanted number (``external``, or ``adaptive_target`` when ``adaptive_external``
    and signals are given) capped by what is available; I fills the rest of the equal budget.
    """
    want = config.external
    if config.adaptive_external and signals is not None:
        want = adaptive_target(config, signals)
    j = min(want, max(0, available_external))
    return config.questions_per_round - j, j


class SignalTracker:
    """Moving averages of the signals ``adaptive_target`` reads (one ``observe`` per round).

    A round that used no external group does not measure their signal; the average then
    drifts back toward the neutral 0.5 (``relax``), so a J that fell to 0 is tried again.
    """

    def __init__(self, *, alpha: float = 0.3, relax: float = 0.1, fast: float = 0.5,
                 slow: float = 0.1) -> None:
        self.alpha, self.relax, self.fast, self.slow = alpha, relax, fast, slow
        self._flat = 0.5
        self._signal = 0.5
        self._fast_reward: float | None = None
        self._slow_reward: float | None = None

    def observe(self, *, local_flat: float | None, external_signal: float | None,
                mean_reward: float | None) -> None:
        """Fold one round in; ``None`` for a signal the round did not measure."""
        if local_flat is not None:
            self._flat += self.alpha * (local_flat - self._flat)
        if external_signal is not None:
            self._signal += self.alpha * (external_signal - self._signal)
        else:
            self._signal += self.relax * (0.5 - self._signal)
        if mean_reward is not None:
            if self._fast_reward is None or self._slow_reward is None:
                self._fast_reward = self._slow_reward = mean_reward
            else:
                self._fast_reward += self.fast * (mean_reward - self._fast_reward)
                self._slow_reward += self.slow * (mean_reward - self._slow_reward)

    def signals(self) -> RoundSignals:
        trend = (0.0 if self._fast_reward is None or self._slow_reward is None
                 else self._fast_reward - self._slow_reward)
        return RoundSignals(local_flat=self._flat, external_signal=self._signal, reward_trend=trend)


@dataclass
class _Entry:
    sender: str
    sender_round: int
    arrival_round: int
    seq: int
    family: str
    group: TrainingGroup


@dataclass(frozen=True, kw_only=True)
class Taken:
    """An external group chosen for this round's training set."""

    group: TrainingGroup
    """With the receiver's ``Anchor`` attached (None if we have no own rewards for the family)."""
    sender: str
    age: int
    """Rounds (see the module docstring)."""


def _content_key(group: TrainingGroup) -> bytes:
    text = json.dumps([group.prompt, sorted(group.completions)], ensure_ascii=True)
    return hashlib.sha256(text.encode()).digest()


def _useful(rewards: Sequence[float], anchor: Anchor | None) -> bool:
    bar = sum(rewards) / len(rewards)
    if anchor is not None:
        bar = max(bar, anchor.mean)
    return max(rewards) > bar + 1e-9


class ExternalPool:
    """Valid external groups waiting to be sampled (see the module docstring for the policy)."""

    def __init__(self, config: SapoConfig) -> None:
        self.config = config
        self.book = SenderBook(trust_after=config.trust_after, trust_min=config.trust_min,
                               max_senders=config.max_senders)
        self.counters: collections.Counter[str] = collections.Counter()
        """Cumulative: zero_advantage, duplicate, stale, not_useful, sender_capped, evicted_full,
        round_capped."""
        self._entries: dict[int, _Entry] = {}
        """Live groups by arrival number (dict order = arrival order: the first is the oldest)."""
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._seq = 0
        self._bucket_cap = max(1, math.floor(config.sender_pool_share * config.pool_capacity))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def zero_advantage_discarded(self) -> int:
        return self.counters["zero_advantage"]

    def age(self, entry: _Entry, now: int) -> int:
        newest = self.book.newest_round(entry.sender)
        by_sender = 0 if newest is None else newest - entry.sender_round
        return max(0, now - entry.arrival_round, by_sender)

    def add(self, scored: list[ScoredGroup], *, now: int) -> int:
        """Dedupe, judge, filter and store the re-scored groups received in our round ``now``;
        returns how many were kept."""
        live = {(e.sender, e.group.prompt) for e in self._entries.values()}
        trust: dict[str, bool] = {}  # trust per sender as of this call
        buckets: dict[str | None, collections.deque[int]] = collections.defaultdict(collections.deque)
        for e in self._entries.values():
            buckets[self._bucket(e.sender, trust)].append(e.seq)
        kept = 0
        for item in scored:
            key = _content_key(item.group)
            if key in self._seen or (item.sender, item.group.prompt) in live:
                self.counters["duplicate"] += 1
                self._remember(key)
                continue
            self._remember(key)
            passed = len(set(item.group.rewards)) > 1
            self.book.observe_ingest(item.sender, sender_round=item.round, passed=passed,
                                     agreed=claims_agree(item.claimed, item.group.rewards), now=now)
            if self.config.filter_zero_advantage and not passed:
                self.counters["zero_advantage"] += 1
                continue
            entry = _Entry(sender=item.sender, sender_round=item.round, arrival_round=now,
                           seq=self._seq, family=item.family, group=item.group)
            self._seq += 1
            if self.age(entry, now) > self.config.max_age_rounds:
                self.counters["stale"] += 1
                continue
            self._make_room(entry.sender, trust, buckets)
            self._entries[entry.seq] = entry
            buckets[self._bucket(entry.sender, trust)].append(entry.seq)
            live.add((entry.sender, entry.group.prompt))
            kept += 1
        self._purge(now)  # a sender's newest round may have moved on
        return kept

    def available(self, now: int, *, baseline: OwnBaseline | None = None) -> int:
        """How many groups ``take`` would give this round if asked for all it can."""
        return len(self._select(now, self.config.pool_capacity, baseline)[0])

    def take(self, n: int, *, now: int, baseline: OwnBaseline | None = None) -> list[Taken]:
        """Remove and return up to ``n`` fresh, useful groups, freshest first, under the
        per-round caps, each with our anchor for its family attached."""
        if n <= 0:
            return []
        picked, passed_over = self._select(now, n, baseline)
        self.counters["round_capped"] += passed_over
        out = []
        for e in picked:
            del self._entries[e.seq]
            anchor = baseline.anchor(e.family) if baseline is not None else None
            self.book.observe_use(e.sender, useful=True, now=now)
            out.append(Taken(group=dataclasses.replace(e.group, anchor=anchor, source="external"),
                             sender=e.sender, age=self.age(e, now)))
        return out

    def _select(self, now: int, limit: int,
                baseline: OwnBaseline | None) -> tuple[list[_Entry], int]:
        """The groups to use, in order, and how many fresh ones a round cap passed over."""
        self._purge(now, baseline)
        rep = {s: self.book.reputation(s) for s in {e.sender for e in self._entries.values()}}
        trusted = {s: self.book.trusted(s) for s in rep}
        order = sorted(self._entries.values(), key=lambda e: (self.age(e, now), -rep[e.sender], -e.seq))
        per_sender: collections.Counter[str] = collections.Counter()
        newcomers = 0
        picked: list[_Entry] = []
        passed_over = 0
        for e in order:
            if len(picked) >= limit:
                break
            if per_sender[e.sender] >= self.config.per_sender_round or (
                    not trusted[e.sender] and newcomers >= self.config.newcomer_round):
                passed_over += 1
                continue
            picked.append(e)
            per_sender[e.sender] += 1
            newcomers += not trusted[e.sender]
        return picked, passed_over

    def _purge(self, now: int, baseline: OwnBaseline | None = None) -> None:
        """Drop stale groups, and (given our baseline) those none of whose completions beats it."""
        fresh = [e for e in self._entries.values() if self.age(e, now) <= self.config.max_age_rounds]
        self.counters["stale"] += len(self._entries) - len(fresh)
        if baseline is not None:
            kept = []
            for e in fresh:
                if _useful(e.group.rewards, baseline.anchor(e.family)):
                    kept.append(e)
                else:
                    self.counters["not_useful"] += 1
                    self.book.observe_use(e.sender, useful=False, now=now)
            fresh = kept
        self._entries = {e.seq: e for e in fresh}

    def _bucket(self, sender: str, trust: dict[str, bool]) -> str | None:
        """Trusted senders have a bucket each; all untrusted ones share ``None``."""
        if sender not in trust:
            trust[sender] = self.book.trusted(sender)
        return sender if trust[sender] else None

    def _make_room(self, sender: str, trust: dict[str, bool],
                   buckets: dict[str | None, collections.deque[int]]) -> None:
        """Evict to keep ``sender``'s bucket under its pool share and the pool under its
        capacity, oldest first; O(1) per group (``buckets``: live arrival numbers per bucket,
        oldest first, kept in step with ``_entries``)."""
        mine = buckets[self._bucket(sender, trust)]
        if len(mine) >= self._bucket_cap:
            del self._entries[mine.popleft()]
            self.counters["sender_capped"] += 1
        if len(self._entries) >= self.config.pool_capacity:
            oldest = next(iter(self._entries))  # also the oldest of its own bucket
            buckets[self._bucket(self._entries.pop(oldest).sender, trust)].popleft()
            self.counters["evicted_full"] += 1

    def _remember(self, key: bytes) -> None:
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self.config.dedupe_window:
            self._seen.popitem(last=False)
