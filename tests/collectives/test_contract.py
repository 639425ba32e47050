"""The OuterLoop contract in-process: identity, addresses, alone within the deadline."""

from __future__ import annotations

import asyncio
import os
import stat
import time

import torch

from collectives import OuterConfig, OuterLoop, Status
from collectives.config import ScheduleConfig, TransportConfig
from protocol import Identity


def test_alone_loop_keeps_params_and_respects_deadline(tmp_path) -> None:
    identity = Identity.generate()
    dead = f"/ip4/127.0.0.1/tcp/9/p2p/{Identity.generate().peer_id}"  # valid, unreachable
    model = torch.nn.Linear(8, 4)
    cfg = OuterConfig(every_rounds=3, schedule=ScheduleConfig(deadline_s=4.0, join_window_s=0.5))
    loop = OuterLoop(cfg, identity=identity, group="fp", params=model, data_dir=str(tmp_path),
                     discover=lambda: ["/ip4/127.0.0.1/tcp/1/p2p/not-a-peer", "garbage", dead])
    try:
        addrs = loop.collective_addrs()
        assert addrs and all(a.endswith(f"/p2p/{identity.peer_id}") for a in addrs)
        key = tmp_path / "hivemind_identity.key"
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
        assert key.read_bytes() == identity.libp2p_private_key_protobuf()
        assert loop.maybe_outer_step(0) is None and loop.maybe_outer_step(1) is None
        with torch.no_grad():
            model.weight.add_(1.0)
        before = [p.detach().clone() for p in model.parameters()]
        t = time.monotonic()
        got = loop.maybe_outer_step(2)
        assert time.monotonic() - t < cfg.schedule.deadline_s + 2
        assert got is not None and got.status is Status.ALONE and got.peers == 1, got
        rec = got.to_dict()  # the JSON a node emits
        assert rec["status"] == "alone"
        for k in ("step", "peers", "param_hash", "seconds", "bytes_sent"):
            assert k in rec
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        # alone changes nothing: the version and the hash stay (no ping-pong with others)
        assert rec["step"] == rec["version"] == 0 and rec["rejected_commits"] == {}
        again = loop.maybe_outer_step(5)
        assert again is not None and again.step == 0 and again.param_hash == got.param_hash
        assert again.weight == 4.0 and again.observed["discarded_rounds"] == 0
    finally:
        loop.close()


def test_dead_dht_process_is_restarted(tmp_path) -> None:
    import signal

    from collectives.transport import Transport

    # a fresh policy: the main thread has no loop and may make one implicitly, as in a new
    # process (an earlier asyncio.run in this session forbids that, and would hide the leak)
    policy = asyncio.DefaultEventLoopPolicy()
    asyncio.set_event_loop_policy(policy)
    t = Transport(OuterConfig(transport=TransportConfig(dht_min_interval_s=0.0,
                                                        startup_timeout_s=60)),
                  identity=Identity.generate(),
                  data_dir=str(tmp_path), initial_peers=[])
    try:
        assert t.dht_store("k", "a", b"1", ttl=30, timeout=5)
        # let the child leave hivemind's cross-process MPFuture lock first: a child killed
        # while holding it deadlocks every later DHT in this process (see _start_dht)
        time.sleep(1.0)
        os.kill(t._dht.pid, signal.SIGKILL)  # the DHT child dies (seen in the field)
        t._dht.join(10)
        assert t.dht_store("k", "b", b"2", ttl=30, timeout=5)
        assert t.dht_restarts == 1
        assert t.dht_get("k", timeout=5).get("b") == b"2"
    finally:
        t.close()
        asyncio.set_event_loop_policy(None)
    # hivemind's MPFuture asks for the caller's event loop: on the main thread that made a
    # loop nobody closed, finalized unclosed by GC in some later test (issue 28)
    assert policy._local._loop is None, "the transport left an event loop on the main thread"
