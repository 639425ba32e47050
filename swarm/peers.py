"""The table of live peers, fed by their signed announcements; entries expire.

How often a peer announces grows with the swarm (``announce_interval``: the peers on schedule
over ``announcements.rate_per_s``, clamped), so each announcement states its period
(``interval_s``) and an entry lives ``max(ttl_s, TTL_PERIODS x stated period)``: a peer that
announces rarely because its table is large (a farm of fresh keys can make it so) is kept as
long as it keeps announcing, whatever size our own table has. The stated period is clamped to
``max_interval_s``, so a departed peer lingers at most ``TTL_PERIODS x max_interval_s``. The
swarm size that sets our own period counts only peers *on schedule* (last heard within
``ON_SCHEDULE`` of their stated period): departed peers stop counting after 1.5 periods, so
churn does not inflate the period (which would lengthen TTLs, keep more departed peers, and
so on). When the table is full, a new peer displaces the most recently *first seen* entry,
never an established one: a farm of fresh keys can fill the free places, not push out the
peers we already know.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from protocol import PeerAnnouncement

__all__ = ["ON_SCHEDULE", "TTL_PERIODS", "PeerTable", "announce_interval"]

logger = logging.getLogger(__name__)

TTL_PERIODS = 3.0
"""An entry outlives two lost announcements of its peer (and at least ``ttl_s``)."""
ON_SCHEDULE = 1.5
"""A peer counts towards the swarm size while last heard within this many stated periods."""


def announce_interval(peers: int, *, base_s: float, max_s: float, rate_per_s: float) -> float:
    """This node's announcement period for ``peers`` peers on schedule: the whole swarm then
    sends a node about ``rate_per_s`` announcements per second, whatever its size."""
    return min(max_s, max(base_s, peers / rate_per_s))


@dataclass
class _Entry:
    announcement: PeerAnnouncement
    seen: float
    first_seen: float
    ttl_s: float
    created_ms: int


@dataclass(kw_only=True)
class PeerTable:
    """Latest announcement per peer id; an entry not refreshed within its TTL is forgotten."""

    ttl_s: float
    """Least TTL of an entry (the TTL of peers that state no period or a short one)."""
    max_interval_s: float = 0.0
    """Longest stated period honoured (longer ones count as this); 0: periods are ignored."""
    capacity: int = 4096
    _entries: dict[str, _Entry] = field(default_factory=dict, repr=False)

    def period(self, announcement: PeerAnnouncement) -> float:
        """The period the announcement states, clamped to ``max_interval_s``."""
        return min(announcement.interval_s, self.max_interval_s)

    def entry_ttl(self, announcement: PeerAnnouncement) -> float:
        return max(self.ttl_s, TTL_PERIODS * self.period(announcement))

    def on_schedule(self, now_s: float) -> int:
        """Peers heard within ``ON_SCHEDULE`` of their stated period (at least ``ttl_s`` /
        ``TTL_PERIODS``, the period of a peer that states none): the swarm size estimate."""
        floor = self.ttl_s / TTL_PERIODS
        return sum(now_s - e.seen <= ON_SCHEDULE * max(floor, self.period(e.announcement))
                   for e in self._entries.values())

    def update(self, announcement: PeerAnnouncement, now_s: float, *, created_ms: int = 0) -> bool:
        """Record an announcement (``created_ms``: its signed creation time); True when the
        peer was not known before."""
        old = self._entries.get(announcement.peer_id)
        if old is None and len(self._entries) >= self.capacity:
            self.expire(now_s)
            if len(self._entries) >= self.capacity:  # displace the newest arrival
                newest = max(self._entries, key=lambda k: self._entries[k].first_seen)
                del self._entries[newest]
        first = now_s if old is None else old.first_seen
        if old is not None and now_s - old.seen > 2 * self.period(announcement):
            # late: two periods without one (its entry expires after TTL_PERIODS)
            logger.debug("announcement of %s after %.1f s (period %.1f s, ttl %.1f s)",
                         announcement.peer_id, now_s - old.seen, self.period(announcement),
                         old.ttl_s)
        self._entries[announcement.peer_id] = _Entry(announcement, now_s, first,
                                                     self.entry_ttl(announcement), created_ms)
        return old is None

    def forget(self, peer_id: str) -> None:
        """Drop a peer we found unreachable (its next announcement brings it back)."""
        self._entries.pop(peer_id, None)

    def created_ms(self, peer_id: str) -> int | None:
        """Signed creation time of the peer's latest recorded announcement (None: unknown)."""
        entry = self._entries.get(peer_id)
        return None if entry is None else entry.created_ms

    def expire(self, now_s: float) -> list[str]:
        dead = [pid for pid, e in self._entries.items() if now_s - e.seen > e.ttl_s]
        for pid in dead:
            del self._entries[pid]
        return dead

    def live(self) -> list[PeerAnnouncement]:
        return [e.announcement for e in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)
