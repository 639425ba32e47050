"""A node's last outer steps when its run ends, and its word when it leaves before that.

A mixin of ``OuterLoop`` (loop.py). Background steps meet on the clock at round boundaries;
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
   decides alike (``_who_steps``).
2. **The last step**: at a meeting where every peer present has finished and nobody we
   expect is missing (our version's witnesses, our last group and the peers we discovered
   are all there, or said they left: a signed ``OuterLeft`` under ``<gid>/left``, stored
   by ``close()``), the peers step together if one of them still
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
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from collectives.background import Work
from collectives.errors import StepFailed
from collectives.parts import LoopParts
from collectives.schedule import Clock
from protocol import OuterLeft

__all__ = ["Finisher"]

logger = logging.getLogger(__name__)

POLL_S = 0.05
"""How often a finished node looks at the clock for the next meeting."""


class Finisher(LoopParts):
    """``finish()`` and the left record (the attributes are ``OuterLoop``'s)."""

    _pool: ThreadPoolExecutor
    _pending: tuple[Work, Future[dict[str, Any]]] | None
    _stop: threading.Event | None
    _run: Callable[[Work], dict[str, Any]]
    poll: Callable[..., dict[str, Any] | None]
    state_hash: Callable[[], str]

    def finish(self, *, stop: threading.Event | None = None,
               on_record: Callable[[dict[str, Any]], None] | None = None,
               ) -> dict[str, Any] | None:
        """Our run ended: attend the meetings until the end (see the module docstring).
        Every step's record goes to ``on_record``; returns the last (None if none).
        Bounded by about ``2 × final_wait_s + deadline_s``; ``stop`` set (a signal) ends it
        within a meeting. A step still running is collected first."""
        last: dict[str, Any] | None = None
        if self._pending is not None:
            last = self.poll(wait=None)
            if last is not None and on_record is not None:
                on_record(last)
        self._stop = stop
        self.clock.finish()
        start = time.monotonic()
        while not self._stopped() and time.monotonic() - start < \
                2 * self.config.final_wait_s + self.config.deadline_s:
            meet = self.clock.due(self._now())
            if meet is None:
                time.sleep(POLL_S)
                continue
            work = Work(snapshot=self._snapshot(), rounds=self._rounds_pending,
                        weight=None, meet=meet, final=True,
                        last_call=time.monotonic() - start > self.config.final_wait_s)
            self._pending = (work, self._pool.submit(self._run, work))
            got = self.poll(wait=None)
            assert got is not None
            if got.get("end"):
                break
            if got["status"] != "waiting":
                last = got
                if on_record is not None:
                    on_record(got)
        logger.info("finished after %.1f s", time.monotonic() - start)
        return last

    def _who_steps(self, rec: dict[str, Any], work: Work, holders: dict[str, int],
                   anyone: frozenset[str]) -> dict[str, int] | None:
        """Of a meeting's holders (peer -> clock code), those who step; None if we do not
        (the meeting passes for us: status "waiting", ``end`` set when it is our end).
        Every peer read the same codes, so every peer decides alike.

        With a peer still training here, finished peers with nothing pending stay out (a
        zero delta would only dilute the average, or with 3+ members drag the coordinate
        median: reduce.py) and follow by catch-up. With every peer here finished: they step
        together if nobody we expect is missing and someone has rounds pending (our last
        step); it is our end if nobody is missing (or our wait is over) and nothing is
        pending (everyone here holds our state)."""
        if not any(Clock.finished(c) for c in holders.values()):
            return holders
        if not all(Clock.finished(c) for c in holders.values()):
            kept = {p: c for p, c in holders.items()
                    if not Clock.finished(c) or Clock.pending(c)}
            if self.peer_id in kept:
                return kept
            end = False
        else:
            missing = set(anyone) - set(holders) - {self.peer_id}
            if missing:
                missing -= self._gone()
            if missing and not work.last_call:
                rec["waiting_for"] = len(missing)
                end = False
            elif len(holders) >= self.config.min_peers \
                    and any(Clock.pending(c) for c in holders.values()):
                return holders  # the last step: every peer here ended, nobody missing
            else:
                end = True
        self._transport.run(self._refuse_joins(), 5)
        rec["status"], rec["end"] = "waiting", end
        return None

    async def _refuse_joins(self) -> None:
        """A meeting we let pass: a peer that JOINs us gets "not admitted" at once."""
        s = self._ar.session
        if s is not None and not s.members_fut.done():
            s.members_fut.set_exception(StepFailed("no step at this meeting"))
            s.members_fut.exception()  # retrieved: nobody else awaits it

    def _gone(self) -> set[str]:
        """The peers that said they left (at any version)."""
        return set(self._book.verify(self._transport.dht_get(
            self._left_key, timeout=min(5.0, self.config.dht_timeout_s)), OuterLeft, step=None))

    @property
    def _left_key(self) -> str:
        return f"{self._book.gid}/left"

    def _stopped(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _say_left(self) -> None:
        """Tell finished peers not to wait for us (best effort; also after our last step:
        a peer that knows of a peer we did not might still be waiting)."""
        with self._lock:
            v = self._state.version
        try:
            self._transport.dht_store(self._left_key, self.peer_id,
                                      self._book.left(v),
                                      ttl=self.config.final_wait_s + 2, timeout=2.0)
        except Exception as e:  # noqa: BLE001 - leaving anyway
            logger.info("could not say we left: %s", e)
