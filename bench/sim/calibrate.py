"""Per-message costs from real runs (``bench/sim/realrun.py``), and the simulation's error on them.

1. **Costs.** Over a run's publish window the swarm processes spent ``cpu_s_window``; the idle
   rate measured just before (announcements, heartbeats) times the window is taken out, and so
   are the idle duplicates (announcement copies), leaving the rollout traffic's CPU and copies:
   F first deliveries, D redundant copies, P publishes. The cost model has one free unit ``u``
   with swarm/SCALING.md's ratios: a first copy costs u (``copy_ms`` = ``first_ms`` = u / 2: a
   redundant copy is half a delivery), every copy sent ``send_ms`` = 0.3 u, a publish u / 2:
   ``cpu = u (1.3 F + 0.8 D + 0.5 P)``, least squares over the runs. How far each run's own u
   is from the common one says how well one cost model fits both sizes.
2. **Error.** Each real run is replayed in the simulation's testbed mode (same N, bootstrap,
   ``target_peers``, synchronised publishes, 2 shared cores, the measured idle load and the
   other processes' load average as background) and the simulated inbound copies per node,
   latency percentiles and CPU are compared with the measured ones.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.sim.config import Costs, Network, Scenario, Scheme
from bench.sim.engine import Sim
from bench.sim.metrics import summarize

__all__ = ["costs_from_unit", "fit_unit", "replay"]

BENCH_BATCH_BYTES = 1_550
"""gossip_bench's batch (8 tiny rollouts): 1,323 sealed bytes + pubsub framing (measured with
protocol.envelope.seal)."""
BENCH_ANNOUNCE_S = 1.0
"""tests/swarm/conftest.py FAST: announce_interval_s of the benchmark's processes."""


def costs_from_unit(u: float, **kw: Any) -> Costs:
    return Costs(copy_ms=u / 2, first_ms=u / 2, send_ms=0.3 * u, publish_ms=u / 2,
                 control_ms=0.1 * u, **kw)


def _rollout_part(run: dict[str, Any]) -> tuple[float, float, float, float]:
    """(cpu ms, first deliveries, redundant copies, publishes) of the rollout traffic."""
    window, idle = run["window_s"], run["idle_s"]
    n = run["nodes"]
    cpu = 1000 * (run["cpu_s_window"] - run["cpu_s_idle"] * window / idle)
    dups = n * (run["duplicates_mean"] - run["idle_duplicates_mean"] * window / idle)
    return cpu, run["delivered"], max(0.0, dups), n * run["batches_per_node"]


def fit_unit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares ``u`` over the runs, and each run's own."""
    xs, ys, own = [], [], []
    for r in runs:
        cpu, f, d, p = _rollout_part(r)
        x = 1.3 * f + 0.8 * d + 0.5 * p
        xs.append(x)
        ys.append(cpu)
        own.append(round(cpu / x, 3))
    u = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return {"unit_ms": round(u, 3), "per_run_unit_ms": own,
            "spread": round((max(own) - min(own)) / u, 3) if len(own) > 1 else None}


def background(run: dict[str, Any], cores: int) -> float:
    """Cores' worth of CPU the rollout traffic could not have: our idle rate plus the share
    the machine's other runnable processes take under fair sharing when we are busy."""
    ours_idle = run["cpu_s_idle"] / run["idle_s"]
    others = max(0.0, run["loadavg_before"][0] - ours_idle)
    return min(0.95 * cores, ours_idle + cores * others / (others + cores))


def replay(run: dict[str, Any], unit_ms: float, *, scheme: str = "flood", cores: int = 2,
           seeds: int = 3) -> dict[str, Any]:
    """The simulation of one real run (mean over ``seeds``) next to its measurements."""
    n = run["nodes"]
    sims = []
    t0 = time.monotonic()
    for seed in range(seeds):
        sc = Scenario(
            n=n, rounds=run["batches_per_node"], round_s=run["interval_s"], synchronized=True,
            deadline_rounds=60 / run["interval_s"], seed=seed,
            costs=costs_from_unit(unit_ms, batch_bytes=BENCH_BATCH_BYTES),
            network=Network(mode="testbed", cores=cores, background_load=background(run, cores)),
            # announcements are in the measured idle load, not modelled again
            scheme=Scheme(kind=scheme, connections=4, announce_interval_s=1e9))
        sims.append(summarize(Sim(sc).run(), wall_s=0.0))
    wall = time.monotonic() - t0

    def mean(get: Any) -> float:
        return statistics.fmean(get(s) for s in sims)

    _, f, d, _ = _rollout_part(run)
    real = {"inbound_copies_per_node": (f + d) / n, "duplicates_per_node": d / n,
            "latency_ms_p50": run["latency_ms"]["p50"], "latency_ms_p99": run["latency_ms"]["p99"],
            "delivered": run["delivered"]}
    rounds = run["batches_per_node"]
    sim = {
        "inbound_copies_per_node": mean(lambda s: s["per_node_per_round"]["inbound_copies"]["mean"])
        * rounds,
        "duplicates_per_node": mean(lambda s: s["per_node_per_round"]["duplicates"]["mean"]) * rounds,
        "latency_ms_p50": mean(lambda s: s["latency_ms"]["p50"]),
        "latency_ms_p99": mean(lambda s: s["latency_ms"]["p99"]),
        "delivered": mean(lambda s: s["delivered"]),
    }
    error = {k: round((sim[k] - real[k]) / real[k], 3) for k in real if real[k]}
    return {"nodes": n, "scheme": scheme, "unit_ms": unit_ms,
            "background_cores": round(background(run, cores), 2),
            "loadavg_before": run["loadavg_before"], "real": real,
            "sim": {k: round(v, 1) for k, v in sim.items()}, "relative_error": error,
            "sim_wall_s": round(wall, 2)}
