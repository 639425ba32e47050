"""Per-message costs from real ``bench/gossip_bench.py`` rows, and the simulation's error on them.

1. **Costs.** A row gives the CPU of all swarm processes from the first publish to the last
   receipt (``cpu_s_total``), the idle rate measured just before (``idle_cpu_per_s``:
   heartbeats, announcements) and the deliveries per second, hence the window. What the rollout
   traffic cost is ``cpu - idle_rate x window``, spent on F first deliveries, D redundant
   copies, P publishes and the copies sent. The model has one free unit ``u`` with
   swarm/SCALING.md's ratios: a first copy costs u (``copy_ms`` = ``first_ms`` = u/2: a
   redundant copy is half a delivery), a copy sent ``send_ms`` = 0.3 u, a publish u/2.
   ``fit_unit``: with the row's own duplicate count, ``cpu = u (1.3 F + 0.8 D + 0.5 P)`` (every
   copy received was sent once), least squares over rows. ``fit_by_sim``: without trusting D
   (rows from before per-topic counters mix in announcement copies), u is scaled until the
   simulated replay spends the measured rollout CPU (a fixed point: the duplicates depend on
   the queueing, which depends on u).
2. **Error.** Each row is replayed in the simulation's testbed mode (same N, bootstrap,
   ``target_peers`` 4, synchronised publishes, 2 shared cores; the measured idle rate plus the
   share the machine's other runnable processes (load average) take, as background) and the
   simulated inbound copies per node and round and the latency percentiles are compared with
   the measured ones: relative error (sim - real) / real.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.sim.config import Costs, Network, Scenario, Scheme
from bench.sim.engine import Sim
from bench.sim.metrics import summarize

__all__ = ["background", "costs_from_unit", "fit_by_sim", "fit_unit", "replay"]

BENCH_BATCH_BYTES = 1_550
"""gossip_bench's batch (8 tiny rollouts): 1,323 sealed bytes (protocol.envelope.seal) plus
pubsub framing."""


def costs_from_unit(u: float, **kw: Any) -> Costs:
    return Costs(copy_ms=u / 2, first_ms=u / 2, send_ms=0.3 * u, publish_ms=u / 2,
                 control_ms=0.1 * u, handshake_ms=2 * u, **kw)


def window_s(row: dict[str, Any]) -> float:
    """First publish to last receipt (the row's delivered / delivered_per_s)."""
    return row["delivered"] / row["delivered_per_s"]


def _rollout_part(row: dict[str, Any]) -> tuple[float, float, float, float]:
    """(cpu ms, first deliveries, redundant copies, publishes) of the rollout traffic."""
    cpu = 1000 * (row["cpu_s_total"] - row["idle_cpu_per_s"] * window_s(row))
    dups = row.get("duplicates") or 0 if row["mode"] == "flood" else 0
    return cpu, row["delivered"], dups, row["nodes"] * row["batches_per_node"]


def fit_unit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares ``u`` over the rows, and each row's own."""
    xs, ys, own = [], [], []
    for r in rows:
        cpu, f, d, p = _rollout_part(r)
        x = 1.3 * f + 0.8 * d + 0.5 * p
        xs.append(x)
        ys.append(cpu)
        own.append(round(cpu / x, 3))
    u = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return {"unit_ms": round(u, 3), "per_row_unit_ms": own,
            "spread": round((max(own) - min(own)) / u, 3) if len(own) > 1 else None}


def background(row: dict[str, Any], cores: int) -> float:
    """Cores' worth of CPU the rollout traffic could not have: our idle rate plus the share
    the machine's other runnable processes take under fair sharing while ours are busy."""
    ours_idle = row["idle_cpu_per_s"]
    if row.get("quiet_machine"):  # its load average was the bench's own previous row
        return min(0.95 * cores, ours_idle)
    others = max(0.0, row["load_before"][0] - ours_idle)
    return min(0.95 * cores, ours_idle + cores * others / (others + cores))


def _scenario(row: dict[str, Any], unit_ms: float, cores: int, seed: int) -> Scenario:
    return Scenario(
        n=row["nodes"], rounds=row["batches_per_node"], round_s=row["interval_s"],
        synchronized=True, deadline_rounds=60 / row["interval_s"], seed=seed,
        costs=costs_from_unit(unit_ms, batch_bytes=BENCH_BATCH_BYTES),
        network=Network(mode="testbed", cores=cores, background_load=background(row, cores)),
        # announcements are in the measured idle rate, not modelled again
        scheme=Scheme(kind=row["mode"], connections=4, announce_interval_s=1e9,
                      announce_rate_per_s=0.0,
                      feed_make_before_break=row.get("rotation") == "make_before_break",
                      feed_sources=row.get("sources") or 4))


def fit_by_sim(row: dict[str, Any], *, cores: int = 2, start_ms: float = 2.0,
               iterations: int = 4) -> float:
    """The u at which the simulated replay spends the row's measured rollout CPU."""
    want = _rollout_part(row)[0]
    if want <= 0:
        raise ValueError("the row's CPU is below its idle rate x window (a loaded box): "
                         "no cost to fit")
    u = start_ms
    for _ in range(iterations):
        sim = Sim(_scenario(row, u, cores, 0)).run()
        u *= want / sum(sim.cpu.cpu_ms)
    return round(u, 3)


BENCH_QUIET_MS = 3000.0
"""gossip_bench stops reading this long after the last receipt (its QUIET_S)."""


def bench_latency(sim: Sim) -> dict[str, float]:
    """Latency percentiles as gossip_bench measures them: every batch delivered to a node
    (a feed's backfill too, which the simulation's own ``latency_ms`` leaves out: its receiver
    was not subscribed when it was published), up to ``BENCH_QUIET_MS`` after the rounds."""
    cut = sim.end_ms + BENCH_QUIET_MS
    lats = sorted(lat for m, v, lat in sim.deliveries
                  if not sim.is_boot[v] and sim.m_t[m] + lat <= cut)
    if not lats:
        return {"p50": 0.0, "p99": 0.0}
    return {"p50": lats[len(lats) // 2], "p99": lats[int(0.99 * (len(lats) - 1))]}


def replay(row: dict[str, Any], unit_ms: float, *, cores: int = 2, seeds: int = 3) -> dict[str, Any]:
    """The simulation of one real row (mean over ``seeds``) next to its measurements."""
    n, mode = row["nodes"], row["mode"]
    t0 = time.monotonic()
    runs = [Sim(_scenario(row, unit_ms, cores, seed)).run() for seed in range(seeds)]
    sims = [{**summarize(r, wall_s=0.0), "bench_latency": bench_latency(r)} for r in runs]

    def mean(get: Any) -> float:
        return statistics.fmean(get(s) for s in sims)

    # per publish round, as gossip_bench counts: the copies read over the whole run / batches
    rounds = row["batches_per_node"]
    real = {"inbound_per_node_round": row.get("inbound_per_node_round"),
            "latency_ms_p50": row["latency_ms_p50"], "latency_ms_p99": row["latency_ms_p99"],
            "deliveries_per_node_round": row["delivered"] / n / rounds}
    sim = {
        "inbound_per_node_round": mean(lambda s: s["per_node_per_round"]["inbound_copies"]["mean"]),
        "latency_ms_p50": mean(lambda s: s["bench_latency"]["p50"]),
        "latency_ms_p99": mean(lambda s: s["bench_latency"]["p99"]),
        "deliveries_per_node_round": mean(lambda s: s["per_node_per_round"]["first_deliveries"]["mean"]),
    }
    error = {k: round((sim[k] - real[k]) / real[k], 3) for k in real if real[k] is not None}
    return {"nodes": n, "mode": mode, "unit_ms": unit_ms,
            "background_cores": round(background(row, cores), 2),
            "load_before": row["load_before"], "real": real,
            "sim": {k: round(v, 1) for k, v in sim.items()}, "relative_error": error,
            "sim_wall_s": round(time.monotonic() - t0, 2)}
