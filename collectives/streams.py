"""Length-prefixed frames on hivemind p2p binary streams, with a size limit on read.

``send_pipelined`` / ``recv_pipelined`` move a shard as a sequence of chunk frames while the
codec work runs in a small thread pool (numpy and torch release the GIL): chunk c+1 is
encoded while chunk c is on the wire, and chunk c is decoded while chunk c+1 arrives, so the
event loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections import deque
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Iterable

from protocol.errors import ProtocolError
from protocol.limits import packb, unpackb

__all__ = ["send_frame", "recv_frame", "send_header", "recv_header", "FrameError",
           "send_pipelined", "recv_pipelined", "work_pool", "send_tagged", "recv_tagged",
           "CHUNK", "VERDICT", "cancel_all"]

HEADER_LEN = 8
MAX_HEADER_BYTES = 64 * 1024
PREFETCH = 2
"""Chunks encoded ahead of the one being sent."""
CHUNK, VERDICT = b"c", b"v"
"""Tags of a tagged frame: a chunk of a shard, or a header that ends a chunk sequence."""
RECANCEL_S = 0.1
"""``cancel_all``: between two cancels of a task that has not ended."""
_POOL: ThreadPoolExecutor | None = None


def work_pool() -> Executor:
    """The process's codec/reduce thread pool (created on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                   thread_name_prefix="collectives-work")
    return _POOL


async def cancel_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has ended (what they raised is theirs: retrieved
    here, not logged as never retrieved).

    Cancelled again every ``RECANCEL_S`` until it ends: Python 3.11's ``asyncio.wait_for``
    swallows a cancellation that arrives as its inner future completes (it returns the
    result; fixed in 3.12), and a task that lost its cancel that way ran on to its next
    deadline (measured: a reducer's sender, 60 s, holding its stream handler)."""
    pending = set(tasks)
    while pending:
        for t in pending:
            t.cancel()
        done, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        for t in done:
            if not t.cancelled():
                t.exception()


class FrameError(ValueError):
    """A frame that is too long or a header that does not decode to a map."""


async def send_frame(writer: asyncio.StreamWriter, data: bytes | memoryview) -> int:
    writer.write(len(data).to_bytes(HEADER_LEN, "big"))
    return HEADER_LEN + await send_frame_body(writer, data)


async def recv_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    length = int.from_bytes(await reader.readexactly(HEADER_LEN), "big")
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds {max_bytes}")
    return await reader.readexactly(length)


async def send_header(writer: asyncio.StreamWriter, header: dict[str, Any]) -> int:
    return await send_frame(writer, packb(header))


async def recv_header(reader: asyncio.StreamReader) -> dict[str, Any]:
    data = await recv_frame(reader, MAX_HEADER_BYTES)
    try:
        obj = unpackb(data)
    except ProtocolError as e:
        raise FrameError(f"header does not decode: {e}") from e
    if not isinstance(obj, dict):
        raise FrameError("header is not a map")
    return obj


def _when_done(on_done: Callable[[int], None], c: int, fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        on_done(c)


async def send_pipelined(writer: asyncio.StreamWriter, jobs: list[Callable[[], bytes]]) -> int:
    """Send one frame per job's bytes, in order; up to ``PREFETCH`` jobs run ahead."""
    loop = asyncio.get_running_loop()
    pending: deque[asyncio.Future[bytes]] = deque()
    todo = iter(jobs)
    sent = 0
    try:
        for job in todo:
            pending.append(loop.run_in_executor(work_pool(), job))
            if len(pending) > PREFETCH:
                sent += await send_frame(writer, await pending.popleft())
        while pending:
            sent += await send_frame(writer, await pending.popleft())
    finally:
        for fut in pending:
            fut.cancel()
    return sent


async def send_tagged(writer: asyncio.StreamWriter, tag: bytes, data: bytes) -> int:
    """One frame of ``tag`` (1 byte) + ``data``, without joining them in memory."""
    writer.write((len(data) + 1).to_bytes(HEADER_LEN, "big"))
    writer.write(tag)
    return await send_frame_body(writer, data) + HEADER_LEN + 1


async def send_frame_body(writer: asyncio.StreamWriter, data: bytes | memoryview) -> int:
    view = memoryview(data)
    for offset in range(0, len(view), 1 << 20):
        writer.write(view[offset : offset + (1 << 20)])
        await writer.drain()
    await writer.drain()
    return len(data)


async def recv_tagged(reader: asyncio.StreamReader, max_bytes: int) -> tuple[bytes, memoryview]:
    """(tag, body) of a tagged frame whose body is at most ``max_bytes``."""
    data = await recv_frame(reader, max_bytes + 1)
    if not data:
        raise FrameError("empty tagged frame")
    return data[:1], memoryview(data)[1:]


async def recv_pipelined(reader: asyncio.StreamReader, sizes: list[int],
                         sink: Callable[[int, bytes], None], *,
                         on_done: Callable[[int], None] | None = None) -> int:
    """Read one frame per entry of ``sizes`` (frame c at most ``sizes[c]`` bytes) and run
    ``sink(c, data)`` in the pool while the next frame arrives; the sinks' first error is
    raised after every frame was read. Returns the bytes read."""
    loop = asyncio.get_running_loop()
    futs: list[asyncio.Future[None]] = []
    got = 0
    try:
        for c, size in enumerate(sizes):
            data = await recv_frame(reader, size)
            got += HEADER_LEN + len(data)
            fut = loop.run_in_executor(work_pool(), sink, c, data)
            if on_done is not None:  # runs on the loop, once chunk c is in place
                fut.add_done_callback(functools.partial(_when_done, on_done, c))
            futs.append(fut)
        for fut in futs:
            await fut
    finally:
        for fut in futs:
            fut.cancel()
    return got
