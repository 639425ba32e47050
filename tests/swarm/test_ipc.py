"""The learner's SocketBridge against a real swarm process: refusals and malformed frames are
answered or counted, never fatal."""

from __future__ import annotations

import socket

import pytest

from node.ipc_client import RequestRefused, SocketBridge
from protocol import OuterVersion, PeerAnnouncement, Rollout, RolloutBatch, TaskSpec
from tests.swarm.conftest import Procs
from tests.swarm.procs import wait_until

pytestmark = pytest.mark.slow


def test_bridge_refusals_and_garbage_do_not_hurt_the_swarm_process(procs: Procs) -> None:
    p = procs.node("solo")
    with SocketBridge.connect(p.ready["ipc"]) as br:
        br.announce(model="m", capabilities=("train",))
        small = Rollout(task=TaskSpec(family="f", seed=0, index=0), prompt="p",
                        completions=("c",))
        br.publish(RolloutBatch(model="m", round=0, rollouts=(small,)))
        with pytest.raises(RequestRefused, match="publish takes"):
            br.publish(PeerAnnouncement(peer_id="x", addrs=()))
        with pytest.raises(RequestRefused, match="publish takes"):  # DHT records, not gossip
            br.publish(OuterVersion(group="g", step=1, state_hash="ab" * 32, parent="cd" * 32,
                                    members=(), period=1))
        big = Rollout(task=TaskSpec(family="f", seed=0, index=0), prompt="p" * 16000,
                      completions=("c" * 16000,) * 4)
        with pytest.raises(RequestRefused, match="too large"):
            br.publish(RolloutBatch(model="m", round=0, rollouts=(big,) * 16))
        with pytest.raises(RequestRefused, match="max_items"):
            br.receive("rollouts", max_items=0)
        br.sources({"12D3KooWsome": 3})  # the learner's report of who delivered (swarm.feeds)
        br.sources({"12D3KooWsome": 3}, {"12D3KooWsome": 5, "12D3KooWother": 2})
        br.sources({"12D3KooWsome": 3}, own=7)  # and our own groups with signal
        for bad_own in (-1, 2**60):
            with pytest.raises(RequestRefused, match="own: int >= 0"):
                br.sources({}, own=bad_own)
        for bad in ({"p": -1}, {"p": 1.5}, {"": 1}, {f"p{i}": 1 for i in range(257)}):
            with pytest.raises(RequestRefused, match="sources needs"):
                br.sources(bad)  # type: ignore[arg-type]
            with pytest.raises(RequestRefused, match="sources needs"):
                br.sources({}, bad)  # type: ignore[arg-type]
        assert br.receive("rollouts") == [] and br.peers() == []

        with socket.socket(socket.AF_UNIX) as raw:  # a frame that is not msgpack
            raw.settimeout(10)
            raw.connect(p.ready["ipc"])
            raw.sendall(b"\x00\x00\x00\x02\xc1\xc1")
            assert raw.recv(4096)  # an error response, then the server closes
            assert raw.recv(4096) == b""
        # the first connection still works; the batch left through the publish loop
        st = wait_until(lambda: (s := br.stats()).get("published_rollouts") and s,
                        timeout_s=10, what="the batch published")
        assert st["rejected_ipc_malformed"] == 1 and st["published_rollouts"] == 1
