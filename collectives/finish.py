"""A node's last outer steps when its run ends, and its word when it leaves before that.

``OuterLoop.finish`` runs the attempts; here: who steps at a meeting of finished peers
(``who_steps``) and the left records (``Farewell``). Background steps meet on the clock at round boundaries;
a node whose run ends has no rounds left, and the peers it trains with end at other times
(they started seconds apart, their rounds differ). If it simply left, a peer that ends later
would find nobody: it could neither average its last rounds nor adopt the state the others
ended with, and the swarm would end with different states. If it waited aside, the peers
still training could advance without it — and a node that never grouped yet cannot adopt
their version (it trusts nobody's head by default: consistency.py), so they would end apart
too (seen in the e2e local swarm). So ``finish()`` keeps the node *in* the meetings:

1. **Attend** every meeting of the ladder's base period (a peer still training may meet at
   any of them; the clock, schedule.py, marks our join records FINISHED, asks for no period,
   and marks PENDING while we have rounds no average counted). At a meeting with a peer
   still training, a PENDING finished peer steps with it (its last rounds join the
   average, and it becomes a witness of the version, so it can follow the next ones by
   catch-up); one with nothing pending stays out of the group (a zero delta would dilute
   the average, or drag the coordinate median with 3+ members: reduce.py) and follows the
   versions the others make by catch-up. Every peer reads the same codes, so every peer
   decides alike (``who_steps``).
2. **The last step**: at a meeting where every peer present has finished and nobody we
   expect is missing (our version's witnesses, our last group, the peers we discovered and
   those the operator pinned, ``[outer.catchup] trusted_peers``, are all there, or said
   they left: a signed ``OuterLeft`` under ``<gid>/left``, stored by ``OuterLoop.close``;
   a pinned node that starts late is waited for even before it is discovered, and adopts
   our version), the peers step together if one of them still
   has rounds no average counted (the clock marks such records PENDING). Everyone present
   read the same records at the same time, so they all decide alike. A member whose last
   step failed is still PENDING at the next meeting, and the others are still there.
3. **End** at the first such meeting where nothing is pending: everyone present holds the
   same state (they all claim ours), so everyone ends at one state; no step (finished
   peers must not make versions of zero deltas). A meeting of finished peers with someone
   missing passes without a step; after ``final_wait_s`` nobody missing is waited for.

Only the records of steps that happened are reported; a peer that is later than
``final_wait_s`` behind the others ends on its own. The cost: at most ``2 × final_wait_s
+ deadline_s`` at the end of a run, a few DHT reads per meeting of the ladder's base.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from collectives.config import OuterConfig
from collectives.consistency import CommitBook
from collectives.schedule import Clock
from collectives.transport import Transport
from protocol import OuterLeft

__all__ = ["Farewell", "Verdict", "who_steps"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """Who steps at a meeting: ``stepping`` (peer -> clock code), or None when we let it
    pass; then ``end`` says whether it is our end, ``waiting_for`` how many expected peers
    are missing."""

    stepping: dict[str, int] | None
    end: bool = False
    waiting_for: int = 0


def who_steps(holders: dict[str, int], anyone: frozenset[str], *, me: str, last_call: bool,
              min_peers: int, gone: Callable[[], set[str]]) -> Verdict:
    """Of a meeting's holders (peer -> clock code), those who step. Every peer read the
    same codes, so every peer decides alike.

    With a peer still training here, finished peers with nothing pending stay out (a zero
    delta would only dilute the average, or with 3+ members drag the coordinate median:
    reduce.py) and follow by catch-up. With every peer here finished: they step together if
    nobody we expect (``anyone``) is missing and someone has rounds pending (our last step);
    it is our end if nobody is missing (or ``last_call``: our wait is over) and nothing is
    pending (everyone here holds our state). ``gone()``: the peers that said they left (read
    only when someone is missing)."""
    if not any(Clock.finished(c) for c in holders.values()):
        return Verdict(holders)
    if not all(Clock.finished(c) for c in holders.values()):
        kept = {p: c for p, c in holders.items()
                if not Clock.finished(c) or Clock.pending(c)}
        return Verdict(kept) if me in kept else Verdict(None)
    missing = set(anyone) - set(holders) - {me}
    if missing:
        missing -= gone()
    if missing and not last_call:
        return Verdict(None, waiting_for=len(missing))
    if len(holders) >= min_peers and any(Clock.pending(c) for c in holders.values()):
        return Verdict(holders)  # the last step: every peer here ended, nobody missing
    return Verdict(None, end=True)


class Farewell:
    """The left records: a node that leaves says so (``say_left``); a finished node waiting
    for its peers stops waiting for those that did (``gone``)."""

    def __init__(self, *, config: OuterConfig, peer_id: str, book: CommitBook,
                 transport: Transport) -> None:
        self._config, self._me, self._book, self._transport = config, peer_id, book, transport
        self._key = f"{book.gid}/left"

    def gone(self) -> set[str]:
        """The peers that said they left (at any version)."""
        return set(self._book.verify(self._transport.dht_get(
            self._key, timeout=min(5.0, self._config.transport.dht_timeout_s)), OuterLeft,
            step=None))

    def say_left(self, version: int) -> None:
        """Tell finished peers not to wait for us (best effort; also after our last step:
        a peer that knows of a peer we did not might still be waiting)."""
        try:
            self._transport.dht_store(self._key, self._me, self._book.left(version),
                                      ttl=self._config.schedule.final_wait_s + 2, timeout=2.0)
        except Exception as e:  # noqa: BLE001 - leaving anyway
            logger.info("could not say we left: %s", e)
