"""A child process of the supervisor: start, read its JSON event lines, stop, restart.

Children are fresh interpreters (`python -m ...`), never forks of a process that imported
torch, hivemind or libp2p. Each prints JSON event lines on stdout (``{"event": ...}``) and
logs on stderr (passed through to ours); the events are protocol/events.py's. No pickle
crosses: config goes in as JSON.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from protocol.events import ChildEvent, EventError, Exit, parse_event

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
SUPERVISOR_ENV = "SWARM_NODE_SUPERVISOR_PID"
"""Set in every child's environment: the pid of the process that started it. A child whose
parent is no longer that pid is an orphan (``watch_parent``, node.locks)."""


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn``: Linux sends the child ``sig`` when its parent (us) dies, even by
    SIGKILL. ``prctl`` is looked up here, in the parent: the forked child of a threaded
    process should do as little as it can before exec.

    Caveats: the signal comes when the parent *thread* that started the child exits, so start
    children that use it from a thread that lives as long as the process (the main thread);
    and the parent may have died before prctl ran, so the child checks it still is ours."""
    parent = os.getpid()
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None  # not Linux: children notice the closed pipe / socket instead

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # died before prctl: no signal will come
            os._exit(1)

    return preexec


def supervisor_pid() -> int:
    """In a child: the pid of the supervisor that started it (its parent when it started)."""
    try:
        return int(os.environ[SUPERVISOR_ENV])
    except (KeyError, ValueError):
        return os.getppid()


def watch_parent(parent: int, *, on_gone: Callable[[str], None],
                 broken: Callable[[], bool] = lambda: False, poll_s: float = 0.5) -> threading.Thread:
    """Call ``on_gone(reason)`` once, from a daemon thread, when ``parent`` is no longer our
    parent (it died and we were re-parented) or ``broken()`` says the pipe to it is closed.
    A second line besides the parent-death signal, which a busy child may only note."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                on_gone(f"the supervisor (pid {parent}) is gone")
                return
            if broken():
                on_gone(f"the pipe to the supervisor (pid {parent}) is closed")
                return
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True, kw_only=True)
class Event:
    """An event of the child named ``child`` (protocol/events.py)."""

    child: str
    event: ChildEvent


@dataclass
class Child:
    """One managed child. Events land on the shared ``events`` queue, tagged with ``name``."""

    name: str
    argv: list[str]
    events: queue.Queue[Event]
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    crashes: deque[float] = field(default_factory=deque)
    stderr_sink: Callable[[str, str], None] | None = None
    """``sink(name, line)`` for each line the child writes on stderr; None: our stderr."""
    _reader: threading.Thread | None = None

    def start(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[SUPERVISOR_ENV] = str(os.getpid())
        stderr = subprocess.PIPE if self.stderr_sink is not None else None
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=stderr,
                                     stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True,  # our signals are ours to forward
                                     preexec_fn=die_with_parent())
        self._reader = threading.Thread(target=self._read, args=(self.proc,),
                                        name=f"{self.name}-stdout", daemon=True)
        self._reader.start()
        if self.stderr_sink is not None:
            threading.Thread(target=self._read_stderr, args=(self.proc, self.stderr_sink),
                             name=f"{self.name}-stderr", daemon=True).start()
        log.info("started %s (pid %d)", self.name, self.proc.pid)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                event = parse_event(line)
            except EventError as e:  # our own child's bug: say so, do not act on it
                log.warning("%s: malformed event (%s): %s", self.name, e, line[:300])
                continue
            if event is not None:
                self.events.put(Event(child=self.name, event=event))
            else:
                log.info("%s: %s", self.name, line)
        proc.stdout.close()
        proc.wait()
        kill_group(proc.pid)
        self.events.put(Event(child=self.name, event=Exit(code=proc.returncode, pid=proc.pid)))

    def _read_stderr(self, proc: subprocess.Popen[bytes], sink: Callable[[str, str], None]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                sink(self.name, line)
        proc.stderr.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", self.name, timeout_s)
            # its whole session, now: the reader thread reaps the group only at EOF on the
            # child's stdout, which hivemind's forked DHT process holds open, and that
            # process keeps p2pd's pipe open too: both would outlive us, orphaned
            kill_group(self.proc.pid)
            return self.proc.wait()

    def record_crash(self, *, window_s: float, now: float | None = None) -> int:
        """Remember a crash; return how many fell inside the window."""
        now = time.monotonic() if now is None else now
        self.crashes.append(now)
        while self.crashes and self.crashes[0] < now - window_s:
            self.crashes.popleft()
        return len(self.crashes)


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (Linux /proc; [] elsewhere)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != b"Z":
            out.append(int(entry))
    return out


def kill_group(pgid: int) -> None:
    """Reap what the child left behind in its session (hivemind's forked DHT process, p2pd)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
