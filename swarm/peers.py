"""The table of live peers, fed by their signed announcements; entries expire."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol import PeerAnnouncement

__all__ = ["PeerTable"]


@dataclass(kw_only=True)
class PeerTable:
    """Latest announcement per peer id; an entry older than ``ttl_s`` is forgotten."""

    ttl_s: float
    capacity: int = 4096
    _entries: dict[str, tuple[PeerAnnouncement, float]] = field(default_factory=dict, repr=False)

    def update(self, announcement: PeerAnnouncement, now_s: float) -> bool:
        """Record an announcement; True when the peer was not known before."""
        new = announcement.peer_id not in self._entries
        if new and len(self._entries) >= self.capacity:
            self.expire(now_s)
            if len(self._entries) >= self.capacity:
                oldest = min(self._entries, key=lambda k: self._entries[k][1])
                del self._entries[oldest]
        self._entries[announcement.peer_id] = (announcement, now_s)
        return new

    def expire(self, now_s: float) -> list[str]:
        dead = [pid for pid, (_, seen) in self._entries.items() if now_s - seen > self.ttl_s]
        for pid in dead:
            del self._entries[pid]
        return dead

    def live(self) -> list[PeerAnnouncement]:
        return [a for a, _ in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)
