"""Startup: an OuterLoop built off the training thread, taken when up, abandoned on leaving."""

from __future__ import annotations

import os
import threading
import time

import pytest

from collectives import OuterConfig, StartCancelled, Startup
from collectives.config import TransportConfig
from protocol import Identity


class FakeLoop:
    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def _build(loop: FakeLoop, go: threading.Event, *, honour_abort: bool = True):
    """A build that finishes when ``go`` is set (or gives up on abort, like OuterLoop)."""
    def build(abort: threading.Event) -> FakeLoop:
        while not go.wait(0.01):
            if honour_abort and abort.is_set():
                raise StartCancelled("abandoned")
        return loop
    return build


def test_take_is_none_while_building_then_the_loop() -> None:
    loop, go = FakeLoop(), threading.Event()
    s = Startup(_build(loop, go))  # type: ignore[arg-type]
    assert s.take() is None and not s.done()
    go.set()
    assert s.wait(5)
    assert s.take() is loop and s.take() is None  # handed over once
    assert s.cancel(timeout=5) and not loop.closed.is_set()  # taken: the taker closes it


def test_a_failed_build_raises_on_the_taker() -> None:
    def build(abort: threading.Event) -> FakeLoop:
        raise OSError("p2pd would not start")

    s = Startup(build)  # type: ignore[arg-type]
    assert s.wait(5)
    with pytest.raises(OSError, match="p2pd"):
        s.take()


def test_cancel_abandons_a_build_in_progress_promptly() -> None:
    loop, go = FakeLoop(), threading.Event()
    s = Startup(_build(loop, go))  # type: ignore[arg-type]
    t = time.monotonic()
    assert s.cancel(timeout=5)
    assert time.monotonic() - t < 1
    with pytest.raises(StartCancelled):
        s.take()
    assert not loop.closed.is_set()  # never built


def test_a_loop_built_but_not_taken_is_closed_on_cancel() -> None:
    loop, go = FakeLoop(), threading.Event()
    go.set()
    s = Startup(_build(loop, go))  # type: ignore[arg-type]
    assert s.wait(5)
    assert s.cancel(timeout=5)
    assert loop.closed.is_set()


def test_a_loop_finished_after_cancel_gave_up_is_closed_by_its_thread() -> None:
    loop, go = FakeLoop(), threading.Event()
    s = Startup(_build(loop, go, honour_abort=False))  # type: ignore[arg-type]
    assert not s.cancel(timeout=0.1)  # stuck where it cannot look at abort
    go.set()
    assert loop.closed.wait(5)


def _p2pd_children() -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid() and b"p2pd" in cmd:
            out.append(int(d))
    return out


@pytest.mark.parametrize("after_p2pd_s", [0.0, 0.5, 2.0])
def test_an_abandoned_transport_start_leaves_no_process(tmp_path, after_p2pd_s) -> None:
    """Abort once p2pd was spawned (mid-start), or later (probe, DHT, or done): the start
    ends within seconds and no p2pd or DHT process of ours is left."""
    from collectives.transport import Transport

    abort = threading.Event()
    outcome: list[object] = []

    def start() -> None:
        try:
            outcome.append(Transport(OuterConfig(transport=TransportConfig(startup_timeout_s=60)),
                                     identity=Identity.generate(), data_dir=str(tmp_path),
                                     initial_peers=[], abort=abort))
        except BaseException as e:  # noqa: BLE001 - inspected below
            outcome.append(e)

    before = set(_p2pd_children())
    thread = threading.Thread(target=start)
    thread.start()
    deadline = time.monotonic() + 60
    while not set(_p2pd_children()) - before and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(after_p2pd_s)
    abort.set()
    t = time.monotonic()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - t < 10
    (result,) = outcome
    if not isinstance(result, BaseException):
        result.close()  # type: ignore[attr-defined]  # it was up before the abort: ours to close
    else:
        assert isinstance(result, StartCancelled), repr(result)
    import multiprocessing

    assert not [c for c in multiprocessing.active_children() if c.is_alive()]
    deadline = time.monotonic() + 10
    while set(_p2pd_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(_p2pd_children()) - before


def test_a_start_that_swallowed_its_cancel_has_its_result_discarded() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the result of an inner future that completed
    as it was cancelled: ``P2P.create`` then ran to the end although abandoned, and its p2pd
    outlived the start (a fresh-clone CI run). What such a start returns is ended."""
    import asyncio

    from collectives.transport import _abortable

    abort, discarded = threading.Event(), []

    async def make() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "p2pd"  # swallowed, as wait_for does
        return "never"

    async def discard(x: str) -> None:
        discarded.append(x)

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.2, abort.set)
        await _abortable(make, "p2pd start", 30, abort=abort, discard=discard)

    with pytest.raises(StartCancelled, match="p2pd start"):
        asyncio.run(main())
    assert discarded == ["p2pd"]
    discarded.clear()
    abort.clear()

    async def timed_out() -> None:
        await _abortable(make, "p2pd start", 0.2, abort=abort, discard=discard)

    with pytest.raises(TimeoutError, match="p2pd start"):
        asyncio.run(timed_out())
    assert discarded == ["p2pd"]
