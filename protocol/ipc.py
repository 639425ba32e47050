"""Frames between the learner (``node.ipc_client.SocketBridge``) and the swarm process.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack (a map). The
learner sends requests and reads exactly one response per request, in order::

    request  {"op": str, "id": int, "args": map}
    response {"id": int, "ok": true, "result": ...} | {"id": int, "ok": false, "error": str}

Ops (``OPS``) and their args / results:

    announce  {model, collective_addrs, capabilities} -> None
    publish   {type, body}                            -> None   (the swarm side signs it)
    receive   {type, max_items}                       -> [{sender, type, body, received_ms}]
    peers     {}                                      -> [PeerAnnouncement wire map]
    stats     {}                                      -> {name: int}
    tunnel    {peer_id}                               -> {host, port}  (swarm.tunnel)
    sources   {delivered: {peer_id: int},             -> None   (swarm.feeds ``rate``; at
               valid?: {peer_id: int}, own?: int}                most MAX_SOURCES senders each;
                                                         own: our own groups with signal)
    links     {}                                      -> {peer_id: "direct" | "relayed"}
                                                         (connected peers, at most MAX_LINKS:
                                                         swarm.holepunch ``link_of``)

Messages travel as ``{"type": Message.TYPE, "body": message.to_wire()}`` and are checked on
both sides with the same strict schema as the network (``Message.from_wire``). Decoding errors
raise ``IpcError`` (a DecodeError, reason ``ipc_malformed``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from protocol.errors import DecodeError, ProtocolError
from protocol.limits import Limits, packb, unpackb
from protocol.messages import MESSAGE_TYPES, Message

__all__ = [
    "HEADER",
    "IPC_LIMITS",
    "MAX_FRAME",
    "MAX_LINKS",
    "MAX_RECEIVE_ITEMS",
    "MAX_SOURCES",
    "RECEIVE_BYTES",
    "OPS",
    "IpcError",
    "Request",
    "Response",
    "decode_frame",
    "delivery_from_ipc",
    "delivery_to_ipc",
    "encode_frame",
    "frame_length",
    "message_from_ipc",
    "message_to_ipc",
]

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
"""Largest frame either side accepts (a receive of many large batches)."""
MAX_RECEIVE_ITEMS = 1024
IPC_LIMITS = Limits(max_message_bytes=MAX_FRAME, max_str=1024 * 1024, max_list=MAX_RECEIVE_ITEMS,
                    max_depth=12, max_objects=MAX_FRAME)  # many deliveries; bounded by bytes
RECEIVE_BYTES = MAX_FRAME // 2
"""Gossip bytes one ``receive`` returns at most (the re-encoded deliveries stay well under
MAX_FRAME: re-encoding a checked message does not grow it by half)."""
MAX_SOURCES = 256
"""Senders in one ``sources`` report (the learner sends those that delivered most)."""
MAX_LINKS = 256
"""Connected peers one ``links`` answer names at most."""
OPS = frozenset({"announce", "publish", "receive", "peers", "stats", "tunnel", "sources",
                 "links"})


class IpcError(DecodeError):
    reason = "ipc_malformed"


@dataclass(frozen=True, kw_only=True)
class Request:
    op: str
    id: int
    args: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, "id": self.id, "args": self.args}

    @classmethod
    def from_wire(cls, obj: Any) -> Request:
        d = _map(obj, "request")
        op = _get(d, "op", str)
        if op not in OPS:
            raise IpcError(f"unknown op {op!r}")
        return cls(op=op, id=_get(d, "id", int), args=_map(d.get("args", {}), "args"))


@dataclass(frozen=True, kw_only=True)
class Response:
    id: int
    ok: bool
    result: Any = None
    error: str = ""

    def to_wire(self) -> dict[str, Any]:
        if self.ok:
            return {"id": self.id, "ok": True, "result": self.result}
        return {"id": self.id, "ok": False, "error": self.error}

    @classmethod
    def from_wire(cls, obj: Any) -> Response:
        d = _map(obj, "response")
        ok = _get(d, "ok", bool)
        if ok:
            return cls(id=_get(d, "id", int), ok=True, result=d.get("result"))
        return cls(id=_get(d, "id", int), ok=False, error=_get(d, "error", str))


def encode_frame(obj: dict[str, Any]) -> bytes:
    data = packb(obj)
    if len(data) > MAX_FRAME:
        raise IpcError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(data)) + data


def frame_length(header: bytes) -> int:
    """The payload length announced by a 4-byte header; IpcError if out of bounds."""
    if len(header) != HEADER.size:
        raise IpcError("truncated frame header")
    (n,) = HEADER.unpack(header)
    if n == 0 or n > MAX_FRAME:
        raise IpcError(f"frame length {n} out of bounds (1..{MAX_FRAME})")
    return n


def decode_frame(payload: bytes) -> dict[str, Any]:
    try:
        obj = unpackb(payload, IPC_LIMITS)
    except ProtocolError as e:
        raise IpcError(f"bad frame: {e}") from None
    return _map(obj, "frame")


def message_to_ipc(message: Message) -> dict[str, Any]:
    return {"type": message.TYPE, "body": message.to_wire()}


def message_from_ipc(obj: Any) -> Message:
    """Check and build a message; raises IpcError / SchemaError (both ProtocolError)."""
    d = _map(obj, "message")
    type_ = _get(d, "type", str)
    cls = MESSAGE_TYPES.get(type_)
    if cls is None:
        raise IpcError(f"unknown message type {type_!r}")
    return cls.from_wire(d.get("body"))


def delivery_to_ipc(sender: str, message: Message, received_ms: int) -> dict[str, Any]:
    """One item of a ``receive`` result."""
    return {"sender": sender, "received_ms": received_ms, **message_to_ipc(message)}


def delivery_from_ipc(obj: Any) -> tuple[str, Message, int]:
    """``(sender, message, received_ms)`` of one ``receive`` item; raises ProtocolError."""
    d = _map(obj, "receive item")
    return _get(d, "sender", str), message_from_ipc(d), _get(d, "received_ms", int)


def _map(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise IpcError(f"{what} is not a map")
    return obj


def _get(d: dict[str, Any], key: str, kind: type) -> Any:
    value = d.get(key)
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise IpcError(f"field {key!r}: expected {kind.__name__}")
    return value
