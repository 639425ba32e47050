"""When and how the learner checkpoints: by round and by time, written off the training path.

``CheckpointSaver.after_round(round)`` saves when ``checkpoint_every`` rounds or
``checkpoint_every_s`` seconds have passed since the last save. Training waits only for the
snapshot (weights, optimizer and RNG state copied to CPU memory); a background thread writes
it in checkpoint.py's format (temp dir, fsync, rename), so a round never waits on the disk.
At most one write is in flight: a save that falls due while the previous one is still being
written is taken at the next round boundary instead. ``final(round)`` (on stop) waits for the
write in flight and saves synchronously, also when the round is saved but the outer state moved
since (the last outer steps run after the last round: their result is what the node keeps). An error of the background write (a full disk) is
raised by the next call, in the training thread, where the learner process handles it.

A kill therefore loses at most ``checkpoint_every_s`` plus one round (checkpoints are taken
between rounds) plus the time of one write.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.learner.checkpoint import Snapshot, snapshot, write_snapshot

__all__ = ["CheckpointSaver"]

log = logging.getLogger(__name__)

Writer = Callable[..., Path]
"""``write(data_dir, snap, *, round, fingerprint, keep) -> path`` (checkpoint.write_snapshot)."""


class CheckpointSaver:
    def __init__(self, *, data_dir: str | Path, model: Any, optimizer: Any, fingerprint: str,
                 every_rounds: int, every_s: float, keep: int, saved_round: int | None,
                 on_saved: Callable[[int, Path, float], None] | None = None,
                 write: Writer = write_snapshot, provenance: dict[str, Any] | None = None,
                 outer_state: Callable[[], Any] | None = None,
                 heldout: Callable[[], dict[str, Any] | None] | None = None) -> None:
        """``provenance``: recorded in every checkpoint's meta.json (base model name, swarm
        id, task families). ``outer_state()``: the node's outer state now (a copy:
        ``OuterLoop.state``), or None; ``heldout()``: the newest held-out score (a round
        record's ``heldout``), or None before one. Both asked at each snapshot, on the
        training thread."""
        if every_rounds < 0 or every_s < 0:
            raise ValueError(f"checkpoint cadence must be >= 0 (every_rounds={every_rounds}, "
                             f"every_s={every_s})")
        self.data_dir = Path(data_dir)
        self.model, self.optimizer, self.fingerprint = model, optimizer, fingerprint
        self.every_rounds, self.every_s, self.keep = every_rounds, every_s, keep
        self.saved_round = saved_round
        """Round of the newest checkpoint written (or being written)."""
        self._on_saved = on_saved
        self._write = write
        self._provenance = dict(provenance or {})
        self._outer_state = outer_state
        self._heldout = heldout
        self._last_save = time.monotonic()
        self._saved_outer: tuple[int, str] | None = None
        """(version, state hash) of the outer state in the newest snapshot, if any."""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        for stale in (self.data_dir / "checkpoints").glob(".tmp-*"):  # a write cut by a kill
            shutil.rmtree(stale, ignore_errors=True)

    def due(self, round_: int) -> bool:
        if round_ == self.saved_round:
            return False
        by_round = bool(self.every_rounds) and round_ % self.every_rounds == 0
        by_time = bool(self.every_s) and time.monotonic() - self._last_save >= self.every_s
        return by_round or by_time

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def after_round(self, round_: int) -> bool:
        """Start a background save of ``round_`` if one is due and none is in flight."""
        self._raise_error()
        if not self.due(round_):
            return False
        if self.busy:
            log.debug("checkpoint of round %d deferred: the previous write is in flight", round_)
            return False
        self._start(self._snapshot(), round_)
        return True

    def final(self, round_: int) -> None:
        """On stop: wait for the write in flight, then save ``round_`` if it is not saved, or
        if the outer state moved since it was (the run's last outer steps, or a version
        adopted, after the last round: a resume or an export must see that state)."""
        self.wait()
        self._raise_error()
        snap = self._snapshot() if self._outer_state is not None else None
        if round_ != self.saved_round or (snap is not None and _outer_key(snap) != self._saved_outer):
            self._save(snap or self._snapshot(), round_)
        self._raise_error()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _snapshot(self) -> Snapshot:
        outer = self._outer_state() if self._outer_state is not None else None
        heldout = self._heldout() if self._heldout is not None else None
        return snapshot(self.model, self.optimizer, provenance=self._provenance, outer=outer,
                        heldout=heldout)

    def _start(self, snap: Snapshot, round_: int) -> None:
        self.saved_round = round_
        self._saved_outer = _outer_key(snap)
        self._last_save = time.monotonic()
        self._thread = threading.Thread(target=self._save, args=(snap, round_),
                                        name=f"checkpoint-{round_}", daemon=True)
        self._thread.start()

    def _save(self, snap: Snapshot, round_: int) -> None:
        t = time.monotonic()
        self.saved_round = round_
        self._saved_outer = _outer_key(snap)
        try:
            path = self._write(self.data_dir, snap, round=round_, fingerprint=self.fingerprint,
                               keep=self.keep)
        except BaseException as e:  # re-raised in the training thread
            self._error = e
            return
        if self._on_saved is not None:
            try:
                self._on_saved(round_, path, time.monotonic() - t)
            except Exception:
                log.exception("checkpoint callback failed")

    def _raise_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e


def _outer_key(snap: Snapshot) -> tuple[int, str] | None:
    return (snap.outer.version, snap.outer.hash()) if snap.outer is not None else None
