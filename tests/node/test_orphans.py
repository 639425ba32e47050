"""A child whose supervisor is gone notices it and never raises on its dead event pipe."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

from node.child import watch_parent
from node.learner_process import EventPipe


def test_a_closed_event_pipe_drops_lines_instead_of_raising():
    r, w = os.pipe()
    os.close(r)  # the supervisor died
    events = EventPipe(os.fdopen(w, "w", buffering=1))
    events.write('{"event": "round"}\n')  # the BrokenPipeError that skipped the reaping
    events.write('{"event": "phase"}\n')
    assert events.broken


def test_watch_parent_notices_a_broken_pipe():
    gone = threading.Event()
    reasons = []
    watch_parent(os.getppid(), on_gone=lambda why: (reasons.append(why), gone.set()),
                 broken=lambda: True, poll_s=0.01)
    assert gone.wait(5)
    assert reasons == [f"the pipe to the supervisor (pid {os.getppid()}) is closed"]


def test_watch_parent_notices_the_parent_dying():
    """A grandchild whose parent is SIGKILLed says so (it is re-parented)."""
    child = textwrap.dedent("""
        import os, sys, threading
        from node.child import watch_parent
        gone = threading.Event()
        watch_parent(os.getppid(), on_gone=lambda why: (print(why, flush=True), gone.set()),
                     poll_s=0.05)
        print("watching", flush=True)
        sys.exit(0 if gone.wait(30) else 1)
    """)
    parent = textwrap.dedent("""
        import subprocess, sys, time
        c = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
        time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", parent, child], stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline().strip() == b"watching"
        p.kill()
        p.wait()
        assert p.stdout.readline().decode().strip() == f"the supervisor (pid {p.pid}) is gone"
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
