"""Versions by lineage, rebase, checked aggregation: real processes on loopback."""

from __future__ import annotations

import time

import numpy as np
import pytest

from collectives import OuterConfig

from tests.collectives.harness import Swarm, reference_theta

pytestmark = pytest.mark.slow
LR, MU = OuterConfig().optimizer.lr, OuterConfig().optimizer.momentum  # what the workers run


def _rel_err(got: np.ndarray, ref: np.ndarray, before: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(before - ref))


def test_fresh_key_takeover_is_rejected_and_never_fetched(swarm: Swarm) -> None:
    swarm.spawn("attacker", seed=666, module="tests.collectives.takeover_worker")
    # the honest peers start once the attacker's head is in the DHT (it writes its count of
    # forgeries after each store): started together, a loaded box had the attacker still
    # starting its p2pd while the honest peers took all three steps, and nothing to reject
    forged = swarm.root / "out" / "attacker.forged"
    deadline = time.monotonic() + 120
    while not forged.exists():
        assert time.monotonic() < deadline, "the attacker never stored its head"
        time.sleep(0.2)
    honest = ["h1", "h2"]
    for i, n in enumerate(honest):
        swarm.spawn(n, seed=i + 1, steps=3, peers=2, compression="none")
    swarm.wait_done(honest, timeout=150)
    recs = {n: swarm.records(n) for n in honest}
    momentum = np.zeros(0)
    for i in range(3):
        rs = [recs[n][i] for n in honest]
        assert len({r["param_hash"] for r in rs}) == 1, rs
        for r in rs:
            assert (r["status"], r["peers"], r["version"], r["resync_bytes"]) \
                == ("ok", 2, i + 1, 0), r
        arrs = [swarm.arrays(n, i) for n in honest]
        if i == 0:
            momentum = np.zeros(arrs[0]["before"].shape, np.float64)
        else:  # no jump between steps: θ before step i is θ after step i-1
            assert np.array_equal(arrs[0]["before"], swarm.arrays("h1", i - 1)["after"])
        ref, momentum = reference_theta(arrs[0]["before"], [a["delta"] for a in arrs],
                                        momentum, lr=LR, mu=MU)
        assert _rel_err(arrs[0]["after"], ref, arrs[0]["before"]) < 1e-5
        assert np.abs(arrs[0]["params"]).sum() > 100  # not the attacker's zeros
    rejected = recs["h1"][2]["rejected_commits_total"]
    assert rejected.get("unknown_parent", 0) >= 1, recs["h1"]
    assert int((swarm.root / "out" / "attacker.forged").read_text()) >= 1
    assert not (swarm.root / "out" / "attacker.served").exists()  # never fetched


def test_lone_peers_keep_their_params_then_average(swarm: Swarm) -> None:
    # step 0: a steps alone, then b steps alone (never at the same time); step 1: together
    swarm.spawn("a", seed=1, steps=2, peers=2, solo_steps=1, compression="none")
    swarm.spawn("b", seed=2, steps=2, peers=2, solo_steps=1, after="a", compression="none")
    swarm.wait_done(["a", "b"], timeout=150)
    ra, rb = swarm.records("a"), swarm.records("b")
    for r in (ra[0], rb[0]):
        assert (r["status"], r["version"], r["resync_bytes"]) == ("alone", 0, 0), r
    assert ra[0]["param_hash"] == rb[0]["param_hash"]  # θ_global untouched, same genesis
    for n in ("a", "b"):
        z = swarm.arrays(n, 0)
        assert np.array_equal(z["params"], z["local"])  # inner work kept
    assert ra[1]["status"] == rb[1]["status"] == "ok" and ra[1]["peers"] == 2
    assert ra[1]["param_hash"] == rb[1]["param_hash"] and ra[1]["weight"] == 4.0
    za, zb = swarm.arrays("a", 1), swarm.arrays("b", 1)
    # both deltas span all 4 rounds since genesis: nothing was discarded
    ref, _ = reference_theta(za["before"], [za["delta"], zb["delta"]],
                             np.zeros(za["before"].shape), lr=LR, mu=MU)
    assert _rel_err(za["after"], ref, za["before"]) < 1e-5
    assert ra[1]["discarded_rounds"] == rb[1]["discarded_rounds"] == 0


def test_rebase_keeps_work_made_after_the_last_version(swarm: Swarm) -> None:
    names = ["a", "b", "c"]
    for i, n in enumerate(names):
        swarm.spawn(n, seed=i + 1, steps=3, peers=3, compression="none",
                    skip_steps="1" if n == "c" else None)
    swarm.wait_done(names, timeout=180)
    recs = {n: swarm.records(n) for n in names}
    assert 1 not in recs["c"]  # c left step 1 out; a and b made version 2 without it
    assert recs["a"][1]["peers"] == 2 and recs["a"][1]["version"] == 2
    c2 = recs["c"][2]
    assert c2["resync_bytes"] > 0 and c2["status"] == "ok" and c2["peers"] == 3, c2
    assert c2["made_by"] == 2  # the version it adopted was a's and b's average
    assert len({recs[n][2]["param_hash"] for n in names}) == 1
    # c adopted version 2 by rebasing: its contribution at step 2 is all its work since
    # version 1 (4 rounds); an overwrite would have contributed only 2 rounds
    arrs = {n: {i: swarm.arrays(n, i) for i in range(3) if i in recs[n]} for n in names}
    mom = np.zeros(arrs["a"][0]["before"].shape, np.float64)
    _, mom = reference_theta(arrs["a"][0]["before"], [arrs[n][0]["delta"] for n in names], mom,
                             lr=LR, mu=MU)
    _, mom = reference_theta(arrs["a"][1]["before"], [arrs[n][1]["delta"] for n in "ab"], mom,
                             lr=LR, mu=MU)
    before = arrs["a"][2]["before"]
    # c's θ before its step-2 attempt was version 1; its delta then = −(its 4 rounds since)
    assert np.array_equal(arrs["c"][2]["before"], arrs["a"][1]["before"])
    ref, _ = reference_theta(before, [arrs[n][2]["delta"] for n in names], mom, lr=LR, mu=MU)
    assert _rel_err(arrs["a"][2]["after"], ref, before) < 1e-4
    assert c2["discarded_rounds"] == 0


def test_poisoned_reducers_fail_the_step_for_everyone_consistently(swarm: Swarm) -> None:
    honest = ["h1", "h2", "h3"]
    for i, n in enumerate(honest):
        swarm.spawn(n, seed=i + 1, steps=1, peers=5, compression="none")
    swarm.spawn("rnan", seed=10, steps=1, peers=5, compression="none", poison_reducer="nan")
    swarm.spawn("rbig", seed=11, steps=1, peers=5, compression="none", poison_reducer="huge")
    everyone = honest + ["rnan", "rbig"]
    swarm.wait_done(everyone, timeout=120)
    recs = [swarm.records(n)[0] for n in everyone]
    assert len({r["param_hash"] for r in recs}) == 1, recs  # equal hashes kept
    for r in recs:
        assert r["status"] == "failed" and r["version"] == 0 and r["peers"] == 5, r
    for r in recs[:3]:
        assert r["bad_shards"] == {swarm_peer(swarm, "rnan"): "non_finite",
                                   swarm_peer(swarm, "rbig"): "norm"}, r
    for n in honest:  # members kept their own params: nothing poisoned was applied
        z = swarm.arrays(n, 0)
        assert np.array_equal(z["params"], z["local"]) and np.isfinite(z["params"]).all()


def swarm_peer(swarm: Swarm, name: str) -> str:
    return (swarm.root / "addrs" / f"{name}.txt").read_text().split()[0].rsplit("/p2p/", 1)[1]
