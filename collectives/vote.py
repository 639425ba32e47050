"""The vote and the version commit: how the members of a group settle one attempt (rules:
consistency.py).

After the exchange each member stores a signed vote (its new hash if it applied the average,
its unchanged hash if not) and reads the votes of the peers its reducer saw contribute
(``Ballot.settle``) until they all voted or the outcome is settled; the hash with most such
votes wins. If the version advanced, each member stores the version commit and its head
(``Ballot.publish``). What a member does with the outcome (adopt, roll back) is the
attempt's (attempt.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from collectives.config import OuterConfig
from collectives.consistency import CommitBook, decide_votes, settled_vote
from collectives.transport import Transport
from protocol import OuterVote

__all__ = ["Ballot", "Outcome"]

VOTE_POLL_S = 0.05
"""Between two reads of the votes while a peer we expect has not voted: the wait after its
vote lands is on every step's critical path (0.1 s: vote phases of 0.17 s seen at 100M
values where the first read came just before the other vote)."""


@dataclass(frozen=True)
class Outcome:
    """What the votes decided: the winning hash, the votes read (signer -> vote) and the
    expected voters the outcome was settled without (a member that died after its
    contribution cannot change it)."""

    decided: str
    votes: dict[str, OuterVote]
    settled_without: tuple[str, ...] = ()


class Ballot:
    """Votes and version commits of one node in the DHT."""

    def __init__(self, *, config: OuterConfig, peer_id: str, book: CommitBook,
                 transport: Transport) -> None:
        self._config, self._me, self._book, self._transport = config, peer_id, book, transport

    def settle(self, v: int, *, nonce: str, mine: str, parent: str, voters: set[str],
               expect: set[str], until: float) -> Outcome:
        """Store our vote for the attempt ``nonce`` from version ``v`` (``mine``: our hash
        now; ``parent``: our hash before), read the votes of ``expect`` until they are in,
        the outcome is settled, or ``until``; the hash with most votes among ``voters`` (and
        us) wins."""
        self._transport.dht_store(
            self._book.vote_key(v, nonce), self._me,
            self._book.vote(v + 1, mine, parent=parent, members=sorted(voters | {self._me})),
            ttl=self._config.schedule.vote_ttl_s, timeout=self._config.schedule.dht_op_timeout_s)
        votes: dict[str, OuterVote] = {}
        without: tuple[str, ...] = ()
        while expect:
            votes = self._book.verify(self._transport.dht_get(
                self._book.vote_key(v, nonce), timeout=max(0.1, until - time.monotonic())),
                OuterVote, step=v + 1)
            if expect <= set(votes) or time.monotonic() + VOTE_POLL_S > until:
                break
            if settled_vote(votes, mine=mine, parent=parent, voters=voters, me=self._me):
                # the votes still missing cannot change the outcome (e.g. a member that
                # died after its contribution: waiting for it until ``until`` would let
                # the next meeting pass)
                without = tuple(sorted(expect - set(votes)))
                break
            time.sleep(VOTE_POLL_S)
        decided = decide_votes(votes, mine=mine, parent=parent, voters=voters, me=self._me)
        return Outcome(decided=decided, votes=votes, settled_without=without)

    def publish(self, version: int, state_hash: str, *, parent: str,
                members: tuple[str, ...], period_code: int) -> None:
        """Store the commit of ``version`` and our head, both at once (one DHT round trip),
        with the period the group agreed on (schedule.py ``agreed_code``): a peer that
        adopts this version without us goes to our meetings."""
        data = self._book.version(version, state_hash, parent=parent, members=members,
                                  period=period_code)
        self._transport.dht_store_many(
            [(self._book.key(version), self._me, data),
             (self._book.head_key, self._me, data)],
            ttl=self._config.schedule.vote_ttl_s * 20,
            timeout=self._config.schedule.dht_op_timeout_s)
