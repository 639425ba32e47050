"""The rendezvous: joining a meeting and reading who joined (``Rendezvous``; the attempt
that uses it is attempt.py).

Each peer stores a signed join record (its state hash, its period proposal) under the
meeting's key; the peers that claim the same hash form the group (leader.py: who leads).

A peer that has not agreed a period with anyone yet (a newcomer, or every peer at a swarm's
start, before any version exists to carry one) meets on its own proposal, which a peer whose
rounds differ does not share: ``find_meeting`` reads the meetings of every period that are
open now and goes where peers at our state already joined.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from collectives.config import OuterConfig
from collectives.consistency import CommitBook, Lineage, join_code
from collectives.schedule import Clock
from collectives.transport import Transport
from collectives.work import Work
from protocol import OuterJoin

__all__ = ["Rendezvous", "Roster"]

logger = logging.getLogger(__name__)

READ_POLL_S = 0.05
"""Between two reads of a meeting's join records while a peer we expect has not joined:
the wait after its record lands is on every step's critical path (0.1 s cost 0.05 s a step
on average; a read is one local DHT get)."""


@dataclass(frozen=True)
class Roster:
    """Who joined a meeting at our state: peer -> clock code (schedule.py; us included),
    whether the read ended early (every peer we expected came), and by how many seconds our
    record came after the others' read ended (None: in time, or no meeting)."""

    holders: dict[str, int]
    early: bool
    late: float | None


class Rendezvous:
    """Join records of one node in the DHT: stored, read, and the open meetings searched."""

    def __init__(self, *, config: OuterConfig, peer_id: str, book: CommitBook,
                 transport: Transport, clock: Clock, now: Callable[[], float]) -> None:
        self.config, self.peer_id, self._book = config, peer_id, book
        self._transport, self.clock, self._now = transport, clock, now

    def find_meeting(self, v: int, my_hash: str, *, but: float | None = None,
                      among: frozenset[str] | None = None,
                      ignore: frozenset[str] = frozenset(),
                      ) -> tuple[float, list[int]] | None:
        """The open meeting (schedule.py ``open_meetings``; not ``but``) where the most
        other peers claiming ``my_hash`` at version ``v`` joined, and their clock codes;
        None if there is none (with ``among``: none where one of those peers joined;
        ``ignore``'s records count for nothing: leader.py). At
        most one DHT read per rung of the ladder (a newcomer's first attempts, a finished
        peer missing someone)."""
        best: tuple[float, list[int]] | None = None
        now = self._now()
        for meet in self.clock.open_meetings(now):
            if meet == but:
                continue
            signed = self._book.verify(self._transport.dht_get(
                self._book.join_key(v, meet=meet),
                timeout=min(2.0, self.config.transport.dht_timeout_s)), OuterJoin, step=v)
            there = {p: join_code(c) for p, c in signed.items()
                     if p != self.peer_id and p not in ignore and c.state_hash == my_hash}
            codes = list(there.values())
            if among is not None and not among & set(there):
                continue
            # still read by them: the window of the longest period in force among them
            if codes and now - meet <= self.clock.window(self.clock.longest(codes, ours=False)) \
                    and (best is None or len(codes) > len(best[1])):
                best = (meet, codes)
        return best

    def made_at(self, lineage: Lineage, meet: float) -> bool:
        """Whether the version we hold (just adopted) was made at this meeting: some of its
        witnesses joined it at the version before. They have left it since (a meeting that
        opened while a step ran is let pass), and a group without a majority of them cannot
        advance that version (``Holding.may_advance``): the meeting is over for us too
        (seen: a late node adopted the first version at the tail of the meeting that made
        it, then stepped there alone)."""
        if lineage.version == 0 or not lineage.witnesses:
            return False
        signed = self._book.verify(self._transport.dht_get(
            self._book.join_key(lineage.version - 1, meet=meet),
            timeout=min(2.0, self.config.transport.dht_timeout_s)), OuterJoin,
            step=lineage.version - 1)
        return bool(set(signed) & (lineage.witnesses - {self.peer_id}))

    def join(self, work: Work, v: int, my_hash: str, expected: frozenset[str],
             discovered: frozenset[str], *, ignore: frozenset[str] = frozenset()) -> Roster:
        """Store our join record for ``work``'s meeting and read who joined. The clock codes
        of ``ignore`` (peers we blamed or saw not come: leader.py) do not lengthen the read,
        and any other's by at most ``RUNGS_UP`` times our period (``Clock.near``): a code
        is the peer's own claim (a staller claiming the longest period stretched every read
        to the longest window)."""
        cfg = self.config
        if work.meet is None:
            window = min(cfg.schedule.deadline_s / 2, work.window or cfg.schedule.join_window_s)
        else:
            window = self.clock.window()
        join_key = self._book.join_key(v, meet=work.meet)
        code = self.clock.code(pending=work.rounds > 0)  # what the others read, we count
        # stored up to prepare_s before the meeting opens (loop.py): it lives as long after;
        # at a meeting we moved to, until the read of the peers there ends
        now = self._now()
        ahead = 0.0 if work.meet is None else max(0.0, work.meet - now)
        ttl = 2 * window + 2 + ahead
        if work.meet is not None and work.met:
            ttl = max(ttl, self.clock.closes(work.meet, list(work.met)) - now + window + 2)
        t_store = time.monotonic()
        self._transport.dht_store(join_key, self.peer_id,
                                  self._book.join(v, my_hash, code),
                                  ttl=ttl, timeout=window)
        t_join = time.monotonic()  # windows count from here: hashing a big model takes time
        meet_at = None if work.meet is None else t_join + work.meet - self._now()
        read_at = t_join + window if meet_at is None else max(t_join, meet_at + window)
        # the read ends once every peer we expect (our witnesses, our last group) claims our
        # hash and every discovered one has joined (a newcomer later than the peers that
        # know it waits for the next meeting), else at the window's end: on the clock the
        # meeting + the window of the longest period among them, the same time for everyone
        holders, early = self._read_group(join_key, v, my_hash, expected, discovered, read_at,
                                          code, meet_at=meet_at, ignore=ignore)
        late = None
        if meet_at is not None:
            # the peers already there stopped reading at the meeting + the window of the
            # longest period among them: a record we stored after that came too late for
            # their group (our rendezvous outlasted the window: DHT reads and tunnels to
            # peers behind NAT take seconds at 80 ms RTT). Their records are all we read,
            # yet none of them will JOIN us
            closed = self.clock.closes(
                meet_at, [c for p, c in holders.items() if p != self.peer_id and p not in ignore])
            if t_store > closed:  # even the store began after their read
                late = round(t_store - closed, 3)
        return Roster(holders, early, late)

    def _read_group(self, join_key: str, v: int, my_hash: str, expected: frozenset[str],
                    discovered: frozenset[str], read_at: float, code: int, *,
                    meet_at: float | None = None, ignore: frozenset[str] = frozenset()
                    ) -> tuple[dict[str, int], bool]:
        """Peer -> clock code (schedule.py) of the peers that claim our hash (us included),
        read until ``read_at``, or until every ``expected`` peer claims our hash and every
        ``discovered`` one has joined at all (if there is anyone to wait for); and whether
        it ended early.

        ``meet_at`` (a meeting on the clock, monotonic): the read lasts at least until the
        window of the longest period in force among the holders' codes after it, so peers
        that came with different periods read at the same time (schedule.py), and it never
        ends before ``meet_at`` (a peer that joined before the opening waits for it)."""
        mine = {self.peer_id: code}
        anyone = (expected | discovered) - {self.peer_id}
        signed: dict[str, OuterJoin] = {}
        while True:
            left = read_at - time.monotonic()
            # every read adds to the last (a read that fails or times out under load
            # returns nothing; the records seen before still stand, a newer one replaces)
            signed.update(self._book.verify(self._transport.dht_get(
                join_key, timeout=max(0.5, min(self.config.transport.dht_timeout_s, left))),
                OuterJoin, step=v))
            holders = {p: join_code(c) for p, c in signed.items()
                       if c.state_hash == my_hash} | mine
            if meet_at is not None:
                read_at = max(read_at, meet_at + self.clock.window(self.clock.near(
                    self.clock.longest([c for p, c in holders.items() if p not in ignore]))))
            early = bool(anyone) and expected <= set(holders) \
                and anyone <= set(signed) | set(holders)
            if early and meet_at is not None and time.monotonic() < meet_at:
                # joined before the opening (loop.py: prepare_s): everyone we wait for is
                # here, but the group is not read before the meeting opens
                time.sleep(max(0.0, meet_at - time.monotonic()))
            if early or time.monotonic() >= read_at:
                if len(holders) == 1:  # why we are alone: nobody came, or not at our state
                    logger.info("alone at version %d (%s…): %d other join record(s) at other "
                                "states, %d discovered peer(s) did not join", v, my_hash[:8],
                                len(set(signed) - {self.peer_id}), len(anyone - set(signed)))
                return holders, early
            time.sleep(min(READ_POLL_S, max(0.0, read_at - time.monotonic())))
