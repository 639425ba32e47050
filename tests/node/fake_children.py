"""Tiny real child programs for the supervisor's process-management tests.

They speak the same JSON-event protocol as the real swarm and learner children but do no
networking or training, so restart and signal handling can be tested in isolation. The
end-to-end behaviour with real children is covered in tests/test_e2e_*.py.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from protocol.events import ChildEvent, Done, Fatal, Ready, RoundDone, Started


def emit(event: ChildEvent) -> None:
    print(event.line(), flush=True)


def swarm() -> None:
    emit(Ready(peer_id="12D3KooWfake", addrs=["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWfake"]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.1)


def learner(rounds: int, crash_file: str, crash_at: int) -> None:
    """Runs `rounds` rounds; crashes (exit 7) at round `crash_at` once per line in crash_file."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    emit(Started(model="fake-model"))
    path = Path(crash_file)
    for r in range(rounds):
        if stop:
            break
        if r == crash_at and path.exists() and path.read_text().strip():
            lines = path.read_text().splitlines()
            path.write_text("\n".join(lines[1:]))
            sys.exit(7)
        emit(RoundDone(record={"round": r, "mean_reward": 0.1 * r, "rollouts_published": 1}))
        time.sleep(0.05)
    emit(Done(rounds=rounds))


def fatal_learner() -> None:
    emit(Fatal(error="cannot load model 'nope'"))
    sys.exit(2)



def stuck_learner() -> None:
    """Ignores SIGTERM, like a learner stuck inside a library call."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    emit(Started(model="stuck"))
    emit(RoundDone(record={"round": 0, "mean_reward": 0.0}))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    if sys.argv[1] == "swarm":
        swarm()
    elif sys.argv[1] == "stuck":
        stuck_learner()
    elif sys.argv[1] == "fatal":
        fatal_learner()
    else:
        learner(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
