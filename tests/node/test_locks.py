"""The data-dir lock: an orphan of a dead node is stopped and the lock taken; a live node's
holder never is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from node.locks import DataDirBusy, DirLock, parent_pid

HOLDER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from node.locks import DirLock
    if sys.argv[2] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    DirLock(Path(sys.argv[1])).acquire(supervisor=os.getppid())
    print("held", flush=True)
    time.sleep(120)
""")
SUPERVISOR = textwrap.dedent("""
    import subprocess, sys, time
    holder = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]],
                              stdout=subprocess.PIPE, start_new_session=True)
    assert holder.stdout.readline().strip() == b"held"
    print(holder.pid, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def node(tmp_path):
    """(supervisor, holder pid, lock path); the holder leads its own process group, as the
    supervisor's children do. Both are killed at the end, whatever the test did."""
    started = []

    def start(on_sigterm: str):
        path = tmp_path / "learner.lock"
        sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, HOLDER, str(path), on_sigterm],
                               stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH":
                                                            os.pathsep.join(sys.path)})
        holder = int(sup.stdout.readline())
        started.append((sup, holder))
        return sup, holder, path

    yield start
    for sup, holder in started:
        for kill in (lambda: sup.kill(), lambda: os.kill(holder, signal.SIGKILL)):
            try:
                kill()
            except ProcessLookupError:
                pass
        sup.wait()
        sup.stdout.close()


def _gone(pid: int) -> bool:
    return parent_pid(pid) is None


@pytest.mark.parametrize("on_sigterm", ["exit", "ignore"])
def test_an_orphan_holding_the_lock_is_stopped_and_the_lock_taken(node, on_sigterm):
    sup, holder, path = node(on_sigterm)
    sup.kill()
    sup.wait()
    lock = DirLock(path).acquire(reclaim=lambda pid: pid == holder, orphan_stop_s=1.0)
    try:
        assert _gone(holder)
        assert path.read_text().split()[0] == str(os.getpid())
    finally:
        lock.release()


def test_a_live_nodes_holder_is_never_stopped(node):
    sup, holder, path = node("exit")
    with pytest.raises(DataDirBusy, match=rf"pid {holder}, started by supervisor pid "
                                          rf"{sup.pid} \(alive\)"):
        DirLock(path).acquire(reclaim=lambda pid: True, orphan_stop_s=1.0)
    assert parent_pid(holder) == sup.pid


def test_an_orphan_that_is_not_provably_ours_is_left_alone(node):
    sup, holder, path = node("exit")
    sup.kill()
    sup.wait()
    with pytest.raises(DataDirBusy, match=r"\(gone\)"):
        DirLock(path).acquire(reclaim=lambda pid: False)
    assert not _gone(holder)
