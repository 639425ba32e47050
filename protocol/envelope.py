"""The signed envelope every application message travels in.

Wire form (a msgpack map, short keys)::

    {"v": version, "t": type, "pk": sender public key (32 B), "sw": swarm id,
     "ts": creation time (ms since epoch), "n": nonce (16 B), "b": body (msgpack bytes),
     "s": Ed25519 signature (64 B)}

The signature covers the domain tag and every field but "s"; the body is signed as the exact
bytes that travel, so no canonical re-encoding is needed to verify it.

Sizes have one source of truth, ``Limits.max_message_bytes``: the whole sealed message, body
included, must fit it (``seal`` refuses more, ``open_envelope`` accepts up to it). A sender
that packs several rollouts into one batch sizes its batches with ``max_body_bytes`` (see
``protocol.batching``). Unknown envelope keys share the body's ``UnknownBudget``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

from protocol.errors import (
    DecodeError,
    SchemaError,
    TooLarge,
    UnknownMessageType,
    VersionError,
    WrongSwarm,
)
from protocol.identity import Identity, peer_id_from_public_key, verify
from protocol.limits import DEFAULT_LIMITS, Limits, packb, unpackb
from protocol.messages import MESSAGE_TYPES, Message
from protocol.schema import UnknownBudget
from protocol.version import PROTOCOL_VERSION

DOMAIN = b"swarm-node/envelope/v1"
NONCE_BYTES = 16
MAX_SWARM_ID = 64
ENVELOPE_KEYS = frozenset({"v", "t", "pk", "sw", "ts", "n", "b", "s"})
ENVELOPE_OVERHEAD = 512
"""Bytes a sealed envelope adds to its body, at most (keys, key, nonce, signature, a swarm id
of 64 characters of up to 4 bytes each, type, headers); tests/protocol checks the bound."""


def max_body_bytes(limits: Limits = DEFAULT_LIMITS) -> int:
    """The largest encoded message body (``packb(message.to_wire())``) that seals and opens
    within ``limits``: what a sender may put in one message."""
    return limits.max_message_bytes - ENVELOPE_OVERHEAD


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """A decoded, signature-checked message. Replay checks are the caller's (ReplayGuard)."""

    version: int
    type: str
    sender: bytes
    swarm_id: str
    created_ms: int
    nonce: bytes
    message: Message

    @property
    def sender_peer_id(self) -> str:
        return peer_id_from_public_key(self.sender)


def _signed_bytes(v: int, t: str, pk: bytes, sw: str, ts: int, n: bytes, b: bytes) -> bytes:
    return packb([DOMAIN, v, t, pk, sw, ts, n, b])


def seal(
    identity: Identity,
    message: Message,
    *,
    swarm_id: str,
    now_ms: int | None = None,
    nonce: bytes | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> bytes:
    """Sign and encode ``message``. Raises TooLarge if the result exceeds the limits."""
    if not swarm_id or len(swarm_id) > MAX_SWARM_ID:
        raise ValueError("swarm_id must be 1..64 characters")
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    n = os.urandom(NONCE_BYTES) if nonce is None else nonce
    body = packb(message.to_wire())
    pk = identity.public_key
    sig = identity.sign(_signed_bytes(PROTOCOL_VERSION, message.TYPE, pk, swarm_id, ts, n, body))
    data = packb({"v": PROTOCOL_VERSION, "t": message.TYPE, "pk": pk, "sw": swarm_id,
                  "ts": ts, "n": n, "b": body, "s": sig})
    if len(data) > limits.max_message_bytes:
        raise TooLarge(f"sealed message of {len(data)} bytes exceeds {limits.max_message_bytes}")
    return data


def envelope_map(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The envelope's outer map, decoded within ``limits`` but not checked (a caller that
    must read a field before verifying, e.g. swarm's announcement spacing, hands the map to
    ``open_envelope`` rather than decoding twice). Raises only ProtocolError subclasses."""
    # the body travels as one byte string of up to the whole message; every other limit holds
    outer = dataclasses.replace(limits, max_str=max(limits.max_str, limits.max_message_bytes))
    raw = unpackb(data, outer, check_depth=False)  # flat map; unknown keys walked by budget
    if not isinstance(raw, dict):
        raise DecodeError("envelope is not a map")
    return raw


def open_envelope(
    data: bytes | dict[str, Any], *, swarm_id: str | None = None,
    limits: Limits = DEFAULT_LIMITS
) -> Envelope:
    """Decode, check and verify ``data``: the sealed bytes, or their ``envelope_map``.
    Raises only ProtocolError subclasses.

    With ``swarm_id`` set, a message for another swarm raises SchemaError on field 'sw'.
    """
    raw = data if isinstance(data, dict) else envelope_map(data, limits=limits)
    budget = UnknownBudget()
    v = _field(raw, "v", int)
    if v != PROTOCOL_VERSION:
        raise VersionError(f"protocol version {v}, this peer speaks {PROTOCOL_VERSION}")
    t = _field(raw, "t", str)
    pk = _field(raw, "pk", bytes)
    sw = _field(raw, "sw", str)
    ts = _field(raw, "ts", int)
    n = _field(raw, "n", bytes)
    b = _field(raw, "b", bytes)
    s = _field(raw, "s", bytes)
    if len(pk) != 32:
        raise SchemaError("pk", f"public key of {len(pk)} bytes, expected 32")
    if len(n) != NONCE_BYTES:
        raise SchemaError("n", f"nonce of {len(n)} bytes, expected {NONCE_BYTES}")
    if len(s) != 64:
        raise SchemaError("s", f"signature of {len(s)} bytes, expected 64")
    if not 0 <= ts < 2**53:
        raise SchemaError("ts", "out of range")
    if swarm_id is not None and sw != swarm_id:
        raise WrongSwarm("sw", f"swarm id {sw!r} is not this swarm's {swarm_id!r}")
    if len(raw) != len(ENVELOPE_KEYS):
        budget.charge(raw, ENVELOPE_KEYS, "envelope")
    cls = MESSAGE_TYPES.get(t)
    if cls is None:
        raise UnknownMessageType(f"unknown message type {t!r}")
    verify(pk, s, _signed_bytes(v, t, pk, sw, ts, n, b))
    message = cls.from_wire(unpackb(b, limits, check_depth=False), "", budget)
    return Envelope(version=v, type=t, sender=pk, swarm_id=sw, created_ms=ts, nonce=n,
                    message=message)


def _field(raw: dict[str, Any], key: str, kind: type) -> Any:
    if key not in raw:
        raise SchemaError(key, "required field missing")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise SchemaError(key, f"expected {kind.__name__}, got {type(value).__name__}")
    return value
