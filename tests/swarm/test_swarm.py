"""Real swarm processes on loopback: a swarm forms from one bootstrap address and gossips."""

from __future__ import annotations

import time

import pytest

from node.ipc_client import SocketBridge
from tests.swarm.conftest import Procs, batch
from tests.swarm.procs import wait_until

pytestmark = pytest.mark.slow

N = 8


def wait_stable(bridges: list[SocketBridge], *, quiet_s: float = 3.0) -> None:
    """Wait until no node's connection count changed for quiet_s."""
    last: list[int] = []
    since = time.monotonic()

    def stable() -> bool:
        nonlocal last, since
        now = [br.stats()["connections"] for br in bridges]
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= quiet_s
    wait_until(stable, timeout_s=30, interval_s=0.25, what="a stable topology")
ROUNDS = 5
PER_ROUND = 1


def test_eight_processes_form_a_swarm_and_every_batch_arrives(procs: Procs) -> None:
    """rollout_mode="flood": every batch reaches every node over gossip (the baseline mode;
    feeds mode is tests/swarm/test_feeds.py)."""
    boot = procs.node("boot", learner=False, bootstrap_only=True, rollout_mode="flood")
    nodes = procs.nodes([f"n{i}" for i in range(N)], bootstrap=(boot.addr,), peers={"target": 4},
                        rollout_mode="flood")
    bridges = [SocketBridge.connect(p.ready["ipc"], wait_s=30) for p in nodes]
    try:
        for i, br in enumerate(bridges):
            br.announce(model=f"model-{i}", capabilities=("train",))

        # discovery: every node learns every other node (and the bootstrap peer) from announcements
        expected = {p.peer_id: (f"model-{j}", False) for j, p in enumerate(nodes)}
        expected[boot.peer_id] = ("", True)

        def everyone_known() -> bool:
            return all({a.peer_id: (a.model, a.bootstrap_only) for a in br.peers()}
                       == {k: v for k, v in expected.items() if k != me.peer_id}
                       for br, me in zip(bridges, nodes))
        wait_until(everyone_known, timeout_s=90, what="all peers discovered")
        # connection maintenance: nodes dial discovered peers beyond the bootstrap peer; wait
        # until the topology is stable (py-libp2p loses gossip while connections are being set
        # up: see swarm/discovery.py), then load it
        wait_until(lambda: all(br.stats()["peers"] >= 2 for br in bridges), timeout_s=90,
                   what="each node connected beyond the bootstrap peer")
        wait_stable(bridges)

        # steady load: every node publishes ROUNDS batches; every other node receives all of them
        for r in range(ROUNDS):
            for i, br in enumerate(bridges):
                for k in range(PER_ROUND):
                    br.publish(batch(f"model-{i}", r * PER_ROUND + k))
            time.sleep(0.2)
        want = {(f"model-{i}", r) for i in range(N) for r in range(ROUNDS * PER_ROUND)}
        got: list[set[tuple[str, int]]] = [set() for _ in bridges]
        senders: list[dict[str, str]] = [{} for _ in bridges]

        def all_arrived() -> bool:
            for i, br in enumerate(bridges):
                for rec in br.receive("rollouts", max_items=1024):
                    got[i].add((rec.message.model, rec.message.round))
                    senders[i][rec.message.model] = rec.sender
            return all(g == want - {(f"model-{i}", r) for r in range(ROUNDS * PER_ROUND)}
                       for i, g in enumerate(got))
        wait_until(all_arrived, timeout_s=30, what="every batch at every node")
        for i, s in enumerate(senders):  # the sender is the publisher's peer id, as signed
            for j, p in enumerate(nodes):
                if i != j:
                    assert s[f"model-{j}"] == p.peer_id
        for br in bridges:
            st = br.stats()
            assert st["published_rollouts"] == ROUNDS * PER_ROUND
            assert st["received_rollouts"] == (N - 1) * ROUNDS * PER_ROUND  # no duplicates either
            bad = {k: v for k, v in st.items() if k.startswith(("rejected_", "dropped_"))}
            assert not bad, bad
    finally:  # a failed wait must not leave the IPC sockets to the garbage collector
        for br in bridges:
            br.close()
    for p in nodes + [boot]:
        assert p.stop() == 0, p.log()
