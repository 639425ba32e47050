"""Who leads a meeting's group: an order no peer can choose, and the peers we saw stall one.

The leader was the smallest peer id among the holders of our state hash: a key ground to
sort first (1.9 s of work) led every group it joined and could stall every step (issue 32:
0 of 32 honest steps `ok`). Now the holders are ranked

1. peers we blamed (below) last;
2. then our version's witnesses (the peers that contributed to the state we all hold: a
   fresh identity is not one, whatever its key) before everyone else;
3. then by sha256(state hash, meeting, peer id): the state hash of a version exists only once
   its group averaged, so a witness cannot choose its rank in advance, and a non-witness
   leads only where no witness came.

What remains (said in README's threat model): at genesis (no witnesses) the hash and the
meetings are known in advance, so a ground key can rank first there; a witness leads about
1/n of the meetings and can stall one before it is blamed.

Blame is local, never voted: a leader that refused our timely JOIN or did not answer it
in time and a member whose shard or contribution never came rank last in our order, and a
leader neither admits them to its group (a member that JOINs and never reduces failed every
group it was admitted to) nor waits for them, for the next ``BLAME_ATTEMPTS`` attempts
(``STRANGER_BLAME_ATTEMPTS`` for a member that never reduced and never took part in a step
with us; no-shows likewise), twice as
many for each blame again (up to ``MAX_BLAME_ATTEMPTS``). Every member that saw a stall
blames the same peer, so they pick the same next leader. A peer whose contribution we
accepted since is cleared (a slow honest peer that missed a JOIN is not held to it).

A holder of our state that never JOINs (its record claims our hash; issue 32's staller)
cost each leader a wait until its latest freeze at every meeting, and the slower steps
lengthened everyone's period (measured: 0.35x the no-attack rate of `ok` steps). Every
member sees it outside the group formed (``Blame.no_show``): no leader waits for it past
the freeze for the next attempts (as long as a blame), its clock code stretches neither our
read nor our window, and a newcomer does not move to its meetings; it never enters the
order. A leader that read early gives a no-show the freeze grace (it may be here now) only
the first time since it last took part in a step with us (``first_no_shows``). The period a
newcomer adopts from the records at a meeting it moves to is capped at two rungs past its
own proposal (a staller re-storing records that claim the longest period, 600 s, kept three
honest peers from ever meeting).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["BLAME_ATTEMPTS", "MAX_BLAME_ATTEMPTS", "STRANGER_BLAME_ATTEMPTS", "Blame",
           "leader_order", "yield_lead"]

BLAME_ATTEMPTS = 3
"""Attempts a peer blamed once ranks last in our leader order (one that took part in a step
with us before; ``STRANGER_BLAME_ATTEMPTS`` for one that never did)."""
STRANGER_BLAME_ATTEMPTS = 24
"""The same for a member whose shard never came and that never took part in a step with us
(and for such a no-show): fresh identities are free,
and one that JOINs and never reduces failed a group each time its blame ran out (3 of 18
meetings lost per failure at 3 attempts). An honest newcomer whose first step failed waits
longer to be admitted; it keeps its rounds and adopts the versions meanwhile."""
MAX_BLAME_ATTEMPTS = 96
"""The longest blame (a peer blamed again and again)."""


def leader_order(holders: Iterable[str], *, state_hash: str, meeting: str,
                 witnesses: frozenset[str], blamed: frozenset[str] = frozenset()
                 ) -> list[str]:
    """``holders`` in the order they lead (the first leads; the next when it is dead)."""
    def rank(peer: str) -> tuple[bool, bool, bytes]:
        draw = hashlib.sha256(f"{state_hash}\n{meeting}\n{peer}".encode()).digest()
        return peer in blamed, peer not in witnesses, draw
    return sorted(set(holders), key=rank)


def yield_lead(order: list[str], me: str, *, late: bool) -> tuple[list[str], bool]:
    """``order`` as a peer whose join record came after the others' read ended should see
    it, and whether it gave up the lead: they never read it (as far as it can tell), so
    their leader is the first of them, not us (first, we would lead nobody), and we go last.
    But a read ends when its last DHT get returns, after the window's end: a record stored
    just after may have been read, and then the others wait on us as their leader while we
    JOIN theirs. Seen: 0.025 s late, both others waited on us and we on them; they blamed
    us as a stalled leader and, as we had never stepped with them, left us out of every
    later group (test_leader_stall[hold], fresh-clone CI). So a peer that gave up the lead
    takes it back when a JOIN from a peer it does not refuse reaches it
    (``Matchmaker.form_group(lead_if_joined=)``)."""
    if not late:
        return order, False
    return [p for p in order if p != me] + [me], len(order) > 1 and order[0] == me


class _Spans:
    """Peers marked for a number of attempts, doubled for each mark again (bounded: fresh
    identities are free, so the older marks stay when it is full)."""

    def __init__(self, attempts: int, max_peers: int) -> None:
        self._attempts, self._max = attempts, max_peers
        self._until: dict[str, int] = {}
        """Peer -> marked while fewer attempts than this have ended."""
        self._times: dict[str, int] = {}
        """Peer -> how often we marked it (bounded like ``_until``)."""

    def mark(self, peer: str, ended: int, *, attempts: int | None = None) -> bool:
        if peer not in self._until and len(self._until) >= self._max:
            return False
        if peer not in self._times and len(self._times) >= self._max:
            self._times.pop(next(iter(self._times)))
        times = self._times[peer] = self._times.get(peer, 0) + 1
        base = self._attempts if attempts is None else attempts
        span = min(MAX_BLAME_ATTEMPTS, base << min(times - 1, 16))
        self._until[peer] = max(self._until.get(peer, 0), ended + 1 + span)
        return True

    def clear(self, peer: str) -> None:
        self._until.pop(peer, None)

    def forget(self, peer: str) -> None:
        """``clear``, and its marks are not counted (the next mark is its first)."""
        self._until.pop(peer, None)
        self._times.pop(peer, None)

    def times(self, peer: str) -> int:
        """How often ``peer`` was marked (since it was forgotten)."""
        return self._times.get(peer, 0)

    def peers(self) -> frozenset[str]:
        return frozenset(self._until)

    def expire(self, ended: int) -> None:
        self._until = {p: n for p, n in self._until.items() if n > ended}


class Blame:
    """What we saw peers do to our groups, each held against them for a number of attempts
    (the outer thread only):

    - **blamed** (a leader that stalled us, a member whose shard or contribution never
      came): last in our leader order, and not waited for;
    - **no-shows** (a holder of our state that was not in the group formed: its JOIN did
      not come by the leader's freeze): not waited for past the freeze again. Never in the
      leader order, which every member must compute alike (a record of an earlier attempt
      at our version made such blame one-sided: test_lineage). A slow honest peer that
      JOINs before the freeze is admitted as before, and cleared once it contributes.
    """

    def __init__(self, attempts: int = BLAME_ATTEMPTS, max_peers: int = 256,
                 stranger_attempts: int = STRANGER_BLAME_ATTEMPTS) -> None:
        self._ended, self._max, self._stranger = 0, max_peers, stranger_attempts
        self._blamed = _Spans(attempts, max_peers)
        self._absent = _Spans(attempts, max_peers)
        self._known: dict[str, None] = {}
        """Peers that took part in a step with us (the latest ``max_peers``)."""
        self.counts: dict[str, int] = {}
        """Marks by reason, since the start (for the step record)."""

    def _span(self, peer: str) -> int | None:
        return None if peer in self._known else self._stranger

    def blame(self, peer: str, why: str) -> None:
        """``peer`` ranks last in the next attempts' leader order: ``attempts`` of them
        (``stranger_attempts`` for a member that never took part in a step with us and
        whose shard or contribution never came), doubled for each time it was blamed
        before."""
        # the longer span only for a member that never reduced: a leader that refused us
        # may have refused a JOIN of ours that came late (a fresh-clone CI run: a peer
        # refused at genesis held both honest leaders 24 attempts and stepped alone)
        span = self._span(peer) if why == "exchange_missing" else None
        if self._blamed.mark(peer, self._ended, attempts=span):
            self.counts[why] = self.counts.get(why, 0) + 1

    def no_show(self, peer: str) -> None:
        """``peer`` claimed our state but was not in the group formed: the next attempts do
        not wait for its JOIN past the freeze (as long as ``blame``). A peer blamed already
        is not counted again."""
        if peer in self._blamed.peers():
            return
        if self._absent.mark(peer, self._ended, attempts=self._span(peer)):
            self.counts["no_show"] = self.counts.get("no_show", 0) + 1

    def clear(self, peer: str) -> None:
        """``peer`` took part in a step with us (its contribution was accepted): a slow
        honest peer blamed for a missed JOIN is waited for again at once, and a blame
        again lasts as long as a known peer's."""
        self._blamed.clear(peer)
        self._absent.forget(peer)
        self._known.pop(peer, None)
        self._known[peer] = None
        if len(self._known) > self._max:
            self._known.pop(next(iter(self._known)))

    def blamed(self) -> frozenset[str]:
        """Last in our leader order."""
        return self._blamed.peers()

    def first_no_shows(self) -> frozenset[str]:
        """No-shows (not blamed) marked once since they last took part in a step with us:
        a leader that read early still gives them the freeze grace (attempt.py). One
        marked again gets none: a holder that re-stores its record and never JOINs cost
        every meeting that grace (measured: the period went from 2 s to 4 s, 0.56x the
        no-attack rate of `ok` steps)."""
        blamed = self._blamed.peers()
        return frozenset(p for p in self._absent.peers()
                         if p not in blamed and self._absent.times(p) == 1)

    def unwaited(self) -> frozenset[str]:
        """Not waited for past a freeze, and their clock codes do not stretch our window."""
        return self._blamed.peers() | self._absent.peers()

    def attempt_ended(self) -> None:
        self._ended += 1
        self._blamed.expire(self._ended)
        self._absent.expire(self._ended)
