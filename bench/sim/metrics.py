"""What a finished ``Sim`` measured: per-node cost, delivery, latency, whose groups were used."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence
from typing import Any

from bench.sim.engine import Sim

__all__ = ["gini", "percentile", "summarize"]

SPREAD_ROUNDS = 10


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]) of an already sorted sequence."""
    if not sorted_values:
        return None
    return float(sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))])


def gini(values: Sequence[float]) -> float:
    """Gini coefficient (0: all equal, -> 1: one holds everything)."""
    xs = sorted(values)
    n, total = len(xs), sum(xs)
    if n == 0 or total == 0:
        return 0.0
    weighted = sum((i + 1) * x for i, x in enumerate(xs))
    return (2 * weighted) / (n * total) - (n + 1) / n


def _dist(values: Sequence[float], digits: int = 2) -> dict[str, float | None]:
    xs = sorted(values)
    return {"mean": round(statistics.fmean(xs), digits) if xs else None,
            "p50": _r(percentile(xs, 0.5), digits), "p90": _r(percentile(xs, 0.9), digits),
            "max": _r(xs[-1] if xs else None, digits)}


def _r(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _intended(sim: Sim, m: int, deadline: float) -> set[int] | None:
    """Receivers that should get ``m``: online from its publish to its deadline."""
    t = sim.m_t[m]
    cands = sim.m_intended[m]
    if cands is None:
        cands = set(range(len(sim.online)))
    origin = sim.m_origin[m]
    return {w for w in cands if w != origin and not sim.is_boot[w]
            and sim.joined[w] <= t and sim.left[w] >= t + deadline}


def delivery(sim: Sim) -> dict[str, Any]:
    """Delivery ratio within the deadline and latency percentiles of batch first copies."""
    deadline = sim.deadline_ms
    got: dict[int, dict[int, float]] = collections.defaultdict(dict)
    for m, v, lat in sim.deliveries:
        got[m][v] = lat
    intended_total = delivered = 0
    lats: list[float] = []
    for m in range(len(sim.m_origin)):
        if not sim.m_batch[m]:
            continue
        want = _intended(sim, m, deadline)
        assert want is not None
        intended_total += len(want)
        for v, lat in got.get(m, {}).items():
            if v in want:
                lats.append(lat)
                delivered += lat <= deadline
    lats.sort()
    # every first delivery, as gossip_bench counts: a feed's backfill (its receiver was not
    # subscribed when the batch was published) and copies to peers that left later included
    every = sorted(lat for _m, v, lat in sim.deliveries if not sim.is_boot[v])
    return {"intended": intended_total, "delivered": delivered,
            "latency_all_ms": {"p50": _r(percentile(every, 0.5), 1),
                               "p99": _r(percentile(every, 0.99), 1),
                               "max": _r(every[-1] if every else None, 1)},
            "delivery_ratio": round(delivered / intended_total, 4) if intended_total else None,
            "latency_ms": {"p50": _r(percentile(lats, 0.5), 1), "p90": _r(percentile(lats, 0.9), 1),
                           "p99": _r(percentile(lats, 0.99), 1), "max": _r(lats[-1] if lats else None, 1)}}


def spread(sim: Sim) -> dict[str, Any]:
    """Whose groups nodes trained on over the last ``SPREAD_ROUNDS`` rounds."""
    last = sim.sc.rounds
    first = max(0, last - SPREAD_ROUNDS)
    distinct: list[float] = []
    top_share: list[float] = []
    used_per_round: list[float] = []
    exposure: collections.Counter[int] = collections.Counter()
    for v in range(len(sim.online)):
        if sim.is_boot[v] or sim.joined[v] > first * sim.sc.round_s * 1000:
            continue
        if sim.left[v] < sim.end_ms:
            continue
        picks = [s for k, s in sim.taken[v] if first <= k < last]
        used_per_round.append(len(picks) / (last - first))
        if not picks:
            distinct.append(0)
            continue
        counts = collections.Counter(picks)
        distinct.append(len(counts))
        top_share.append(max(counts.values()) / len(picks))
        exposure.update(counts)
    window = (first * sim.sc.round_s * 1000, sim.end_ms)
    publishers = {sim.m_origin[m] for m in range(len(sim.m_origin))
                  if sim.m_batch[m] and window[0] <= sim.m_t[m] < window[1]}
    shares = [exposure.get(s, 0) for s in publishers]
    total = sum(shares)
    return {"rounds": last - first, "nodes": len(distinct),
            "external_used_per_round": _dist(used_per_round),
            "distinct_senders": {**_dist(distinct), "min": min(distinct) if distinct else None},
            "top_sender_share": _dist(top_share, 3),
            "sender_exposure_gini": round(gini(shares), 3),
            "sender_exposure_max_share": round(max(shares) / total, 4) if total else None,
            "senders_never_used": sum(1 for x in shares if x == 0)}


def summarize(sim: Sim, *, wall_s: float) -> dict[str, Any]:
    sc = sim.sc
    nodes = [v for v in range(len(sim.online)) if not sim.is_boot[v]]
    secs = {v: (min(sim.left[v], sim.end_ms) - sim.joined[v]) / 1000 for v in nodes}
    # per-node rates over at least one round online (a joiner seen for 0.2 s with one backfilled
    # batch would read as 50 batches per round)
    nodes = [v for v in nodes if secs[v] >= sc.round_s]
    per_round = sc.round_s
    ann = sim.announce
    out: dict[str, Any] = {
        "scheme": sc.scheme.kind, "n": sc.n, "rounds": sc.rounds, "round_s": sc.round_s,
        "churn_per_min": sc.churn_per_min, "network": sc.network.mode, "seed": sc.seed,
        "peers_ever": len(nodes), "wall_s": round(wall_s, 2),
        "per_node_per_round": {
            "inbound_copies": _dist([sim.copies_in[v] / secs[v] * per_round for v in nodes]),
            "first_deliveries": _dist([sim.firsts[v] / secs[v] * per_round for v in nodes]),
            "duplicates": _dist([sim.dups[v] / secs[v] * per_round for v in nodes]),
        },
        "per_node_rollouts": {
            "bytes_in_per_s": _dist([sim.bytes_in[v] / secs[v] for v in nodes], 0),
            "bytes_out_per_s": _dist([sim.bytes_out[v] / secs[v] for v in nodes], 0),
            "cpu_ms_per_s": _dist([sim.cpu.cpu_ms[v] / secs[v] for v in nodes], 1),
        },
        "per_node_announcements": {
            "period_s": round(ann.period_s, 1), "table_ttl_s": round(ann.table_ttl_s),
            "firsts_per_s": round(ann.firsts_per_s, 2), "copies_per_s": round(ann.copies_per_s, 1),
            "cpu_ms_per_s": round(ann.cpu_ms_per_s, 1), "bytes_in_per_s": round(ann.bytes_in_per_s),
        },
        "lost_copies": sim.lost_copies,
        **delivery(sim),
        "sapo_spread": spread(sim),
    }
    rollout_cpu = out["per_node_rollouts"]["cpu_ms_per_s"]["mean"] or 0.0
    out["per_node_cpu_utilisation"] = round((rollout_cpu + ann.cpu_ms_per_s) / 1000, 3)
    if sc.network.mode == "wan":
        # above one core the node cannot keep up: its queue (and latency) grows without bound,
        # and announcements are modelled as taking at most 95% of the core (engine.py)
        out["saturated"] = out["per_node_cpu_utilisation"] >= 1.0
    scheme = sim.scheme
    if hasattr(scheme, "handshakes"):
        held = scheme.held / max(1, scheme.held_samples) / sc.scheme.feed_sources
        out["feeds"] = {"handshakes": scheme.handshakes, "busy_refusals": scheme.busy_refusals,
                        "failed_picks": scheme.failed_picks, "slots_held": round(held, 3)}
    return out
