"""Peer announcements: the O(N) gossip both schemes keep (swarm/SCALING.md, "What is still O(N)").

Every peer floods a signed PeerAnnouncement every ``announce_interval_s`` on one gossip topic,
so a node processes (N - 1) / interval of them per second, each arriving about D times (its
mesh degree): one first copy (``first_ms + copy_ms``), D - 1 redundant ones (``copy_ms``), D - 1
forwards (``send_ms``). Simulating them event by event would cost N^2 events per interval, so
they are accounted in closed form here and their CPU is taken out of what the rollout traffic
has: a node's own core (WAN) or the shared cores (testbed) are that much slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.sim.config import Scenario

__all__ = ["AnnounceLoad", "announce_load"]


@dataclass(frozen=True, kw_only=True)
class AnnounceLoad:
    """Per node and second."""

    firsts_per_s: float
    copies_per_s: float
    cpu_ms_per_s: float
    bytes_in_per_s: float
    bytes_out_per_s: float


def announce_load(sc: Scenario, peers: int) -> AnnounceLoad:
    """The announcement load on one node of a swarm of ``peers`` processes."""
    c = sc.costs
    d = min(sc.scheme.degree, max(1, peers - 1))
    firsts = (peers - 1) / sc.scheme.announce_interval_s
    copies = firsts * d
    cpu = firsts * (c.first_ms + c.copy_ms) + firsts * (d - 1) * (c.copy_ms + c.send_ms)
    return AnnounceLoad(firsts_per_s=firsts, copies_per_s=copies, cpu_ms_per_s=cpu,
                        bytes_in_per_s=copies * c.announce_bytes,
                        bytes_out_per_s=copies * c.announce_bytes)
