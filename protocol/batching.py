"""Pack a round's rollouts into RolloutBatches that each fit one sealed message.

The sender sizes batches by their encoded bytes against ``envelope.max_body_bytes`` (derived
from ``Limits.max_message_bytes``, the one size limit of the wire), so every batch an honest
peer publishes is one every honest receiver accepts.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.envelope import max_body_bytes
from protocol.limits import DEFAULT_LIMITS, Limits, packb
from protocol.messages import MAX_BATCH_ROLLOUTS, Rollout, RolloutBatch

__all__ = ["split_rollouts"]

_ARRAY_HEADER = 3  # msgpack array16 header: the rollouts list of up to 64 items


def split_rollouts(model: str, round_: int, rollouts: Sequence[Rollout], *,
                   limits: Limits = DEFAULT_LIMITS) -> tuple[list[RolloutBatch], list[Rollout]]:
    """``(batches, too_large)``: the rollouts in order, in as few batches as fit (at most
    MAX_BATCH_ROLLOUTS each, encoded body at most ``max_body_bytes(limits)``), and those
    rollouts that alone exceed a message (the caller reports them; nobody would accept them).
    """
    budget = max_body_bytes(limits)
    head = len(packb({"model": model, "round": round_, "rollouts": []})) + _ARRAY_HEADER
    batches: list[RolloutBatch] = []
    too_large: list[Rollout] = []
    chunk: list[Rollout] = []
    size = head
    for r in rollouts:
        r_size = len(packb(r.to_wire()))
        if head + r_size > budget:
            too_large.append(r)
            continue
        if chunk and (size + r_size > budget or len(chunk) == MAX_BATCH_ROLLOUTS):
            batches.append(RolloutBatch(model=model, round=round_, rollouts=tuple(chunk)))
            chunk, size = [], head
        chunk.append(r)
        size += r_size
    if chunk:
        batches.append(RolloutBatch(model=model, round=round_, rollouts=tuple(chunk)))
    return batches, too_large
