"""One node per data dir: an advisory lock the kernel releases when its holder dies.

POSIX record locks (``lockf``), not ``flock``: a child forked by a library (hivemind's DHT
is a fork) must not inherit the lock and keep it after its parent died.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class DataDirBusy(RuntimeError):
    """Another process holds this data dir's lock."""


class DirLock:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, *, wait_s: float = 0.0) -> DirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (BlockingIOError, PermissionError):
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    os.close(fd)
                    raise DataDirBusy(f"{self.path.parent} is in use by another node "
                                      f"(pid {holder}); stop it first or use another "
                                      "--data-dir") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
