"""The reducer's norm bound in a group of two (reduce.py ``norm_limit``): the reference is the
larger of the reducer's own contribution's norm and the last accepted mean's size, so a
reducer whose own delta is ~0 (it just rebased, trained little, finished) still averages an
honest peer's delta in, and a blown-up one stays out."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
import torch

from collectives import OuterConfig
from collectives.codec import CHUNK_VALUES
from collectives.errors import StepFailed
from collectives.reduce import Contribution, chunk_stats, plain_mean_holds, reduce_shard
from tests.collectives.test_exchange import _group, _members

BOUNDS = dict(max_weight=1000.0, max_norm=float("inf"), max_norm_ratio=10.0)
N = 3000


def _holds(vals: dict[str, torch.Tensor], own: str, ref_rms: float, **bounds: float) -> bool:
    """``plain_mean_holds`` on per-chunk statistics, as the streaming reducer gathers them."""
    sq = {p: 0.0 for p in vals}
    for a in range(0, N, 700):
        s, _ = chunk_stats({p: v[a : a + 700] for p, v in vals.items()})
        for p in vals:
            sq[p] += s[p]
    return plain_mean_holds(weights={p: 1.0 for p in vals}, sq_norms=sq, sq_offsets={},
                            own=own, ref_rms=ref_rms, numel=N, **{**BOUNDS, **bounds})


def _reduce(vals: dict[str, torch.Tensor], own: str, ref_rms: float, **bounds: float):
    return reduce_shard([Contribution(peer=p, weight=1.0, values=v) for p, v in vals.items()],
                        own=own, ref_rms=ref_rms, **{**BOUNDS, **bounds})


def test_own_delta_zero_accepts_an_honest_peer_and_excludes_a_blown_up_one() -> None:
    g = torch.Generator().manual_seed(21)
    peer = torch.randn(N, generator=g) * 1e-2
    last_mean_rms = 1e-2 / math.sqrt(2)  # the mean of two such deltas, last step
    for own in (torch.zeros(N), peer * 1e-4):  # exactly zero; trained a round since rebasing
        vals = {"a": own, "b": peer}
        # before: the reference was the own norm alone, so b was excluded
        assert _reduce(vals, "a", 0.0).excluded == {"b": "norm"}
        res = _reduce(vals, "a", last_mean_rms)
        assert res.excluded == {} and res.accepted == ("a", "b")
        assert torch.allclose(res.mean, (own + peer) / 2, atol=1e-7)
        assert _holds(vals, "a", last_mean_rms)  # the streamed plain mean stands
        hostile = {"a": own, "b": peer * 1000}
        assert _reduce(hostile, "a", last_mean_rms).excluded == {"b": "norm"}
        assert not _holds(hostile, "a", last_mean_rms)
        # the limit is max_norm_ratio x the reference: just under 10x the last mean's size
        # (scaled to the shard's length) passes, just over does not
        edge = peer / float(peer.norm()) * last_mean_rms * math.sqrt(N)
        assert _reduce({"a": own, "b": edge * 9.99}, "a", last_mean_rms).excluded == {}
        assert _reduce({"a": own, "b": edge * 10.01}, "a", last_mean_rms).excluded \
            == {"b": "norm"}
        # max_norm stays absolute
        tight = float(peer.norm()) / 2
        assert _reduce(vals, "a", last_mean_rms, max_norm=tight).excluded == {"b": "norm"}
        assert not _holds(vals, "a", last_mean_rms, max_norm=tight)


def test_no_scale_at_all_accepts_nothing_non_zero_and_own_norm_still_counts() -> None:
    """A reducer that never trained and never accepted a mean has no scale: a peer cannot
    push an unbounded delta into it. A reducer that trained keeps its own norm as the
    reference when it is the larger (its history is stale or empty)."""
    g = torch.Generator().manual_seed(22)
    peer = torch.randn(N, generator=g)
    vals = {"a": torch.zeros(N), "b": peer}
    assert _reduce(vals, "a", 0.0).excluded == {"b": "norm"}
    assert not _holds(vals, "a", 0.0)
    assert _reduce({"a": torch.zeros(N), "b": torch.zeros(N)}, "a", 0.0).excluded == {}
    own = torch.randn(N, generator=g)
    assert _reduce({"a": own, "b": peer * 5}, "a", 1e-6).excluded == {}
    assert _reduce({"a": own, "b": peer * 20}, "a", 1e-6).excluded == {"b": "norm"}


def test_groups_of_three_keep_the_median_reference() -> None:
    g = torch.Generator().manual_seed(23)
    vals = {p: torch.randn(N, generator=g) for p in "abc"}
    vals["a"] = torch.zeros(N)  # our own delta ~0 does not matter with >= 3
    vals["c"] = vals["c"] * 50  # > 10 x the median norm (b's)
    res = _reduce(vals, "a", 100.0)  # a huge history does not loosen the median bound
    assert res.excluded == {"c": "norm"}


@pytest.mark.parametrize("hostile", [False, True])
def test_two_peers_one_rebased_to_zero_delta_end_with_the_mean_of_both(hostile: bool) -> None:
    """Two AllReduce members over real p2pd daemons on loopback. Step 1: both trained (the
    mean they accept sets their ``mean_rms``). Step 2: member A just rebased (delta ~1e-4 of
    B's). Both must end with the mean of both deltas (before the fix A's reducer excluded B
    as "norm" and A's shard of the mean was A's own ~0). Hostile: B's delta is 1000x; A's
    reducer excludes it and A fails the step on B's shard."""
    numel = 2 * 2 * CHUNK_VALUES + 777  # several chunks per shard, and a tail

    async def main() -> None:
        p2ps = await _group(2)
        try:
            cfg = OuterConfig(compression="none")
            ars, group = await _members(p2ps, "none", numel, cfg)
            a, b = sorted(ars, key=lambda ar: ar.peer_id)
            loop = asyncio.get_running_loop()
            g = torch.Generator().manual_seed(24)
            first = {ar.peer_id: torch.randn(numel, generator=g) * 1e-2 for ar in ars}
            outs = await asyncio.gather(*(ar.exchange(first[ar.peer_id], group,
                                                      reduce_deadline=loop.time() + 50)
                                          for ar in ars))
            assert torch.equal(outs[0], outs[1])
            assert all(ar.mean_rms > 0 for ar in ars)
            for ar in ars:  # step 2, as the loop opens it
                await ar.open_session(step=2, state_hash="h2", numel=numel, weight=1.0,
                                      deadline=loop.time() + 60)
                ar.session.group.set_result(dataclasses.replace(group, step=2, nonce="n2"))
            b_delta = torch.randn(numel, generator=g) * 1e-2 * (1000 if hostile else 1)
            second = {a.peer_id: b_delta * 1e-4 if not hostile else b_delta * 1e-7,
                      b.peer_id: b_delta}
            outs = await asyncio.gather(*(ar.exchange(second[ar.peer_id],
                                                      ar.session.group.result(),
                                                      reduce_deadline=loop.time() + 50)
                                          for ar in (a, b)), return_exceptions=True)
            if hostile:
                assert a.session.shard.excluded == {b.peer_id: "norm"}
                assert isinstance(outs[0], StepFailed), outs[0]
                return
            for ar in (a, b):
                assert ar.session.shard.excluded == {}, ar.session.shard.excluded
                assert ar.session.shard.verdict == "ok"  # the streamed plain mean stood
            assert torch.equal(outs[0], outs[1])
            ref = (second[a.peer_id].double() + second[b.peer_id].double()) / 2
            assert float((outs[0].double() - ref).norm() / ref.norm()) < 1e-6
        finally:
            for p in reversed(p2ps):
                await p.shutdown()

    asyncio.run(main())
