"""Wire formats of swarm-node: everything that crosses a process or network boundary.

Pure Python: no torch, no trio, no network I/O. The only file I/O is the identity key file
and the atomic-write helper that every process shares (``protocol.files``).

Layers, bottom up::

    errors    – the exception tree (ProtocolError and its children)
    limits    – size limits (Limits) and the strict msgpack codec (codec)
    schema    – typed message fields, checked on decode
    messages  – PeerAnnouncement, RolloutBatch (gossiped); OuterVersion, OuterVote,
                OuterJoin, OuterLeft (the outer step's DHT records)
    identity  – Ed25519 node identity and libp2p peer ids
    envelope  – signed envelope: seal() / open_envelope(); max_body_bytes()
    batching  – split_rollouts(): RolloutBatches sized to fit one sealed message
    replay    – ReplayGuard: time window + nonce dedupe with bounded memory
    tables    – build_table(): a config dataclass from a JSON/TOML table, or TableError naming
                the key (the tables a node hands its children; stdlib only)
    events    – the children's event lines to their supervisor (ready, round, outer, ...)
"""

from __future__ import annotations

from protocol.batching import split_rollouts
from protocol.envelope import Envelope, envelope_map, max_body_bytes, open_envelope, seal
from protocol.errors import (
    DecodeError,
    DuplicateNonce,
    FutureMessage,
    ProtocolError,
    ReplayError,
    SchemaError,
    SignatureError,
    StaleMessage,
    TooLarge,
    UnknownFields,
    UnknownMessageType,
    VersionError,
    WrongSwarm,
    IdentityError,
)
from protocol.files import atomic_write_bytes
from protocol.identity import Identity, load_or_create_identity, peer_id_from_public_key
from protocol.limits import Limits
from protocol.messages import (
    GOSSIPED,
    MESSAGE_TYPES,
    Message,
    OuterJoin,
    OuterLeft,
    OuterRecord,
    OuterVersion,
    OuterVote,
    PeerAnnouncement,
    Rollout,
    RolloutBatch,
    TaskSpec,
)
from protocol.replay import ReplayGuard
from protocol.version import PROTOCOL_VERSION, SOFTWARE_VERSION

__all__ = [
    "PROTOCOL_VERSION",
    "SOFTWARE_VERSION",
    "GOSSIPED",
    "MESSAGE_TYPES",
    "DecodeError",
    "DuplicateNonce",
    "Envelope",
    "FutureMessage",
    "Identity",
    "IdentityError",
    "Limits",
    "Message",
    "OuterJoin",
    "OuterLeft",
    "OuterRecord",
    "OuterVersion",
    "OuterVote",
    "PeerAnnouncement",
    "ProtocolError",
    "ReplayError",
    "ReplayGuard",
    "Rollout",
    "RolloutBatch",
    "SchemaError",
    "SignatureError",
    "StaleMessage",
    "TaskSpec",
    "TooLarge",
    "UnknownFields",
    "UnknownMessageType",
    "VersionError",
    "WrongSwarm",
    "atomic_write_bytes",
    "envelope_map",
    "load_or_create_identity",
    "max_body_bytes",
    "open_envelope",
    "peer_id_from_public_key",
    "seal",
    "split_rollouts",
]
