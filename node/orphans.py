"""A learner whose node died: leaving in bounded time, and what a dead node left behind.

A supervisor killed with SIGKILL (or a whole process group, or a power cut) leaves its
learner orphaned. The learner notices (``node.child.watch_parent``), stops as on SIGTERM
(finish the phase, checkpoint) but within ``ORPHAN_GRACE_S`` (``leave_orphaned``), and ends
its own children on the way out (``reap_children``: hivemind's DHT fork and p2pd have no
parent-death signal). A node that starts on the same data dir takes the lock back from an
orphan (``node.locks``, with ``is_learner_on``) and, holding it, kills whatever of the dead
node is still running there (``sweep_leftovers``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

from node.child import child_pids

__all__ = ["EXIT_ORPHANED", "ORPHAN_GRACE_S", "is_learner_on", "leave_orphaned",
           "reap_children", "sweep_leftovers"]

log = logging.getLogger("node.orphans")

EXIT_ORPHANED = 4
"""Exit code of a learner whose supervisor died and that did not leave within
``ORPHAN_GRACE_S`` (nobody reads it; for the log)."""
ORPHAN_GRACE_S = 15.0
"""A learner whose supervisor is gone finishes its phase, checkpoints and leaves; after this
long it kills its children (hivemind's DHT process, p2pd) and exits without more ado."""


def reap_children(timeout_s: float = 5.0) -> None:
    """End what hivemind left running. Its DHT is a multiprocessing child that does not always
    stop on ``shutdown()``; at interpreter exit multiprocessing joins it with no timeout, and a
    stopped learner then hung forever (seen as learners killed after the 60 s stop deadline,
    and as orphans after their supervisor died). Then any other child still running (p2pd,
    which hivemind starts without a parent-death signal; the verifier worker): SIGTERM, and
    SIGKILL after ``timeout_s``."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
        child.join(timeout_s)
        if child.is_alive():
            log.warning("child %s (pid %s) ignored SIGTERM; killing it", child.name, child.pid)
            child.kill()
            child.join(timeout_s)
    _signal_all(child_pids(os.getpid()), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while child_pids(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = child_pids(os.getpid())
    if left:
        log.warning("children %s ignored SIGTERM; killing them", left)
        _signal_all(left, signal.SIGKILL)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def leave_orphaned(reason: str, stop: threading.Event) -> None:
    """Our supervisor is gone (nobody will read our events or bound our stop): leave as on
    SIGTERM (phase, checkpoint), but within ORPHAN_GRACE_S, whatever the way out waits on."""
    log.warning("%s: finishing the phase, checkpointing and leaving (at most %.0f s)",
                reason, ORPHAN_GRACE_S)
    stop.set()
    timer = threading.Timer(ORPHAN_GRACE_S, _die_orphaned, args=(reason,))
    timer.daemon = True
    timer.start()


def _die_orphaned(reason: str) -> None:
    log.error("%s and this learner did not leave within %.0f s: killing its children and "
              "exiting", reason, ORPHAN_GRACE_S)
    _signal_all(child_pids(os.getpid()), signal.SIGKILL)
    os._exit(EXIT_ORPHANED)


def is_learner_on(pid: int, data_dir: Path) -> bool:
    """``pid`` runs this module on ``data_dir`` (a lock holder we may stop when orphaned)."""
    from node.locks import cmdline, module_data_dir

    return module_data_dir(cmdline(pid)) == ("node.learner_process", data_dir.resolve())


def sweep_leftovers(data_dir: Path, supervisor: int) -> None:
    """With the learner lock held, no live learner uses ``data_dir`` but us: a process that
    still runs this module on it (hivemind's DHT fork of a SIGKILLed learner) or a p2pd with
    its identity key is a leftover of a dead node; SIGKILL it."""
    from collectives.transport import IDENTITY_FILE
    from node.locks import cmdline, parent_pid

    key = (data_dir / IDENTITY_FILE).resolve()
    me = os.getpid()
    leftovers = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        argv = cmdline(pid)
        if is_learner_on(pid, data_dir):
            ours = parent_pid(pid) not in (supervisor, me)
        else:
            ours = bool(argv) and os.path.basename(argv[0]) == "p2pd" and any(
                a.startswith("-id=") and Path(a[4:]).resolve() == key for a in argv)
        if ours:
            leftovers.append(pid)
    if leftovers:
        log.warning("%s: killing processes left by a node that died: %s", data_dir,
                    ", ".join(f"{pid} ({os.path.basename(cmdline(pid)[0]) if cmdline(pid) else '?'})"
                              for pid in leftovers))
        _signal_all(leftovers, signal.SIGKILL)
