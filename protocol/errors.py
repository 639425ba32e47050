"""The protocol's exception tree. Every rejection of input raises one of these::

    ProtocolError                 – base: anything wrong with a message or key
     ├── DecodeError              – not msgpack, or not the shape of an envelope
     │    ├── TooLarge            – a size limit was exceeded (message, string, list, nesting)
     │    ├── SchemaError         – a field is missing, of the wrong type or out of range
     │    │    ├── WrongSwarm     – a message for another swarm (field 'sw')
     │    │    └── UnknownFields  – keys this version does not know, beyond their budget
     │    ├── UnknownMessageType  – a type this version does not know
     │    └── VersionError        – another protocol major version
     ├── SignatureError           – the signature does not verify
     ├── ReplayError              – rejected by the replay window
     │    ├── StaleMessage        – older than the window (or below the eviction floor)
     │    ├── FutureMessage       – too far ahead of local time
     │    └── DuplicateNonce      – this (sender, nonce) was seen already
     └── IdentityError            – a key file is unreadable or corrupt

Each error has a short machine-readable ``reason`` used as a metrics label.
"""

from __future__ import annotations


class ProtocolError(Exception):
    reason = "protocol"


class DecodeError(ProtocolError):
    reason = "malformed"


class TooLarge(DecodeError):
    reason = "oversized"


class SchemaError(DecodeError):
    reason = "schema"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field!r}: {problem}")
        self.field = field
        self.problem = problem


class WrongSwarm(SchemaError):
    reason = "wrong_swarm"


class UnknownFields(SchemaError):
    reason = "unknown_fields"


class UnknownMessageType(DecodeError):
    reason = "unknown_type"


class VersionError(DecodeError):
    reason = "version"


class SignatureError(ProtocolError):
    reason = "bad_signature"


class ReplayError(ProtocolError):
    reason = "replay"


class StaleMessage(ReplayError):
    reason = "stale"


class FutureMessage(ReplayError):
    reason = "future"


class DuplicateNonce(ReplayError):
    reason = "duplicate"


class IdentityError(ProtocolError):
    reason = "identity"
