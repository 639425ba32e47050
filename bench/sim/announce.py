"""Peer announcements: the O(N) gossip both schemes keep (swarm/SCALING.md, "What is still O(N)").

Every peer floods a signed PeerAnnouncement on one gossip topic every
``Scheme.announce_period_s(N)``: a fixed ``announce_interval_s`` before issue 15's follow-up
(a node then processes (N - 1) / interval per second: O(N)), N / ``announce_rate_per_s`` within
bounds as ``swarm/peers.py`` builds it (about ``announce_rate_per_s`` per second: flat up to
N = rate x ``announce_interval_max_s``). Each arrives about D times (its mesh degree): one first copy (``first_ms + copy_ms``), D - 1 redundant ones (``copy_ms``), D - 1
forwards (``send_ms``). Simulating them event by event would cost N^2 events per interval, so
they are accounted in closed form here and their CPU is taken out of what the rollout traffic
has: a node's own core (WAN) or the shared cores (testbed) are that much slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.sim.config import Scenario

__all__ = ["AnnounceLoad", "announce_load", "announce_period"]


@dataclass(frozen=True, kw_only=True)
class AnnounceLoad:
    """Per node and second (``period_s``: every peer's announcement period)."""

    period_s: float
    table_ttl_s: float
    firsts_per_s: float
    copies_per_s: float
    cpu_ms_per_s: float
    bytes_in_per_s: float
    bytes_out_per_s: float


ON_SCHEDULE = 1.5
"""swarm/peers.py: a peer counts towards the swarm size while heard within 1.5 periods."""


def announce_period(sc: Scenario, peers: int) -> float:
    """The period the swarm settles on: every table counts the ``peers`` live ones plus the
    departed ones still on schedule (churn x N x 1.5 periods; a fixed point, capped)."""
    counted = float(peers)
    for _ in range(50):
        period = sc.scheme.announce_period_s(counted)
        counted = peers + sc.churn_per_min / 60 * peers * ON_SCHEDULE * period
    return sc.scheme.announce_period_s(counted)


def announce_load(sc: Scenario, peers: int) -> AnnounceLoad:
    """The announcement load on one node of a swarm of ``peers`` processes."""
    c = sc.costs
    d = min(sc.scheme.degree, max(1, peers - 1))
    period = announce_period(sc, peers)
    firsts = (peers - 1) / period
    copies = firsts * d
    cpu = firsts * (c.first_ms + c.copy_ms) + firsts * (d - 1) * (c.copy_ms + c.send_ms)
    return AnnounceLoad(period_s=period, table_ttl_s=sc.scheme.table_ttl_s(period),
                        firsts_per_s=firsts, copies_per_s=copies, cpu_ms_per_s=cpu,
                        bytes_in_per_s=copies * c.announce_bytes,
                        bytes_out_per_s=copies * c.announce_bytes)
