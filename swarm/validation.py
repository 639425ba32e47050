"""Validation of gossip payloads at the boundary, before anything reaches the learner.

Order of checks (cheapest first, all keyed by authenticated data):

1. per-sender token bucket, keyed by the pubsub ``from`` peer (pubsub checked its signature)
2. ``open_envelope``: size limits, msgpack, schema, swarm id, Ed25519 signature
3. the envelope type matches the topic it came on
4. the envelope's signer is the pubsub ``from`` peer (a relayed message keeps its ``from``,
   so honest relaying passes; re-publishing someone else's envelope does not)
5. ``ReplayGuard``: time window and nonce dedupe (covers replays after gossipsub's 120 s
   seen-cache expires)

Every rejection raises ``Rejected`` with a reason that becomes the ``rejected_<reason>`` counter.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from protocol import (
    Envelope,
    PeerAnnouncement,
    ProtocolError,
    ReplayGuard,
    open_envelope,
)
from swarm.ratelimit import TokenBuckets

__all__ = ["IGNORED", "Rejected", "Validator"]

logger = logging.getLogger(__name__)


IGNORED = frozenset({"rate_limited", "stale", "future", "duplicate", "announce_too_soon"})
"""Reasons that do not show the forwarder misbehaved (a relay's token bucket or clock may
differ from ours, a copy may race): dropped without a score penalty. Every other reason is
something an honest relay checks before forwarding, so the forwarder pays P4 for it; without
this split an attacker could have honest relays graylisted by making them forward messages
that only we rate-limit."""


class Rejected(Exception):
    """A payload failed validation; ``reason`` is a metrics label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    @property
    def penalise(self) -> bool:
        """Whether the forwarder should pay for it (gossipsub "reject" rather than "ignore")."""
        return self.reason not in IGNORED


@dataclass(kw_only=True)
class Validator:
    """Checks payloads and counts every rejection in ``counters`` (``rejected_<reason>``)."""

    swarm_id: str
    counters: collections.Counter[str]
    buckets: TokenBuckets
    guard: ReplayGuard
    log_every_s: float = 10.0
    _last_log: dict[str, float] = field(default_factory=dict, repr=False)

    def check(self, data: bytes | dict[str, Any], *, from_peer: str, expected_type: str,
              now_ms: int | None = None) -> Envelope:
        """Return the accepted envelope or raise Rejected (already counted and logged).
        ``data``: the sealed bytes, or their ``protocol.envelope_map`` when already decoded."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        try:
            return self._check(data, from_peer, expected_type, now)
        except Rejected as e:
            self.counters[f"rejected_{e.reason}"] += 1
            self._log(e, from_peer)
            raise

    def _check(self, data: bytes | dict[str, Any], from_peer: str, expected_type: str,
               now: int) -> Envelope:
        if not self.buckets.take(from_peer, now / 1000):
            raise Rejected("rate_limited", "sender exceeds its message rate")
        try:
            env = open_envelope(data, swarm_id=self.swarm_id)
        except ProtocolError as e:
            raise Rejected(e.reason, str(e)) from None
        if env.type != expected_type:
            raise Rejected("wrong_topic", f"a {env.type!r} message on the {expected_type!r} topic")
        signer = env.sender_peer_id
        if signer != from_peer:
            raise Rejected("wrong_sender", f"signed by {signer}, published by {from_peer}")
        if isinstance(env.message, PeerAnnouncement) and env.message.peer_id != signer:
            raise Rejected("wrong_sender", "announcement for another peer id")
        try:
            self.guard.check(env, now)
        except ProtocolError as e:
            raise Rejected(e.reason, str(e)) from None
        return env

    def _log(self, e: Rejected, from_peer: str) -> None:
        now = time.monotonic()
        if now - self._last_log.get(e.reason, -1e9) >= self.log_every_s:
            self._last_log[e.reason] = now
            total = self.counters[f"rejected_{e.reason}"]
            logger.warning("rejected message from %s: %s (%d so far with this reason)",
                           from_peer, e, total)
