"""Per-sender reputation from how useful its groups proved; who is trusted with a share of its own.

Each sender's record counts, over the groups it sent us:

- ``passed``: re-scored groups that passed the zero-advantage filter (they carry signal);
- ``agreed``: groups whose claimed rewards equal our re-scored ones (an honest verifier);
- ``useful``: groups judged against our own expected reward (``used``: taken for training or
  dropped for not beating it) in which some completion beat it (a positive anchored
  advantage: ``grpo.anchored_advantages``).

``reputation = P(pass) * P(agree) * P(useful)``, each a Beta(1, 1) posterior mean, so a new
identity starts at 0.125: below any sender with a good record, never above; it orders the
pool's sampling. A sender is *trusted* once ``useful >= trust_after`` and both ``P(useful)``
and ``P(agree)`` are at least ``trust_min``; it loses that as soon as its record falls below
(nothing is permanent: a peer that turns to sending groups that never beat our own baseline
is back among the newcomers after a few of them). Untrusted senders share
one newcomer budget in the pool (``sapo.py``), so twenty fresh identities get what one gets,
and each can only earn trust through groups we actually used — out of that shared budget.

The book is bounded (``max_senders``): when full, the least recently seen untrusted sender is
forgotten first, so a flood of fresh identities cannot evict the records of trusted peers.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SenderBook", "SenderRecord", "claims_agree"]


def claims_agree(claimed: Sequence[float], rescored: Sequence[float], tol: float = 1e-6) -> bool:
    """True iff the sender claimed exactly (within ``tol``) the rewards we computed."""
    return len(claimed) == len(rescored) and all(abs(c - r) <= tol for c, r in zip(claimed, rescored))


@dataclass
class SenderRecord:
    """What one sender's groups have shown so far."""

    groups: int = 0
    passed: int = 0
    agreed: int = 0
    used: int = 0
    useful: int = 0
    newest_round: int | None = None
    """Newest round number the sender has put on a batch (its clock, for freshness)."""
    last_seen: int = 0
    """Our round when we last heard from it (for eviction)."""

    def p_pass(self) -> float:
        return (self.passed + 1) / (self.groups + 2)

    def p_agree(self) -> float:
        return (self.agreed + 1) / (self.groups + 2)

    def p_useful(self) -> float:
        return (self.useful + 1) / (self.used + 2)

    def reputation(self) -> float:
        return self.p_pass() * self.p_agree() * self.p_useful()


class SenderBook:
    """Records of every sender we hold groups from, bounded in size."""

    def __init__(self, *, trust_after: int, trust_min: float, max_senders: int) -> None:
        self.trust_after = trust_after
        self.trust_min = trust_min
        self.max_senders = max_senders
        self._records: dict[str, SenderRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def get(self, sender: str) -> SenderRecord | None:
        return self._records.get(sender)

    def _record(self, sender: str, now: int) -> SenderRecord:
        rec = self._records.get(sender)
        if rec is None:
            if len(self._records) >= self.max_senders:
                self._forget_one()
            rec = self._records[sender] = SenderRecord(last_seen=now)
        rec.last_seen = now
        return rec

    def _forget_one(self) -> None:
        untrusted = [s for s in self._records if not self.trusted(s)]
        victims = untrusted or list(self._records)
        del self._records[min(victims, key=lambda s: self._records[s].last_seen)]

    def observe_ingest(self, sender: str, *, sender_round: int, passed: bool, agreed: bool,
                       now: int) -> None:
        """One re-scored group arrived from ``sender`` (duplicates are not observed)."""
        rec = self._record(sender, now)
        rec.groups += 1
        rec.passed += passed
        rec.agreed += agreed
        if rec.newest_round is None or sender_round > rec.newest_round:
            rec.newest_round = sender_round

    def observe_use(self, sender: str, *, useful: bool, now: int) -> None:
        """One of ``sender``'s groups was judged against our baseline; ``useful``: some
        completion beat it (the group was trained on) or not (it was dropped)."""
        rec = self._record(sender, now)
        rec.used += 1
        rec.useful += useful

    def reputation(self, sender: str) -> float:
        rec = self._records.get(sender)
        return rec.reputation() if rec is not None else SenderRecord().reputation()

    def trusted(self, sender: str) -> bool:
        rec = self._records.get(sender)
        return (rec is not None and rec.useful >= self.trust_after
                and rec.p_useful() >= self.trust_min and rec.p_agree() >= self.trust_min)

    def delivered(self, limit: int) -> dict[str, int]:
        """Sender -> groups it sent that passed our re-scoring with signal (``passed``), for
        the ``limit`` senders that delivered most (the swarm process keeps the feeds of
        sources that deliver: swarm.feeds ``rate``)."""
        top = heapq.nlargest(limit, ((r.passed, s) for s, r in self._records.items()
                                     if r.passed > 0))
        return {s: n for n, s in top}

    def valid(self, limit: int) -> dict[str, int]:
        """Sender -> groups it sent that passed our re-scoring with the rewards it claimed
        (``agreed``), signal or not, for the ``limit`` senders with most (an honest source
        delivers these every round before its groups carry signal: swarm.feed_standing)."""
        top = heapq.nlargest(limit, ((r.agreed, s) for s, r in self._records.items()
                                     if r.agreed > 0))
        return {s: n for n, s in top}

    def newest_round(self, sender: str) -> int | None:
        rec = self._records.get(sender)
        return rec.newest_round if rec is not None else None
