"""Rollout feeds between real swarm processes: each node hears k sources it chose, rotating."""

from __future__ import annotations

import time

import pytest

from node.ipc_client import SocketBridge
from tests.swarm.conftest import Procs, batch
from tests.swarm.procs import wait_until

pytestmark = pytest.mark.slow

N = 5
K = 2
BATCHES = 8


def test_each_node_receives_only_its_sources_batches_and_rotates_them(procs: Procs) -> None:
    boot = procs.node("boot", learner=False, bootstrap_only=True)
    nodes = procs.nodes([f"n{i}" for i in range(N)], bootstrap=(boot.addr,), peers={"target": 2},
                        feeds={"sources": K, "rotate_s": 1.5, "cooldown_s": 5.0})
    bridges = [SocketBridge.connect(p.ready["ipc"], wait_s=30) for p in nodes]
    wait_until(lambda: all(br.stats().get("feed_sources", 0) == K for br in bridges),
               timeout_s=90, interval_s=0.25, what=f"{K} feeds open at every node")
    for r in range(BATCHES):
        for i, br in enumerate(bridges):
            br.publish(batch(f"model-{i}", r))
        time.sleep(0.5)
    got: list[list[tuple[str, str]]] = [[] for _ in bridges]

    def quiet() -> bool:
        new = 0
        for i, br in enumerate(bridges):
            for rec in br.receive("rollouts", max_items=1024):
                got[i].append((rec.message.model, rec.sender))
                new += 1
        return new == 0 and all(got)
    wait_until(quiet, timeout_s=30, interval_s=1.5, what="every node received, then quiet")

    ids = [p.peer_id for p in nodes]
    for i, br in enumerate(bridges):
        st = br.stats()
        # the sender is the publisher, as signed; nobody hears itself or the bootstrap peer
        assert all(sender == ids[int(model.split("-")[1])] for model, sender in got[i]), got[i]
        assert ids[i] not in {s for _, s in got[i]}
        # inbound is bounded by the feeds: at most K open at a time get each publish, and
        # each opened feed starts with at most one backfilled batch
        assert st["feed_frames"] <= K * BATCHES + st["feed_opened"], st
        assert st["received_rollouts"] == len(got[i]) <= st["feed_frames"], st
        assert st.get("received_rollouts", 0) < (N - 1) * BATCHES  # not a flood
        assert st["feed_rotated"] >= 1, st
        assert not {k for k in st if k.startswith("rejected_")} - {"rejected_duplicate"}, st
    # rotation: over the run, nodes heard more distinct senders than they hold feeds at once
    distinct = [len({s for _, s in g}) for g in got]
    assert sum(distinct) > K * N, distinct
    for br in bridges:
        br.close()
    for p in nodes + [boot]:
        assert p.stop() == 0, p.log()
