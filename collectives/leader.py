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
leader does not wait for them past its freeze, for the next ``BLAME_ATTEMPTS`` attempts, twice as many for each
blame again (up to ``MAX_BLAME_ATTEMPTS``). Every member that saw a stall blames the same
peer, so they pick the same next leader. A peer whose contribution we accepted since is
cleared (a slow honest peer that missed a JOIN is not held to it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["BLAME_ATTEMPTS", "MAX_BLAME_ATTEMPTS", "Blame", "leader_order"]

BLAME_ATTEMPTS = 3
"""Attempts a peer blamed once ranks last in our leader order."""
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


class Blame:
    """Peers we saw stall a group, each for a number of attempts (the outer thread only)."""

    def __init__(self, attempts: int = BLAME_ATTEMPTS, max_peers: int = 256) -> None:
        self._attempts, self._max = attempts, max_peers
        self._ended = 0
        self._until: dict[str, int] = {}
        """Peer -> blamed while fewer attempts than this have ended."""
        self._times: dict[str, int] = {}
        """Peer -> how often we blamed it (bounded like ``_until``)."""
        self.counts: dict[str, int] = {}
        """Blames by reason, since the start (for the step record)."""

    def blame(self, peer: str, why: str) -> None:
        """``peer`` ranks last in the next attempts' leader order: ``attempts`` of them,
        doubled for each time it was blamed before."""
        if peer not in self._until and len(self._until) >= self._max:
            return  # fresh identities are free: the list is bounded, the older blames stay
        if peer not in self._times and len(self._times) >= self._max:
            self._times.pop(next(iter(self._times)))
        times = self._times[peer] = self._times.get(peer, 0) + 1
        span = min(MAX_BLAME_ATTEMPTS, self._attempts << min(times - 1, 16))
        self._until[peer] = max(self._until.get(peer, 0), self._ended + 1 + span)
        self.counts[why] = self.counts.get(why, 0) + 1

    def clear(self, peer: str) -> None:
        """``peer`` took part in a step with us (its contribution was accepted): a slow
        honest peer blamed for a missed JOIN is waited for again at once."""
        self._until.pop(peer, None)

    def blamed(self) -> frozenset[str]:
        return frozenset(self._until)

    def attempt_ended(self) -> None:
        self._ended += 1
        self._until = {p: n for p, n in self._until.items() if n > self._ended}
