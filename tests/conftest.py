"""Session-wide checks of the whole suite.

No p2pd may outlive the session. hivemind's p2pd dies when the read end of its stdout pipe
closes, i.e. with the process that started it, unless a forked child of that process (hivemind's
DHT process) still holds the pipe: a process with a ``Transport`` that gets SIGKILL without its
process group leaves its p2pd and DHT child running, orphaned, for good. Every process this
session starts inherits ``RUN_MARK`` in its environment (hivemind hands p2pd a copy of it), so
at the end the daemons of this session are told apart from other users' (their /proc environ
lacks the mark). Teardowns end daemons asynchronously: the check waits up to ``GRACE_S``.
Leftovers are killed (with the orphans of this session) and fail the session.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

RUN_MARK = "SWARM_NODE_TEST_RUN"
GRACE_S = 20.0


def _marked(mark: str) -> dict[int, tuple[int, str]]:
    """pid -> (ppid, argv) of live processes whose environment carries ``RUN_MARK=mark``."""
    want = f"{RUN_MARK}={mark}".encode()
    found: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if want not in (d / "environ").read_bytes().split(b"\0"):
                continue
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        found[int(d.name)] = (ppid, argv.strip())
    return found


def _is_p2pd(argv: str) -> bool:
    return os.path.basename(argv.split(" ", 1)[0]) == "p2pd"


def _descends_from(pid: int, root: int, procs: dict[int, tuple[int, str]]) -> bool:
    seen = set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        pid = procs[pid][0]
        if pid == root:
            return True
    return pid == root


@pytest.fixture(scope="session", autouse=True)
def no_p2pd_survives_the_session():
    if not Path("/proc/self/environ").exists():  # not Linux: nothing to check with
        yield
        return
    mark = uuid.uuid4().hex
    old = os.environ.get(RUN_MARK)
    os.environ[RUN_MARK] = mark
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(RUN_MARK, None)
        else:
            os.environ[RUN_MARK] = old
        me = os.getpid()
        end = time.monotonic() + GRACE_S
        while True:
            procs = _marked(mark)
            left = {p: v for p, v in procs.items() if _is_p2pd(v[1])}
            if not left or time.monotonic() > end:
                break
            time.sleep(0.5)
        if left:
            # our orphans (reparented away from this process tree: e.g. the DHT child that
            # holds the daemon's pipe) go with them
            orphans = {p: v for p, v in procs.items()
                       if p != me and not _descends_from(p, me, procs)}
            for pid in {**orphans, **left}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            lines = "\n".join(f"  pid {p} (ppid {pp}): {argv[:300]}"
                              for p, (pp, argv) in sorted({**orphans, **left}.items()))
            pytest.fail(f"{len(left)} p2pd of this test session outlived it by {GRACE_S:.0f} s "
                        f"(killed now, with this session's orphans):\n{lines}", pytrace=False)


LANES = ("swarms", "rest")
REST_LANE_SLOW = ("tests/collectives/", "tests/learner/test_memory.py")
"""Slow tests that go in the ``rest`` lane: the collectives' multi-process tests spend most
of their time waiting on their clocks (test_clock.py alone: 58 % of both cores idle), the
memory test uses one thread."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", choices=LANES, default=None,
                     help="run one lane of the suite (tests/lanes.py runs both at once): "
                          "'swarms' = the CPU-heavy multi-process tests (slow, but not "
                          f"{', '.join(REST_LANE_SLOW)}); 'rest' = every other test")


def in_swarms_lane(item: pytest.Item) -> bool:
    return (item.get_closest_marker("slow") is not None
            and not item.nodeid.startswith(REST_LANE_SLOW))


IMAGE_TEST = "tests/deploy/test_image_build.py::"


LAST = ("tests/adversary/test_feed_eclipse.py::", "tests/e2e/test_local_swarm.py::",
        IMAGE_TEST)
"""Run after everything else, in this order. The feed farm (70 s): run first in its lane, it moved
every later test 70 s on, and tests/wan/test_nat.py, whose checks hang on how loaded the box is
while it runs, failed 3 of 4 fresh-clone runs. The image test: its build starts at collection
(below) and takes minutes; run third in the swarms lane (its own order), the test waited 410 s
for it in a fresh-clone run. The local swarm: its rounds are stretched to 10x their compute
([learner] slowdown_for_tests; when that was their wall time, a loaded CPU stretched them 10x as
much: 478 s beside the rest lane in a fresh-clone run, 99-122 s alone); last, the rest lane is
done."""


def _last(item: pytest.Item) -> int:
    return next((k + 1 for k, prefix in enumerate(LAST) if item.nodeid.startswith(prefix)), 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--lane``: keep that lane's tests; then the LAST ones go last."""
    lane = config.getoption("--lane")
    keep, drop = [], []
    for item in items:
        (keep if lane is None or in_swarms_lane(item) == (lane == "swarms") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = sorted(keep, key=_last)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the image test's build (tools, base image, wheelhouse, `podman build`: minutes,
    mostly downloads and a niced build) now, on a thread, when that test is selected: it then
    overlaps the tests that run before it instead of adding its whole length to the suite."""
    if session.config.option.collectonly:
        return
    if any(item.nodeid.startswith(IMAGE_TEST) for item in session.items):
        from tests.deploy.podman import IMAGE_BUILD

        IMAGE_BUILD.start()
