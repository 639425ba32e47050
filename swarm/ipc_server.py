"""The Unix-socket server the learner (node.ipc_client.SocketBridge) talks to.

One request, one response, in order, per connection (frames: protocol.ipc). The server knows
nothing of the ops: it decodes a Request, awaits ``handler(request)`` and encodes the result.
A malformed frame closes that connection (counted as ``rejected_ipc_malformed``); an error
inside the handler becomes an error response; neither ever stops the node.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from protocol import ProtocolError
from protocol.ipc import (
    HEADER,
    IpcError,
    Request,
    Response,
    decode_frame,
    encode_frame,
    frame_length,
)
from swarm.errors import ListenError

__all__ = ["Handler", "RequestError", "serve_ipc"]

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Any]]


class RequestError(Exception):
    """Raised by a handler for a request it refuses; the message goes back to the learner."""


async def serve_ipc(path: str, handler: Handler, counters: collections.Counter[str], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``path`` (mode 0600) until cancelled; the socket file is removed on exit."""
    _remove_stale(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on IPC socket {path}: {e.strerror}") from None
    try:
        os.chmod(path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        async with listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                nursery.start_soon(_serve_connection, stream, handler, counters)
    finally:
        sock.close()
        try:
            os.unlink(path)
        except OSError:
            pass


def _remove_stale(path: str) -> None:
    """Remove a socket file left by a killed process; refuse one that a live process serves."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ListenError(f"IPC path {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: stale
        return
    finally:
        probe.close()
    raise ListenError(f"IPC socket {path} is in use by another process")


async def _serve_connection(stream: trio.SocketStream, handler: Handler,
                            counters: collections.Counter[str]) -> None:
    buf = bytearray()
    async with stream:
        try:
            while True:
                header = await _read_exactly(stream, buf, HEADER.size)
                if header is None:
                    return
                payload = await _read_exactly(stream, buf, frame_length(header))
                if payload is None:
                    return
                request = Request.from_wire(decode_frame(payload))
                response = await _answer(request, handler)
                await stream.send_all(encode_frame(response.to_wire()))
        except IpcError as e:
            counters["rejected_ipc_malformed"] += 1
            logger.warning("closing IPC connection after a malformed frame: %s", e)
            try:
                await stream.send_all(encode_frame(Response(id=-1, ok=False, error=str(e)).to_wire()))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            logger.debug("IPC connection closed by the learner")


async def _answer(request: Request, handler: Handler) -> Response:
    try:
        return Response(id=request.id, ok=True, result=await handler(request))
    except (RequestError, ProtocolError) as e:
        return Response(id=request.id, ok=False, error=f"{type(e).__name__}: {e}")
    except Exception as e:  # a bug must not take the node down; say it and carry on
        logger.exception("IPC handler failed on op %r", request.op)
        return Response(id=request.id, ok=False, error=f"internal error: {type(e).__name__}: {e}")


async def _read_exactly(stream: trio.SocketStream, buf: bytearray, n: int) -> bytes | None:
    """Read n bytes (buffered); None on a clean EOF at a frame boundary."""
    while len(buf) < n:
        chunk = await stream.receive_some(max(65536, n - len(buf)))
        if not chunk:
            if buf:
                raise IpcError("connection closed in the middle of a frame")
            return None
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out
