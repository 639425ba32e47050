"""CPU cost of validating one gossip payload (``protocol.open_envelope``), honest vs hostile.

    python bench/validation_cost.py [--repeat 50]

Prints one JSON line per payload: encoded bytes, median and p90 microseconds of
``open_envelope`` (size limits, msgpack, signature, schema), and the outcome (``ok`` or the
rejection reason). Payloads:

- ``small``: the 2-rollout batch the swarm tests use;
- ``real``: 8 rollouts x 8 completions x ~2 KB of text (a real model's round);
- ``unknown_scalar``: the small batch with one unknown scalar field (a newer peer's);
- ``bomb_10k``: the small batch plus 10k integers under an unknown key (within the object
  budget, over the unknown-key budget);
- ``bomb_63k``: the small batch plus ~63k msgpack integers under an unknown key (fits the old
  64 KiB body cap, as in the attack of issue 11);
- ``bomb_900k``: the same idea filling a whole 960 KiB message.
Every payload is signed by the sender's own key, so only the body's content is hostile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from protocol import Identity, ProtocolError, Rollout, RolloutBatch, TaskSpec, open_envelope
from protocol.envelope import _signed_bytes
from protocol.limits import packb
from protocol.version import PROTOCOL_VERSION

SWARM = "bench"


def small_batch() -> RolloutBatch:
    task = TaskSpec(family="arith", config={"digits": 2}, seed=0, index=0)
    ro = Rollout(task=task, prompt="m/0", completions=("x", "b"), rewards=(1.0, 0.0))
    return RolloutBatch(model="m", round=0, rollouts=(ro,) * 2)


def real_batch(rollouts: int = 8, completions: int = 8, chars: int = 2048) -> RolloutBatch:
    out = []
    for i in range(rollouts):
        task = TaskSpec(family="countdown", config={"min_numbers": 3, "max_numbers": 4}, seed=i,
                        index=i)
        texts = tuple(f"<think>{i}.{j} " + "step by step reasoning " * (chars // 23) + "</think>"
                      for j in range(completions))
        out.append(Rollout(task=task, prompt="Using the numbers 3 5 7, make 22. " * 4,
                           completions=texts, rewards=tuple(0.1 * j for j in range(completions)),
                           token_counts=tuple(len(t) // 4 for t in texts)))
    return RolloutBatch(model="Qwen/Qwen2.5-0.5B-Instruct@abc", round=3, rollouts=tuple(out))


def sign_body(me: Identity, type_: str, wire: dict[str, Any]) -> bytes:
    """Seal an arbitrary body map (what a hostile peer with its own key can send)."""
    body = packb(wire)
    ts, n = int(time.time() * 1000), bytes(16)
    sig = me.sign(_signed_bytes(PROTOCOL_VERSION, type_, me.public_key, SWARM, ts, n, body))
    return packb({"v": PROTOCOL_VERSION, "t": type_, "pk": me.public_key, "sw": SWARM, "ts": ts,
                  "n": n, "b": body, "s": sig})


def payloads(me: Identity) -> dict[str, bytes]:
    small = small_batch()
    return {
        "small": sign_body(me, small.TYPE, small.to_wire()),
        "real": sign_body(me, small.TYPE, real_batch().to_wire()),
        "unknown_scalar": sign_body(me, small.TYPE, small.to_wire() | {"new_field": 1}),
        "bomb_10k": sign_body(me, small.TYPE, small.to_wire() | {"x": [[0] * 1000] * 10}),
        "bomb_63k": sign_body(me, small.TYPE, small.to_wire() | {"x": [[0] * 1000] * 63}),
        "bomb_900k": sign_body(me, small.TYPE, small.to_wire() | {"x": [[0] * 1000] * 975}),
    }


def measure(data: bytes, repeat: int) -> dict[str, Any]:
    times, outcome = [], "ok"
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            open_envelope(data, swarm_id=SWARM)
        except ProtocolError as e:
            outcome = e.reason
        times.append(time.perf_counter() - t)
    times.sort()
    return {"bytes": len(data), "median_us": round(statistics.median(times) * 1e6, 1),
            "p90_us": round(times[int(0.9 * (len(times) - 1))] * 1e6, 1), "outcome": outcome}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    me = Identity.generate()
    for name, data in payloads(me).items():
        print(json.dumps({"payload": name, **measure(data, args.repeat)}), flush=True)


if __name__ == "__main__":
    main()
