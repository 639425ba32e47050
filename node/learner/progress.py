"""Where the learner is within a round, for the status view: phase name and done/total.

``PhaseReporter.phase(name, total=..., model=...)`` is a context manager around one phase of
a round. It reports the phase when it starts and, if a model is given, counts that model's
forward passes as progress (one per generated token step in ``generate``, one per micro-batch
pass in ``train``), reporting at most every ``min_interval_s``. Counting forwards with a hook
keeps the engine and the trainer unaware of the view; the cost is one Python call per
forward pass. Reporting must never break training: errors of the callback are logged once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["PhaseCallback", "PhaseReporter"]

log = logging.getLogger(__name__)

PhaseCallback = Callable[[str, int, int], None]
"""``on_phase(name, done, total)``; total 0 means "no measure of progress"."""


class PhaseReporter:
    """Throttled phase/progress reports to ``on_phase`` (None: report nothing)."""

    def __init__(self, on_phase: PhaseCallback | None = None, *, min_interval_s: float = 0.5) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {min_interval_s}")
        self._on_phase = on_phase
        self._min_interval_s = min_interval_s
        self._last = 0.0
        self._failed = False

    def report(self, name: str, done: int = 0, total: int = 0, *, force: bool = True) -> None:
        if self._on_phase is None or self._failed:
            return
        now = time.monotonic()
        if not force and now - self._last < self._min_interval_s:
            return
        self._last = now
        try:
            self._on_phase(name, done, total)
        except Exception:  # the view must never stop training
            self._failed = True
            log.exception("phase reporting failed; the status view stops showing phases")

    @contextmanager
    def phase(self, name: str, *, total: int = 0, model: Any = None) -> Iterator[None]:
        self.report(name, 0, total)
        if model is None or self._on_phase is None:
            yield
            return
        done = 0

        def on_forward(*_: Any) -> None:
            nonlocal done
            done += 1
            self.report(name, min(done, total) if total else done, total, force=False)

        handle = model.register_forward_hook(on_forward)
        try:
            yield
        finally:
            handle.remove()
