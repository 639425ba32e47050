"""What a node's rounds could have received, from the node reports' round records.

Rounds never wait for the network (node.learner_process.OuterHook): a round takes what the
swarm process holds when it starts. A learner that loaded its model well before the others (a
loaded box schedules the learners unevenly) can finish all its rounds before a peer has
published anything, and then receives nothing without any fault (issue 28: "node-2 received
0 rollouts in 4 rounds", its feeds open from the start). So a test expects rollouts per source,
from the records' wall-clock times (``received_at``, ``published_at``): a node must have
received from every peer whose first publish came ``delivery_s`` before its last round started.
"""

from __future__ import annotations

from typing import Any

__all__ = ["due_senders", "senders"]


def _first_publish(node: dict[str, Any]) -> float | None:
    return min((r["published_at"] for r in node["rounds"] if r["rollouts_published"] > 0),
               default=None)


def due_senders(nodes: list[dict[str, Any]], *, delivery_s: float) -> dict[str, set[str]]:
    """Peer id -> the peer ids it must have received rollouts from (empty: none were due)."""
    first = {n["peer_id"]: _first_publish(n) for n in nodes}
    out = {}
    for node in nodes:
        last_receive = node["rounds"][-1]["received_at"]
        out[node["peer_id"]] = {pid for pid, t in first.items() if pid != node["peer_id"]
                                and t is not None and t + delivery_s <= last_receive}
    return out


def senders(node: dict[str, Any]) -> set[str]:
    """Peer ids the node's rounds received rollout batches from."""
    return set().union(*(set(r.get("rollouts_from", ())) for r in node["rounds"]))
