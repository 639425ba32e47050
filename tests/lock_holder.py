"""Another process holding a node's lock file, as a running node does."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Iterator

__all__ = ["held_lock"]


@contextlib.contextmanager
def held_lock(path: Path) -> Iterator[int]:
    """A child process holds ``path`` (``node.locks.DirLock``) while the block runs; its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from node.locks import DirLock; DirLock(Path(sys.argv[1])).acquire(); "
         "print('held', flush=True); time.sleep(60)", str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
