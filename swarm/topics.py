"""Gossipsub topic names, namespaced by protocol version and swarm id."""

from __future__ import annotations

from protocol import GOSSIPED, PROTOCOL_VERSION

__all__ = ["topic_for", "topics"]

_GOSSIPED_TYPES = tuple(cls.TYPE for cls in GOSSIPED)


def topic_for(swarm_id: str, type_: str) -> str:
    """``/swarm-node/<protocol version>/<swarm id>/<message type>``."""
    if type_ not in _GOSSIPED_TYPES:
        raise ValueError(f"no topic for message type {type_!r} (gossiped: {_GOSSIPED_TYPES})")
    return f"/swarm-node/{PROTOCOL_VERSION}/{swarm_id}/{type_}"


def topics(swarm_id: str) -> dict[str, str]:
    """Message type → topic, for every gossiped message type."""
    return {t: topic_for(swarm_id, t) for t in _GOSSIPED_TYPES}
