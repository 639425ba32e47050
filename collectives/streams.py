"""Length-prefixed frames on hivemind p2p binary streams, with a size limit on read."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.errors import ProtocolError
from protocol.limits import packb, unpackb

__all__ = ["send_frame", "recv_frame", "send_header", "recv_header", "FrameError"]

HEADER_LEN = 8
MAX_HEADER_BYTES = 64 * 1024


class FrameError(ValueError):
    """A frame that is too long or a header that does not decode to a map."""


async def send_frame(writer: asyncio.StreamWriter, data: bytes) -> int:
    writer.write(len(data).to_bytes(HEADER_LEN, "big"))
    view = memoryview(data)
    for offset in range(0, len(view), 1 << 20):
        writer.write(view[offset : offset + (1 << 20)])
        await writer.drain()
    await writer.drain()
    return HEADER_LEN + len(data)


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
