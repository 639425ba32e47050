"""Vote and commit: how the members of a group settle one attempt (rules: consistency.py).

A mixin of ``OuterLoop`` (loop.py): after the exchange each member stores a signed vote,
gathers the votes of the peers its reducer saw contribute, follows their decision (adopt,
or roll back), and stores the version commit if the version advanced.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from collectives.consistency import Candidate, Lineage, decide_votes, settled_vote
from collectives.errors import SyncError
from collectives.parts import LoopParts
from collectives.state import OuterState
from protocol import OuterVote

__all__ = ["Committer"]

logger = logging.getLogger(__name__)

VOTE_POLL_S = 0.05
"""Between two reads of the votes while a peer we expect has not voted: the wait after its
vote lands is on every step's critical path (0.1 s: vote phases of 0.17 s seen at 100M
values where the first read came just before the other vote)."""


class Committer(LoopParts):
    """The end of an attempt (the attributes are ``OuterLoop``'s)."""

    _fetch_adopt: Callable[..., None]

    def _may_advance(self, contributors: set[str]) -> bool:
        """Whether a group with these contributors may make the next version: it must hold a
        strict majority of the current version's witnesses, so that two groups that met in
        different windows cannot both advance (a fork); the minority keeps its delta and
        later adopts the majority's version by rule 2. After ``minority_patience``
        consecutive refusals (the majority stayed away) the group advances anyway."""
        with self._lock:
            witnesses = self._lineage.witnesses
        present = contributors | {self.peer_id}
        if not witnesses or 2 * len(present & witnesses) > len(witnesses):
            self._minority_streak = 0
            return True
        self._minority_streak += 1
        if self._minority_streak > self.config.minority_patience:
            logger.warning("advancing without a majority of the last version's witnesses "
                           "after %d attempts", self._minority_streak - 1)
            self._minority_streak = 0
            return True
        return False

    def _reconcile(self, rec: dict[str, Any], v: int, parent: str, pre: OuterState | None,
                   snapshot: torch.Tensor, voters: set[str], expect: set[str],
                   members: list[str], *, nonce: str, until: float, end: float) -> None:
        """Vote, gather the votes of the peers we saw contribute, follow their decision.

        ``pre``: the state before we applied this step (None if we did not); ``snapshot``:
        the params whose delta we contributed; ``nonce``: the group's, naming this attempt."""
        with self._lock:
            mine = self._state.hash()
        self._transport.dht_store(
            self._book.vote_key(v, nonce), self.peer_id,
            self._book.vote(v + 1, mine, parent=parent, members=sorted(voters | {self.peer_id})),
            ttl=3 * self.config.deadline_s + 60, timeout=min(5.0, self.config.deadline_s / 4))
        votes: dict = {}
        while expect:
            votes = self._book.verify(self._transport.dht_get(
                self._book.vote_key(v, nonce), timeout=max(0.1, until - time.monotonic())),
                OuterVote, step=v + 1)
            if expect <= set(votes) or time.monotonic() + VOTE_POLL_S > until:
                break
            if settled_vote(votes, mine=mine, parent=parent, voters=voters, me=self.peer_id):
                # the votes still missing cannot change the outcome (e.g. a member that
                # died after its contribution: waiting for it until ``until`` would let
                # the next meeting pass)
                rec["settled_without"] = sorted(expect - set(votes))
                break
            time.sleep(VOTE_POLL_S)
        rec["votes"] = len(votes)
        self._mark(rec, "vote")
        decided = decide_votes(votes, mine=mine, parent=parent, voters=voters, me=self.peer_id)
        if decided == parent and pre is not None:  # we applied, the group did not: undo
            self._roll_back(rec, pre, snapshot, "most contributors did not apply this step")
            return
        witnesses = voters | {self.peer_id}
        with self._lock:
            held = self._lineage
            parent_theta = pre.theta if pre is not None else self._state.theta
        lineage = Lineage(hash=decided, version=v + 1, witnesses=frozenset(witnesses),
                          parent=parent, parent_witnesses=held.witnesses)
        if decided != mine:  # we failed or diverged; the contributors' state wins
            holders = tuple(sorted(p for p, c in votes.items() if c.state_hash == decided))
            try:  # we took part: our delta is in their average, as if we had applied it
                self._fetch_adopt(rec, Candidate(hash=decided, version=v + 1,
                                                 members=tuple(sorted(witnesses)),
                                                 holders=holders),
                                  end=end, lineage=lineage, base=snapshot)
            except SyncError:
                if pre is not None:  # keep our lineage: the next catch-up can follow theirs
                    self._roll_back(rec, pre, snapshot, "the group's state was not served")
                raise
        if decided != parent:
            work = self._work
            work.counted = True  # our delta is in the average
            with self._lock:
                self._lineage, self._parent_theta = lineage, parent_theta
            # stored before the attempt returns: a peer that missed this step must find it
            # in its next catch-up, which may start right after ours ends
            self._publish(v + 1, decided, parent, tuple(sorted(witnesses)))
            self._mark(rec, "commit")

    def _roll_back(self, rec: dict[str, Any], pre: OuterState, snapshot: torch.Tensor,
                   why: str) -> None:
        """Undo an applied step: the state before it, our params as if it never happened."""
        with self._lock:
            applied = self._state.theta
            self._state = pre
            self._rebase(onto=snapshot, base=applied)
        rec["status"] = "failed"
        rec["error"] = f"rolled back: {why}"
        logger.info("outer step at version %d rolled back: %s", pre.version, why)

    def _publish(self, version: int, h: str, parent: str, members: tuple[str, ...]) -> None:
        # ``peers``: the period the group agreed on (schedule.py): a peer that adopts this
        # version without us goes to our meetings
        data = self._book.version(version, h, parent=parent, members=members,
                                  period=self.clock.agreed_code())
        ttl = (3 * self.config.deadline_s + 60) * 20
        self._transport.dht_store_many(  # both at once: one DHT round trip
            [(self._book.key(version), self.peer_id, data),
             (self._book.head_key, self.peer_id, data)],
            ttl=ttl, timeout=min(5.0, self.config.deadline_s / 4))
