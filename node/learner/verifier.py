"""The learner's side of the sandboxed verifier: one long-lived worker process, budgets, restarts.

``VerifierClient.score(items)`` sends a round's rollouts to ``verifier_worker`` in one request
and reads one reply per rollout. The client trusts the worker with nothing but numbers: every
reply is checked (right call and item, finite rewards in [0, 1], one per completion, a known
reason) before it is used. Budgets (``VerifyConfig``):

- each rollout must be answered within ``rollout_timeout_s`` of the previous one, and the
  whole call within ``call_timeout_s``; on overrun the worker is killed (SIGKILL), the rollout
  it was on is ``verify_timeout`` and the rest are sent to a fresh worker (or, once the call's
  time is spent, ``verify_timeout`` too);
- a worker that dies is ``verify_crashed`` for the rollout it was on (``verify_timeout`` if
  RLIMIT_CPU killed it, ``verify_memory`` if it ran out of its address space);
- a malformed reply is ``verify_bad_reply`` (worker killed);
- at most ``max_restarts`` restarts per call, then ``verify_unavailable`` for what is left.

Nothing is pickled: frames are msgpack (``protocol.limits``) with a 4-byte length.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from node.child import die_with_parent
from node.learner.config import VerifyConfig
from protocol.errors import ProtocolError
from protocol.limits import Limits, packb, unpackb

__all__ = ["TASK_REASONS", "VerifierClient", "WorkerFailed"]

log = logging.getLogger(__name__)
MAX_CALL_CHARS = 8 * 1024 * 1024
"""Text per request; a round's rollouts beyond this go in further requests of the same call."""
MAX_REPLY = 64 * 1024
"""Largest reply frame accepted (one rollout's rewards take < 1 KiB)."""
_REPLY_LIMITS = Limits(max_message_bytes=MAX_REPLY, max_str=256, max_list=256, max_depth=3)
TASK_REASONS = frozenset({"bad_config", "prompt_mismatch", "unknown_family", "unvetted_family",
                          "verify_memory"})
"""Reasons a worker may give for one rollout; another well-formed one counts as ``task_error``."""
_ENV_THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                 "NUMEXPR_NUM_THREADS")}


class WorkerFailed(Exception):
    """The worker broke the protocol, died or overran; ``reason`` is the counter label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class _Worker:
    """One running worker process and its non-blocking pipes."""

    def __init__(self, config: VerifyConfig, preload_rgym: bool, module: str) -> None:
        argv = [sys.executable, "-m", module,
                "--memory-mb", str(config.memory_mb), "--cpu-s", str(config.cpu_s)]
        if preload_rgym:
            argv.append("--preload-rgym")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, **_ENV_THREADS}, close_fds=True,
                                     start_new_session=True,
                                     # it dies with the learner; started from the training
                                     # thread, which lives as long as the learner does
                                     preexec_fn=die_with_parent(signal.SIGKILL))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.fd_in = self.proc.stdin.fileno()
        self.fd_out = self.proc.stdout.fileno()
        os.set_blocking(self.fd_in, False)
        os.set_blocking(self.fd_out, False)
        self.buf = bytearray()
        self.pending = b""

    def send(self, obj: dict[str, Any]) -> None:
        data = packb(obj)
        self.pending += len(data).to_bytes(4, "big") + data

    def next_frame(self, deadline: float) -> dict[str, Any]:
        """The next reply frame, writing pending request bytes meanwhile; ``WorkerFailed``
        (``verify_timeout`` / ``verify_crashed`` / ``verify_bad_reply``) otherwise."""
        while True:
            frame = self._parse()
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerFailed("verify_timeout", "no reply within the budget")
            writers = [self.fd_in] if self.pending else []
            readable, writable, _ = select.select([self.fd_out], writers, [], remaining)
            if writable:
                try:
                    n = os.write(self.fd_in, self.pending[:1 << 16])
                except BrokenPipeError:
                    raise self._died() from None
                except BlockingIOError:
                    n = 0
                self.pending = self.pending[n:]
            if readable:
                try:
                    chunk = os.read(self.fd_out, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise self._died()
                self.buf += chunk

    def _parse(self) -> dict[str, Any] | None:
        if len(self.buf) < 4:
            return None
        n = int.from_bytes(self.buf[:4], "big")
        if n > MAX_REPLY:
            raise WorkerFailed("verify_bad_reply", f"reply frame of {n} bytes")
        if len(self.buf) < 4 + n:
            return None
        payload = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        try:
            frame = unpackb(payload, _REPLY_LIMITS)
        except ProtocolError as e:
            raise WorkerFailed("verify_bad_reply", str(e)) from None
        if not isinstance(frame, dict):
            raise WorkerFailed("verify_bad_reply", "reply is not a map")
        return frame

    def _died(self) -> WorkerFailed:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code == -signal.SIGXCPU:
            return WorkerFailed("verify_timeout", "worker exceeded its CPU limit")
        return WorkerFailed("verify_crashed", f"worker exited with {code}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


class VerifierClient:
    """Scores rollouts in a sandboxed worker; started on first use, restarted after failures."""

    def __init__(self, config: VerifyConfig, *, preload_rgym: bool = False,
                 module: str = "node.learner.verifier_worker") -> None:
        self.config = config
        self.preload_rgym = preload_rgym
        self.module = module
        """The worker's module (tests substitute one with injected faults)."""
        self._worker: _Worker | None = None
        self._call = 0
        self.starts = 0
        """Worker processes started so far (first start included)."""

    @property
    def pid(self) -> int | None:
        """Process id of the running worker, None if none runs."""
        return self._worker.proc.pid if self._worker is not None else None

    def score(self, items: list[dict[str, Any]]) -> list[tuple[float, ...] | str]:
        """Per item (``{"family", "config", "seed", "index", "prompt", "completions"}``): its
        rewards, or the reason it was rejected."""
        cfg = self.config
        results: list[tuple[float, ...] | str] = []
        deadline = time.monotonic() + cfg.call_timeout_s
        restarts = 0
        while len(results) < len(items):
            if time.monotonic() >= deadline:
                results += ["verify_timeout"] * (len(items) - len(results))
                break
            if self._worker is None:
                if self.starts and restarts >= cfg.max_restarts:
                    results += ["verify_unavailable"] * (len(items) - len(results))
                    break
                restarts += bool(self.starts)
                try:
                    self._start(deadline)
                except WorkerFailed as e:
                    log.warning("verifier worker did not start: %s", e)
                    results += ["verify_unavailable"] * (len(items) - len(results))
                    break
            self._run(items, results, deadline)
        return results

    def _start(self, deadline: float) -> None:
        self.starts += 1
        worker = _Worker(self.config, self.preload_rgym, self.module)
        try:
            frame = worker.next_frame(min(deadline, time.monotonic() + self.config.start_timeout_s))
        except WorkerFailed:
            worker.kill()
            raise
        if frame != {"ready": True}:
            worker.kill()
            raise WorkerFailed("verify_bad_reply", "worker did not say ready")
        self._worker = worker

    def _run(self, items: list[dict[str, Any]], results: list[tuple[float, ...] | str],
             deadline: float) -> None:
        """Send the items not yet answered; append replies to ``results`` until done or the
        worker fails (then it is killed and the item it was on gets the failure's reason)."""
        worker = self._worker
        assert worker is not None
        self._call += 1
        start = end = len(results)
        chars = 0
        while end < len(items) and (end == start or chars < MAX_CALL_CHARS):
            chars += len(items[end]["prompt"]) + sum(map(len, items[end]["completions"]))
            end += 1
        worker.send({"id": self._call, "items": items[start:end]})
        try:
            while True:
                item_deadline = min(deadline, time.monotonic() + self.config.rollout_timeout_s)
                frame = worker.next_frame(item_deadline)
                if len(results) == end:
                    if frame != {"id": self._call, "done": True}:
                        raise WorkerFailed("verify_bad_reply", "expected the end of the call")
                    return
                outcome = self._check(frame, len(results) - start, items[len(results)])
                results.append(outcome)
                if outcome == "verify_memory":  # the worker exits after a MemoryError
                    self._kill()
                    return
        except WorkerFailed as e:
            log.warning("verifier worker failed on rollout %d of %d: %s",
                        len(results), len(items), e)
            self._kill()
            if len(results) < end:  # a failure after the last reply blames no rollout
                results.append(e.reason)

    def _check(self, frame: dict[str, Any], i: int, item: dict[str, Any]) -> tuple[float, ...] | str:
        if frame.get("id") != self._call or frame.get("i") != i or len(frame) != 3:
            raise WorkerFailed("verify_bad_reply", f"unexpected frame {[repr(k)[:16] for k in frame][:4]}")
        if "reason" in frame:
            reason = frame["reason"]
            if not isinstance(reason, str):
                raise WorkerFailed("verify_bad_reply", "reason is not a string")
            return reason if reason in TASK_REASONS else "task_error"
        rewards = frame.get("rewards")
        if not (isinstance(rewards, list) and len(rewards) == len(item["completions"])
                and all(type(r) in (float, int) and math.isfinite(r) and 0.0 <= r <= 1.0
                        for r in rewards)):
            raise WorkerFailed("verify_bad_reply", "rewards are not one finite [0, 1] float "
                                                   "per completion")
        return tuple(float(r) for r in rewards)

    def _kill(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def close(self) -> None:
        """Kill the worker (a later ``score`` starts a new one)."""
        self._kill()
