"""The outer step applied and hashed chunk by chunk as the average lands (landing.py) is the
same state, bit for bit, with the same hash as the whole-vector step and a full hash; and
the blockwise state hash equals its serial definition."""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from collectives.codec import chunk_bounds
from collectives.landing import Landing
from collectives.reduce import shard_bounds
from collectives.state import HASH_BLOCK, OuterState

NUMEL = 3 * HASH_BLOCK + 12345  # shards of 3 members straddle hash blocks


def _state(seed: int) -> OuterState:
    g = torch.Generator().manual_seed(seed)
    return OuterState(theta=torch.randn(NUMEL, generator=g),
                      momentum=torch.randn(NUMEL, generator=g), applied=4)


def _ranges(members: int, chunk: int) -> list[tuple[int, int]]:
    """The exchange's grid: chunks of every member's shard, in global offsets."""
    return [(lo + a, lo + b) for lo, hi in shard_bounds(NUMEL, members)
            for a, b in chunk_bounds(hi - lo, chunk)]


@pytest.mark.parametrize("mu", [0.9, 0.0])
def test_landing_in_any_order_and_twice_equals_stepped_and_its_hash(mu: float) -> None:
    base = _state(1)
    avg = torch.randn(NUMEL, generator=torch.Generator().manual_seed(2))
    ref = base.stepped(avg.clone(), lr=0.7, momentum=mu)
    fresh = OuterState(theta=ref.theta.clone(), momentum=ref.momentum.clone(),
                       applied=ref.applied).hash()  # nothing cached
    ranges = _ranges(3, 100_000)
    random.Random(3).shuffle(ranges)
    buf = torch.full((NUMEL,), float("nan"))
    landing = Landing(base, buf, lr=0.7, momentum=mu)
    half = len(ranges) // 2
    for lo, hi in ranges[:half]:  # a "redo" lands a range again, after a wrong first value
        landing.land(lo, hi)
    buf.copy_(avg * 3)
    for lo, hi in ranges[:half]:
        landing.land(lo, hi)
    assert landing.state() is None  # half of the values never landed
    buf.copy_(avg)
    with ThreadPoolExecutor(2) as pool:  # the codec pool lands ranges concurrently
        list(pool.map(lambda r: landing.land(*r), ranges))
    landing.land(*ranges[0])  # twice with the same values changes nothing
    new = landing.state()
    assert new is not None and new.applied == base.applied + 1
    assert torch.equal(new.theta, ref.theta) and torch.equal(new.momentum, ref.momentum)
    assert new.hash() == ref.hash() == fresh
    assert torch.equal(base.theta, _state(1).theta)  # the base is never written
    new.theta[7] += 1.0  # a later write invalidates the recorded hash
    assert new.hash() != fresh


def test_blockwise_hash_is_its_serial_definition() -> None:
    st = _state(5)
    h = hashlib.sha256(b"swarm-node/outer-state/v3")
    h.update(st.applied.to_bytes(8, "little") + NUMEL.to_bytes(8, "little"))
    t, m = st.theta.numpy().astype("<f4"), st.momentum.numpy().astype("<f4")
    for lo in range(0, NUMEL, HASH_BLOCK):
        h.update(hashlib.sha256(t[lo:lo + HASH_BLOCK].tobytes()
                                + m[lo:lo + HASH_BLOCK].tobytes()).digest())
    assert st.hash() == h.hexdigest()
    empty = OuterState(theta=torch.zeros(0), momentum=torch.zeros(0))
    assert empty.hash() == hashlib.sha256(b"swarm-node/outer-state/v3" + bytes(16)).hexdigest()
    assert np.array_equal(t, st.theta.numpy())
