"""A node's last outer step when its run ends, and its word when it leaves before that.

A mixin of ``OuterLoop`` (loop.py). Background steps meet on the clock at round boundaries;
a node whose run ends has no rounds left, and the peers it trains with end at other times
(they started seconds apart, their rounds differ). If it simply left, a peer that ends later
would find nobody: it could neither average its last rounds nor adopt the state the others
ended with, and the swarm would end with different states. So ``finish()`` is a barrier:

1. **Wait** (up to ``final_wait_s``) at the unscheduled key ``<gid>/join/<version>`` until
   every peer it expects is there: its version's witnesses and its last group must claim its
   state, every peer it discovered must have joined at all — or said that it left (a signed
   record claiming ``LEFT`` under ``<gid>/left``, stored by ``close()`` of a node stopped
   before its run ended; at any version, so a peer that left long ago is not waited for). Peers still training keep meeting on the clock meanwhile; when a head newer than
   the ones its catch-up already read appears, the waiting node catches up (a rebase: its
   rounds since its delta was last counted stay pending) and waits at the new version's key.
   With nobody to wait for, it does not wait.
2. **Step** with whoever came (as ``outer_step``): the nodes that end together end in one
   group, at one state; their last rounds join that average.
3. **Serve**: after an applied step it stays (up to ``final_wait_s``) until every member of
   that group has published the group's state as its head: a member whose exchange or vote
   failed adopts that state from the holders, so they must not all be gone.

A peer that is later than ``final_wait_s`` behind the others ends on its own: alone, at the
version it holds (or the newest one it can still fetch).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from collectives.background import Work
from collectives.config import OuterConfig
from collectives.consistency import CommitBook
from collectives.errors import StepFailed
from collectives.state import OuterState, flatten
from collectives.transport import Transport

__all__ = ["Finisher", "LEFT"]

logger = logging.getLogger(__name__)

LEFT = "0" * 64
"""The state hash a node claims in a join record to say it left (no state hashes to it)."""


class Finisher:
    """``finish()`` and the LEFT record (the attributes are ``OuterLoop``'s)."""

    config: OuterConfig
    peer_id: str
    _transport: Transport
    _book: CommitBook
    _lock: threading.Lock
    _state: OuterState
    _params: list[torch.nn.Parameter]
    _rounds_pending: int
    _last_group: frozenset[str]
    _pool: ThreadPoolExecutor
    _pending: tuple[Work, Future[dict[str, Any]]] | None
    _heads_read: set[tuple[str, str, int]]
    _finished: bool
    _stop: threading.Event | None
    _run: Callable[[Work], dict[str, Any]]
    poll: Callable[..., dict[str, Any] | None]

    def finish(self, *, stop: threading.Event | None = None) -> dict[str, Any]:
        """The last step of a run that ended (see the module docstring): waits for the
        peers' last steps, steps with them, serves the result; its record. Bounded by
        about ``2 × final_wait_s + deadline_s``; ``stop`` set (a signal) ends the wait and
        the serving within a second (then close() says we left). A step still running is
        collected first."""
        if self._pending is not None:
            earlier = self.poll(wait=None)
            logger.info("collected a background step first: %s", earlier and earlier["status"])
        self._finished, self._stop = True, stop
        start = time.monotonic()
        work = Work(snapshot=flatten(self._params), rounds=self._rounds_pending, weight=None,
                    until=start + self.config.final_wait_s)
        self._pending = (work, self._pool.submit(self._run, work))
        rec = self.poll(wait=None)
        assert rec is not None
        if rec["status"] == "ok":
            self._serve_until_taken(rec["param_hash"], time.monotonic() + self.config.final_wait_s)
        if self._stopped():
            self._finished = False
        rec["final"], rec["finish_seconds"] = True, round(time.monotonic() - start, 4)
        return rec

    def _watch(self, v: int) -> set[str] | None:
        """While waiting at version ``v``: None if a head newer than ``v`` appeared that our
        last catch-up did not read (one it read and refused does not count again: a
        hostile head cannot keep us catching up); else the peers that said they left.
        StepFailed once ``stop`` is set."""
        if self._stopped():
            raise StepFailed("stopped while waiting for the peers' last steps")
        timeout = min(5.0, self.config.dht_timeout_s)
        heads = self._book.verify(self._transport.dht_get(self._book.head_key, timeout=timeout),
                                  step=None, kind="version")
        if any(c.step > v and (p, c.state_hash, c.step) not in self._heads_read
               for p, c in heads.items() if p != self.peer_id):
            return None
        said = self._book.verify(self._transport.dht_get(self._left_key, timeout=timeout),
                                 step=None, kind="join")
        return {p for p, c in said.items() if c.state_hash == LEFT}

    @property
    def _left_key(self) -> str:
        return f"{self._book.gid}/left"

    def _serve_until_taken(self, h: str, until: float) -> None:
        """Stay (serving ``h``) until every other member of our last group published ``h``
        as its head, or until ``until``."""
        waiting = set(self._last_group) - {self.peer_id}
        while waiting and time.monotonic() < until and not self._stopped():
            heads = self._book.verify(self._transport.dht_get(
                self._book.head_key, timeout=max(0.5, min(5.0, until - time.monotonic()))),
                step=None, kind="version")
            waiting = {m for m in waiting if m not in heads or heads[m].state_hash != h}
            if waiting:
                time.sleep(0.5)
        if waiting:
            logger.info("leaving while %d member(s) of the last group did not take its state",
                        len(waiting))

    def _stopped(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _say_left(self) -> None:
        """Tell the peers waiting for our last step that it will not come (best effort)."""
        if self._finished:
            return
        with self._lock:
            v = self._state.version
        try:
            self._transport.dht_store(self._left_key, self.peer_id,
                                      self._book.seal(v, LEFT, 1, kind="join"),
                                      ttl=self.config.final_wait_s + 2, timeout=2.0)
        except Exception as e:  # noqa: BLE001 - leaving anyway
            logger.info("could not say we left: %s", e)
