"""One node per data dir: an advisory lock the kernel releases when its holder dies.

POSIX record locks (``lockf``), not ``flock``: a child forked by a library (hivemind's DHT
is a fork) must not inherit the lock and keep it after its parent died.

The lock file records its holder: ``<pid> <supervisor pid>``. A holder whose parent is no
longer that supervisor is an *orphan* of a node that died (its supervisor was SIGKILLed); a
node starting on the dir may take the lock back from it (``acquire(reclaim=...)``): the
orphan's process group is stopped (SIGTERM: it checkpoints; SIGKILL after ``ORPHAN_STOP_S``)
when ``reclaim(pid)`` proves it is ours (our module on this very data dir). A holder whose
supervisor is alive is a live node and is never touched.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

ORPHAN_STOP_S = 20.0
"""How long an orphan holding the lock may take to leave after SIGTERM (it finishes its
phase and checkpoints) before its process group is SIGKILLed."""


class DataDirBusy(RuntimeError):
    """Another process holds this data dir's lock."""


@dataclass(frozen=True, kw_only=True)
class Holder:
    pid: int
    supervisor: int | None
    """The pid of the supervisor that started the holder (None: the holder is a supervisor)."""

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        parts = text.split()
        try:
            return cls(pid=int(parts[0]), supervisor=int(parts[1]) if len(parts) > 1 else None)
        except (IndexError, ValueError):
            return None

    def orphaned(self) -> bool:
        """The holder is alive but its supervisor is not its parent any more (it died)."""
        parent = parent_pid(self.pid)
        return self.supervisor is not None and parent is not None and parent != self.supervisor


class DirLock:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, *, wait_s: float = 0.0, supervisor: int | None = None,
                reclaim: Callable[[int], bool] | None = None,
                orphan_stop_s: float = ORPHAN_STOP_S) -> DirLock:
        """Take the lock, waiting up to ``wait_s`` for it; ``DataDirBusy`` otherwise.

        ``supervisor``: the pid of the supervisor that started us (recorded for the next
        node). ``reclaim(pid)``: whether an orphaned holder is provably ours to stop; it gets
        ``orphan_stop_s`` after SIGTERM before SIGKILL."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (BlockingIOError, PermissionError):
                holder = Holder.parse(os.pread(fd, 64, 0).decode(errors="replace"))
                if (holder is not None and reclaim is not None and holder.orphaned()
                        and reclaim(holder.pid)):
                    self._stop_orphan(fd, holder, orphan_stop_s)
                    continue
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise DataDirBusy(self._busy_message(holder)) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        record = f"{os.getpid()}" + (f" {supervisor}" if supervisor is not None else "")
        os.pwrite(fd, record.encode(), 0)
        self._fd = fd
        return self

    def _busy_message(self, holder: Holder | None) -> str:
        who = f"pid {holder.pid}" if holder is not None else "pid ?"
        if holder is not None and holder.supervisor is not None:
            state = "gone" if holder.orphaned() else "alive"
            who += f", started by supervisor pid {holder.supervisor} ({state})"
        return (f"{self.path.parent} is in use by another node ({who}); stop it first or use "
                "another --data-dir")

    def _stop_orphan(self, fd: int, holder: Holder, stop_s: float) -> None:
        """SIGTERM the orphan's process group, wait for the lock up to ``stop_s``, then
        SIGKILL the group and wait for the kernel to release the lock."""
        pgid = holder.pid if _pgid(holder.pid) == holder.pid else None  # our children lead one
        log.warning("%s is held by pid %d, an orphan of a node whose supervisor (pid %s) is "
                    "gone: stopping it (SIGTERM, SIGKILL after %.0f s) and taking the data dir "
                    "back", self.path, holder.pid, holder.supervisor, stop_s)
        _signal(holder.pid, pgid, signal.SIGTERM)
        if self._wait_free(fd, stop_s):
            return
        log.warning("orphan pid %d did not leave within %.0f s: killing it", holder.pid, stop_s)
        _signal(holder.pid, pgid, signal.SIGKILL)
        self._wait_free(fd, 10.0)

    @staticmethod
    def _wait_free(fd: int, timeout_s: float) -> bool:
        """Whether the lock became free within ``timeout_s`` (tested, not taken)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except (BlockingIOError, PermissionError):
                time.sleep(0.2)
                continue
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return True
        return False

    def release(self) -> None:
        if self._fd is not None:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def lock_holder(path: Path) -> int | None:
    """The pid holding ``path``'s lock, tested without taking it (``F_GETLK``: a reader that
    took the lock even for a moment could make a node starting then fail); None if free or
    there is no lock file. Linux ``struct flock`` layout."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        query = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        l_type, _, _, _, pid = struct.unpack("@hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)
    return None if l_type == fcntl.F_UNLCK else pid


def _signal(pid: int, pgid: int | None, sig: int) -> None:
    try:
        if pgid is not None:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_pid(pid: int) -> int | None:
    """The parent of a live process (None: gone, a zombie, or no /proc)."""
    fields = _stat(pid)
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[1])


def _pgid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields is not None else None


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def module_data_dir(argv: list[str]) -> tuple[str, Path] | None:
    """For ``python -m MODULE --config-json '{"data_dir": ...}'`` (our children and the forks
    they make): the module and the resolved data dir; None for anything else."""
    try:
        module = argv[argv.index("-m") + 1]
        config = json.loads(argv[argv.index("--config-json") + 1])
        return module, Path(config["data_dir"]).resolve()
    except (ValueError, IndexError, KeyError, TypeError, OSError):
        return None
