"""DiLoCo-style outer steps on hivemind, with a consistency layer.

Public surface::

    loop = OuterLoop(OuterConfig(...), identity=..., group=fingerprint, params=model,
                     data_dir=..., discover=lambda: [maddr, ...])
                                     # starts p2pd and the DHT; or off the training thread:
    startup = Startup(lambda abort: OuterLoop(..., abort=abort))
    loop = startup.take()            # None until it is up; startup.cancel(timeout=...) leaves
    loop.collective_addrs()          # announce these
    loop.after_round(round)          # after every inner round; never blocks: steps meet on
                                     # the clock (schedule.py) and run in the background;
                                     # None, or the StepRecord of the step it just applied
                                     # (protocol/records.py; .to_dict() is its JSON)
    loop.outer_step()                # or: one step now, waited for (benches, tests)
    loop.finish()                    # the run ended: the last step, with the peers' last
                                     # steps (waits for them, bounded by final_wait_s)
    loop.close()                     # (without finish(): tells the waiting peers we left)

Layers, bottom up: ``codec`` (fp32/fp16/int8 strategies) and ``reduce`` (bounded,
deterministic shard mean) are pure; ``state`` (θ_global, momentum, hash, Nesterov);
``streams`` (frames); ``transport`` (p2pd with the node identity, DHT, asyncio thread);
``allreduce`` (the node's endpoint: handlers, state transfers, a ``session`` per attempt;
``matchmaking`` forms a ``group``, led by the first in ``leader``'s order; the reduce-scatter/all-gather with bit-parity:
``member`` on the member side, ``reducer`` on the reducer side);
``consistency`` (signed commits, canonical state); ``schedule`` (the clock: when to meet);
``work`` (one attempt's work: its snapshot and the shift it makes to the params; the
training thread's progress); ``holding`` (θ_global and the lineage, their one owner);
``catchup`` (what to adopt, state fetches); ``rendezvous`` (join records, the group read);
``vote`` (votes, version commits); ``finish`` (who steps when runs end, left records);
``record`` (the step record, deadlines); ``attempt`` (one attempt, rendezvous to commit,
orchestrating those); ``loop`` (OuterLoop); ``start`` (a loop built off the training
thread, abandonable).
"""

from __future__ import annotations

import importlib
from typing import Any

from collectives.config import OuterConfig
from collectives.errors import (CollectiveError, StartCancelled, StepFailed, SyncError,
                                TransportError)
from protocol.records import Status, StepRecord

__all__ = ["OuterConfig", "OuterLoop", "Startup", "Codec", "CODECS", "get_codec",
           "Status", "StepRecord", "CollectiveError", "StartCancelled", "StepFailed", "SyncError", "TransportError"]

_LAZY = {"OuterLoop": "collectives.loop", "Startup": "collectives.start",
         "Codec": "collectives.codec", "CODECS": "collectives.codec",
         "get_codec": "collectives.codec"}
"""Names whose modules import torch and hivemind: loaded on first use, so that the supervisor
can check an ``[outer]`` table (``collectives.config``) without either."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
