"""SocketBridge: the learner's Bridge to its swarm process over a Unix socket.

Plain blocking sockets and msgpack frames (protocol.ipc); no libp2p, no trio, so the learner's
sync torch code can call it directly. One request, one response; a lock makes it safe to share
between threads. The swarm process signs what the learner publishes.

Errors::

    BridgeError            – base
     ├── BridgeUnavailable – cannot connect / the swarm process went away / timed out
     └── RequestRefused    – the swarm process refused a request (bad message, too large, ...)
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Any

from protocol import Message, PeerAnnouncement, ProtocolError
from protocol.ipc import (
    HEADER,
    MAX_LINKS,
    IpcError,
    Request,
    Response,
    decode_frame,
    delivery_from_ipc,
    encode_frame,
    frame_length,
    message_to_ipc,
)
from node.bridge import Received

__all__ = ["BridgeError", "BridgeUnavailable", "RequestRefused", "SocketBridge"]

_RETRYABLE = {errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN}


class BridgeError(Exception):
    pass


class BridgeUnavailable(BridgeError):
    pass


class RequestRefused(BridgeError):
    pass


class SocketBridge:
    """``node.bridge.Bridge`` over the swarm process's IPC socket."""

    def __init__(self, path: str, *, timeout_s: float = 30.0) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.path = path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._next_id = 0
        self._buf = bytearray()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise BridgeUnavailable(f"cannot connect to swarm process at {path}: {e.strerror}") from e

    @classmethod
    def connect(cls, path: str, *, wait_s: float = 60.0, timeout_s: float = 30.0) -> SocketBridge:
        """Connect, retrying while the swarm process is not up yet (socket absent/refusing)."""
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                return cls(path, timeout_s=timeout_s)
            except BridgeUnavailable as e:
                cause = e.__cause__
                retryable = isinstance(cause, OSError) and cause.errno in _RETRYABLE
                if not retryable or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(1.0, delay * 2)

    # -- Bridge ---------------------------------------------------------------------------
    def announce(self, *, model: str, collective_addrs: tuple[str, ...] = (),
                 capabilities: tuple[str, ...] = ()) -> None:
        self._call("announce", {"model": model, "collective_addrs": list(collective_addrs),
                                "capabilities": list(capabilities)})

    def publish(self, message: Message) -> None:
        self._call("publish", message_to_ipc(message))

    def receive(self, type_: str, *, max_items: int = 256) -> list[Received]:
        items = self._call("receive", {"type": type_, "max_items": max_items})
        if not isinstance(items, list):
            raise BridgeError("receive: the swarm process sent a non-list")
        out = []
        for item in items:
            try:
                sender, message, received_ms = delivery_from_ipc(item)
                out.append(Received(sender=sender, message=message, received_ms=received_ms))
            except ProtocolError as e:
                raise BridgeError(f"receive: bad item from the swarm process: {e}") from None
        return out

    def peers(self) -> list[PeerAnnouncement]:
        items = self._call("peers", {})
        try:
            return [PeerAnnouncement.from_wire(a) for a in items]
        except (ProtocolError, TypeError) as e:
            raise BridgeError(f"peers: bad answer from the swarm process: {e}") from None

    def stats(self) -> dict[str, int]:
        d = self._call("stats", {})
        if not isinstance(d, dict) or not all(isinstance(k, str) and type(v) is int
                                             for k, v in d.items()):
            raise BridgeError("stats: the swarm process sent something else than {str: int}")
        return d

    def links(self) -> dict[str, str]:
        d = self._call("links", {})
        if not isinstance(d, dict) or len(d) > MAX_LINKS or not all(
                isinstance(k, str) and v in ("direct", "relayed") for k, v in d.items()):
            raise BridgeError("links: the swarm process sent something else than "
                              "{peer_id: 'direct' | 'relayed'}")
        return d

    def sources(self, delivered: dict[str, int], valid: dict[str, int] | None = None, *,
                own: int | None = None) -> None:
        """Per sender, groups that carried signal (``delivered``) and groups that passed
        re-scoring (``valid``), and our own local groups that carried signal (``own``): what
        the feeds keep their sources by (swarm.feed_standing). All running totals."""
        args: dict[str, Any] = {"delivered": dict(delivered)}
        if valid is not None:
            args["valid"] = dict(valid)
        if own is not None:
            args["own"] = int(own)
        self._call("sources", args)

    def tunnel(self, peer_id: str) -> tuple[str, int]:
        """(host, port) of a local TCP listener the swarm process tunnels to ``peer_id``'s
        collective (swarm.tunnel): how the collective reaches a peer nobody can dial."""
        d = self._call("tunnel", {"peer_id": peer_id})
        if not isinstance(d, dict) or not isinstance(d.get("host"), str) \
                or type(d.get("port")) is not int or not 0 < d["port"] < 65536:
            raise BridgeError("tunnel: the swarm process sent something else than {host, port}")
        return d["host"], d["port"]

    def close(self) -> None:
        with self._lock:
            self._sock.close()

    def __enter__(self) -> SocketBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- framing --------------------------------------------------------------------------
    def _call(self, op: str, args: dict[str, Any]) -> Any:
        with self._lock:
            self._next_id += 1
            request = Request(op=op, id=self._next_id, args=args)
            try:
                self._sock.sendall(encode_frame(request.to_wire()))
                response = Response.from_wire(decode_frame(self._read(frame_length(self._read(HEADER.size)))))
            except (OSError, IpcError) as e:
                self._sock.close()
                raise BridgeUnavailable(f"{op}: swarm process connection lost: {e}") from e
        if response.id != request.id:
            raise BridgeError(f"{op}: response id {response.id} for request {request.id}")
        if not response.ok:
            raise RequestRefused(f"{op}: {response.error}")
        return response.result

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise IpcError("connection closed by the swarm process")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out
