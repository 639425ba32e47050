"""Gossipsub topic names, namespaced by protocol version and swarm id."""

from __future__ import annotations

from protocol import MESSAGE_TYPES, PROTOCOL_VERSION

__all__ = ["topic_for", "topics"]


def topic_for(swarm_id: str, type_: str) -> str:
    """``/swarm-node/<protocol version>/<swarm id>/<message type>``."""
    if type_ not in MESSAGE_TYPES:
        raise ValueError(f"no topic for unknown message type {type_!r}")
    return f"/swarm-node/{PROTOCOL_VERSION}/{swarm_id}/{type_}"


def topics(swarm_id: str) -> dict[str, str]:
    """Message type → topic, for every message type."""
    return {t: topic_for(swarm_id, t) for t in MESSAGE_TYPES}
