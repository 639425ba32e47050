"""Startup: an OuterLoop built on a thread of its own, so that the trainer never waits for it.

Building a loop starts p2pd, probes the known peers and starts the DHT (transport.py), plus
whatever the caller's ``build`` adds (the node loads the genesis weights): seconds on an idle
host, up to about two minutes on a loaded 2-core one. The trainer starts it and keeps
training; ``take()`` hands the loop over once it is up; a trainer that leaves first
``cancel()``s it: the build is abandoned at its next wait (``StartCancelled``: the transport
ends what it had started), and a loop that was built but never taken is closed. Nothing the
build started outlives ``cancel()``.

    startup = Startup(lambda abort: OuterLoop(..., abort=abort))
    loop = startup.take()            # None while it builds; raises what the build raised
    startup.cancel(timeout=15.0)     # leaving before it was taken
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from collectives.errors import StartCancelled
from collectives.loop import OuterLoop

__all__ = ["Startup"]

logger = logging.getLogger(__name__)


class Startup:
    """One OuterLoop being built by ``build(abort)`` on a thread of its own.

    ``build`` must give up soon after ``abort`` is set, closing what it started (OuterLoop's
    ``abort`` does). The thread is a daemon only so that a build stuck where it starts
    nothing (importing hivemind, loading weights) cannot hold the interpreter open at exit;
    it is owned all the same: ``cancel()`` aborts and joins it, and a loop it finishes after
    that is closed by the thread itself.
    """

    def __init__(self, build: Callable[[threading.Event], OuterLoop], *,
                 name: str = "outer-start") -> None:
        self._build = build
        self._abort = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._loop: OuterLoop | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._t0 = time.monotonic()
        self.seconds: float | None = None
        """How long the build took (None until it ended)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop: OuterLoop | None = None
        error: BaseException | None = None
        try:
            loop = self._build(self._abort)
        except BaseException as e:  # noqa: BLE001 - handed to the taker, on its thread
            error = e
        with self._lock:
            self.seconds = round(time.monotonic() - self._t0, 3)
            unwanted = self._abort.is_set()
            self._error = error
            if not unwanted:
                self._loop = loop
        if unwanted and loop is not None:  # cancelled while it finished: nobody will take it
            _close(loop)
        if isinstance(error, StartCancelled):
            logger.info("collective start abandoned after %.1f s: %s", self.seconds, error)
        self._done.set()

    def done(self) -> bool:
        """Whether the build ended (with a loop or an error)."""
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the build to end; whether it did."""
        return self._done.wait(timeout)

    def take(self) -> OuterLoop | None:
        """The loop once built (the caller owns and closes it from then on), else None;
        never blocks. Raises what the build raised."""
        if not self._done.is_set():
            return None
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._taken or self._loop is None:
                return None
            self._taken = True
            return self._loop

    def cancel(self, *, timeout: float) -> bool:
        """Abandon the build: abort it and wait up to ``timeout`` s for its thread; close a
        loop that was built but not taken. Whether the thread ended (if not, it is somewhere
        that starts nothing, and closes a loop it still finishes)."""
        with self._lock:
            self._abort.set()
            loop = None if self._taken else self._loop
            self._loop = None
        if loop is not None:
            _close(loop)
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _close(loop: OuterLoop) -> None:
    try:
        loop.close()
    except Exception as e:  # noqa: BLE001 - leaving anyway
        logger.warning("closing an untaken outer loop: %s", e)
