"""Properties of the gossip simulation (bench/sim) that a wrong model would break."""

from __future__ import annotations

import random

import pytest

from bench.sim.calibrate import _scenario, costs_from_unit, fit_by_sim, fit_unit
from bench.sim.config import Network, Sapo, Scenario, Scheme
from bench.sim.engine import Sim
from bench.sim.metrics import gini, summarize
from bench.sim.pool import SimPool


def sim(n: int, kind: str, *, rounds: int = 4, **kw: object) -> dict:
    sc = Scenario(n=n, rounds=rounds, scheme=Scheme(kind=kind), **kw)  # type: ignore[arg-type]
    return summarize(Sim(sc).run(), wall_s=0.0)


def inbound(res: dict) -> float:
    return res["per_node_per_round"]["inbound_copies"]["mean"]


def test_flood_delivers_everything_and_inbound_grows_linearly() -> None:
    small, big = sim(8, "flood"), sim(48, "flood")
    for res, n in ((small, 8), (big, 48)):
        assert res["delivery_ratio"] == 1.0
        assert res["per_node_per_round"]["first_deliveries"]["mean"] == pytest.approx(n - 1, rel=0.02)
    # N^1 growth of firsts, plus the mesh's duplicates on each: 6x the peers, >= 4x the copies
    assert inbound(big) / inbound(small) >= 4.0
    assert big["per_node_per_round"]["duplicates"]["mean"] > 2 * (48 - 1)


def test_feeds_inbound_stays_within_config_bound_whatever_n() -> None:
    k = Scheme().feed_sources
    rs = {n: sim(n, "feeds", rounds=6) for n in (16, 64, 256)}
    for res in rs.values():
        # k feeds, one batch per source per round, plus one backfill per rotation (rotate_s = round)
        assert inbound(res) <= k + 1.5
        assert res["per_node_per_round"]["first_deliveries"]["mean"] >= k * 0.9
        assert res["delivery_ratio"] >= 0.99
    assert inbound(rs[256]) / inbound(rs[16]) < 1.2
    bw = [rs[n]["per_node_rollouts"]["bytes_in_per_s"]["mean"] for n in (16, 256)]
    assert bw[1] / bw[0] < 1.2


def test_churn_loses_copies_but_keeps_delivery_and_supply() -> None:
    calm = sim(100, "feeds", rounds=12)
    churn = sim(100, "feeds", rounds=12, churn_per_min=0.3)
    assert calm["lost_copies"] == 0 and churn["lost_copies"] > 0
    assert churn["peers_ever"] > 100
    assert churn["feeds"]["failed_picks"] > 0 and churn["feeds"]["slots_held"] < calm["feeds"]["slots_held"]
    assert churn["delivery_ratio"] >= 0.97
    first = "first_deliveries"
    assert churn["per_node_per_round"][first]["mean"] >= 0.8 * calm["per_node_per_round"][first]["mean"]


def test_same_seed_same_result_other_seed_differs() -> None:
    a, b, c = sim(40, "feeds", seed=3), sim(40, "feeds", seed=3), sim(40, "feeds", seed=4)
    assert a == b
    assert a != c


def test_feeds_spread_senders_the_issue_asks_for() -> None:
    res = sim(32, "feeds", rounds=12)["sapo_spread"]
    assert res["nodes"] == 32
    assert res["distinct_senders"]["min"] >= 3
    assert res["top_sender_share"]["mean"] <= 0.35  # no source dominates a node (rotation)


def test_testbed_latency_grows_with_background_load() -> None:
    def p99(load: float) -> float:
        sc = Scenario(n=12, rounds=4, round_s=1.0, synchronized=True, deadline_rounds=60,
                      costs=costs_from_unit(3.0, batch_bytes=1550),
                      network=Network(mode="testbed", cores=2, background_load=load),
                      scheme=Scheme(kind="flood", connections=4, announce_interval_s=1e9,
                                    announce_rate_per_s=0.0))
        return summarize(Sim(sc).run(), wall_s=0.0)["latency_ms"]["p99"]
    assert p99(1.6) > 2 * p99(0.0)


def test_pool_caps_one_sender_and_the_newcomer_bucket() -> None:
    cfg = Sapo(p_pass=1.0, p_useful=1.0)
    pool = SimPool(cfg, random.Random(0))
    for _ in range(50):
        pool.add(7, 0, 0)  # one untrusted sender floods
    assert len(pool.entries) <= cfg.sender_pool_share * cfg.pool_capacity
    assert pool.take(0) == [7] * cfg.newcomer_round  # untrusted: the newcomer budget, not J
    for s in range(1, 20):
        pool.add(s, 0, 0)
    assert len(pool.take(0)) <= cfg.newcomer_round  # twenty fresh keys: still one budget


def test_fit_recovers_a_known_unit() -> None:
    def row(n: int, u: float) -> dict:
        f, d, p = n * 15 * 10.0, n * 40.0, n * 10
        cpu = u * (1.3 * f + 0.8 * d + 0.5 * p) / 1000 + 0.4 * 20  # idle 0.4 cores over 20 s
        return {"mode": "flood", "nodes": n, "delivered": f, "delivered_per_s": f / 20,
                "cpu_s_total": cpu, "idle_cpu_per_s": 0.4, "duplicates": d, "batches_per_node": 10}
    fit = fit_unit([row(16, 2.5), row(32, 2.5)])
    assert fit["unit_ms"] == pytest.approx(2.5, rel=1e-6)
    assert fit["spread"] == pytest.approx(0.0, abs=1e-6)
    assert fit_unit([row(16, 2.0), row(32, 3.0)])["spread"] > 0.3


def test_fit_by_sim_finds_the_unit_that_spent_the_cpu() -> None:
    row = {"mode": "flood", "nodes": 8, "batches_per_node": 3, "interval_s": 1.0, "sources": None,
           "idle_cpu_per_s": 0.2, "load_before": [0.5, 0.5, 0.5], "delivered": 168,
           "delivered_per_s": 168 / 4.0}
    spent = sum(Sim(_scenario(row, 3.0, 2, 0)).run().cpu.cpu_ms) / 1000
    row["cpu_s_total"] = spent + 0.2 * 4.0
    assert fit_by_sim(row, start_ms=1.0) == pytest.approx(3.0, rel=0.05)


def test_announcements_per_node_stay_flat_with_the_built_period_and_grow_without() -> None:
    from bench.sim.announce import announce_load
    built = {n: announce_load(Scenario(n=n, scheme=Scheme(kind="feeds")), n) for n in
             (16, 100, 1000, 2400)}
    fixed = {n: announce_load(Scenario(n=n, scheme=Scheme(kind="feeds", announce_rate_per_s=0.0)), n)
             for n in (16, 1000)}
    rate = Scheme().announce_rate_per_s
    assert all(a.firsts_per_s <= rate for a in built.values())
    assert built[2400].cpu_ms_per_s / built[16].cpu_ms_per_s < 1.5  # flat up to rate x 600 s
    assert fixed[1000].firsts_per_s > 40 * rate  # the 5 s period: O(N)
    assert built[1000].period_s == 250.0 and built[1000].table_ttl_s == 750.0
    # churn: departed peers still on schedule lengthen the period a little, boundedly
    churned = announce_load(Scenario(n=1000, churn_per_min=0.1, scheme=Scheme(kind="feeds")), 1000)
    assert 250.0 < churned.period_s <= 600.0 and churned.firsts_per_s <= rate


def test_make_before_break_rotation_keeps_every_slot_and_sends_no_rotation_backfill() -> None:
    def run(mbb: bool) -> dict:
        sc = Scenario(n=24, rounds=8, round_s=5.0,
                      scheme=Scheme(kind="feeds", feed_rotate_s=5.0, feed_make_before_break=mbb))
        return summarize(Sim(sc).run(), wall_s=0.0)
    new, old = run(True), run(False)
    k = Scheme().feed_sources
    # the old rotation backfilled the newest batch on every replacement: copies beyond k
    assert inbound(old) > inbound(new)
    assert new["per_node_per_round"]["first_deliveries"]["mean"] >= 0.97 * k
    assert inbound(new) <= k + 0.3


def test_gini() -> None:
    assert gini([1, 1, 1, 1]) == 0.0
    assert gini([0, 0, 0, 4]) == pytest.approx(0.75)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Scheme(kind="broadcast")
    with pytest.raises(ValueError):
        Network(mode="testbed", cores=2, background_load=2.0)
    with pytest.raises(ValueError):
        Scenario(n=1)
