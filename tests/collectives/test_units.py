"""Pure unit tests: codecs, shard reduction, state, config, the exchange's checks."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import pytest
import torch

import collectives
from collectives import OuterConfig, get_codec
from collectives.config import TransportConfig
from collectives.codec import CODEC_NAMES, CODECS, CodecError
from collectives.allreduce import RateLimit
from collectives.consistency import Lineage
from collectives.reduce import Contribution, coordinate_median, reduce_shard, shard_bounds
from collectives.state import OuterState, flatten, unflatten_into
from protocol import Identity
from protocol.tables import TableError

TOL = {"none": 1e-6, "fp16": 2e-3, "int8": 2e-2}
BOUNDS = dict(max_weight=1000.0, max_norm=float("inf"), max_norm_ratio=10.0)


def test_all_is_exported() -> None:
    for name in collectives.__all__:
        assert hasattr(collectives, name)


def test_config_names_every_codec_and_only_those() -> None:
    """OuterConfig checks ``compression`` against its own torch-free list of names."""
    from collectives.config import COMPRESSIONS

    assert list(COMPRESSIONS) == list(CODEC_NAMES)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_codec_pipeline_matches_reference_mean(name: str) -> None:
    """Sender encodes, reducer decodes + means, encodes once, everyone decodes: vs true mean."""
    g = torch.Generator().manual_seed(0)
    codec = get_codec(name)
    xs = [torch.randn(5000, generator=g) * (i + 1) for i in range(4)]
    ref = torch.stack(xs).double().mean(0)
    contribs = [Contribution(peer=f"p{i}", weight=1.0, values=codec.roundtrip(x))
                for i, x in enumerate(xs)]
    res = reduce_shard(contribs, **BOUNDS)
    assert res.mean is not None and not res.excluded
    wire = codec.encode(res.mean)
    out = codec.decode(wire, 5000)
    assert torch.equal(out, codec.decode(wire, 5000))  # deterministic decode
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < TOL[name], err


def test_int8_is_about_one_byte_per_value() -> None:
    codec = get_codec("int8")
    assert len(codec.encode(torch.randn(1 << 20))) / (1 << 20) <= 1.004
    assert torch.equal(codec.roundtrip(torch.zeros(10)), torch.zeros(10))


@pytest.mark.parametrize("name", sorted(CODECS))
def test_codec_rejects_wrong_length(name: str) -> None:
    codec = get_codec(name)
    data = codec.encode(torch.randn(100))
    with pytest.raises(CodecError):
        codec.decode(data + b"x", 100)
    with pytest.raises(CodecError):
        codec.decode(data, 101)


def test_reduce_excludes_poison_and_is_order_independent() -> None:
    g = torch.Generator().manual_seed(1)
    honest = [Contribution(peer=f"h{i}", weight=1.0 + i, values=torch.randn(64, generator=g))
              for i in range(3)]
    nan = Contribution(peer="n", weight=1.0, values=torch.full((64,), float("nan")))
    huge = Contribution(peer="x", weight=1.0, values=torch.randn(64, generator=g) * 1e6)
    heavy = Contribution(peer="w", weight=1e9, values=torch.randn(64, generator=g))
    a = reduce_shard([*honest, nan, huge, heavy], **BOUNDS)
    b = reduce_shard([heavy, huge, honest[2], nan, honest[0], honest[1]], **BOUNDS)
    assert a.excluded == {"n": "non_finite", "x": "norm", "w": "weight"}
    assert a.mean is not None and b.mean is not None and torch.equal(a.mean, b.mean)
    w = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)  # 3.0 capped at the median
    ref = (torch.stack([c.values.double() for c in honest]) * w[:, None]).sum(0) / w.sum()
    assert torch.allclose(a.mean.double(), ref, atol=1e-6)
    assert reduce_shard([nan], **BOUNDS).mean is None


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 32, 33])
def test_coordinate_median_is_torch_medians_lower_middle_value(n: int) -> None:
    """The network's result equals torch.median's value for value (a zero's sign may differ),
    with ties, signed zeros, infinities and NaN columns (n = 33 takes torch.median itself)."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(5000, generator=g) for _ in range(n)]
    for r in rows:  # ties and special values in some coordinates
        r[:100] = torch.randint(-2, 3, (100,), generator=g).float()
        r[100:110] = -0.0
        r[110] = float("inf")
        r[111] = -float("inf")
    rows[0][120] = float("nan")
    rows[-1][121] = float("nan")
    want = torch.stack(rows).median(dim=0).values
    got = coordinate_median(rows)
    assert torch.equal(got.isnan(), want.isnan()) and bool(got[120].isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    assert all(r is not got for r in rows)


def test_shard_bounds_cover_everything() -> None:
    for numel, n in [(10, 3), (0, 2), (7, 7), (1000, 8)]:
        b = shard_bounds(numel, n)
        assert b[0][0] == 0 and b[-1][1] == numel
        assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))


def test_state_roundtrip_hash_and_nesterov_matches_torch_sgd() -> None:
    p = torch.nn.Parameter(torch.randn(300))
    theta = flatten([p])
    st = OuterState(theta=theta.clone(), momentum=torch.zeros(300))
    opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        grad = torch.randn(300, generator=g)
        pre, pre_hash = st.clone(), st.hash()
        buf = torch.full((300,), float("nan"))  # a dead buffer becomes the new θ
        again = st.stepped(grad, lr=0.7, momentum=0.9)
        st, old = st.stepped(grad, lr=0.7, momentum=0.9, out=buf), st
        assert st.theta.data_ptr() == buf.data_ptr() and again.hash() == st.hash()
        assert old.hash() == pre_hash and torch.equal(old.theta, pre.theta)  # untouched
        pre.momentum.mul_(0.9).add_(grad)  # the in-place form: the same bits
        pre.theta.sub_((grad + pre.momentum * 0.9) * 0.7)
        assert torch.equal(st.theta, pre.theta) and torch.equal(st.momentum, pre.momentum)
        p.grad = grad.clone()
        opt.step()
    assert torch.allclose(st.theta, p.detach(), atol=1e-6)
    again = OuterState.from_bytes(st.to_bytes(), numel=300)
    assert again.hash() == st.hash() and again.applied == 3
    again.theta[0] = torch.nextafter(again.theta[0], torch.tensor(1e9))
    assert again.hash() != st.hash()
    with pytest.raises(ValueError):
        OuterState.from_bytes(st.to_bytes(), numel=301)
    with pytest.raises(ValueError):
        OuterState.from_bytes(b"\x93garbage", numel=300)
    q = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    unflatten_into(torch.arange(10.0), q)
    assert torch.equal(flatten(q), torch.arange(10.0))


@pytest.mark.parametrize("key,value,named", [
    ("every_rounds", 0, "every_rounds"), ("optimizer.lr", -1.0, "optimizer.lr"),
    ("optimizer.momentum", 1.0, "optimizer.momentum"), ("compression", "zip", "compression"),
    ("schedule.deadline_s", 0.0, "schedule.deadline_s"),
    ("schedule.join_window_s", 20.0, "schedule.join_window_s"),
    ("group.min_peers", 1, "group.min_peers"), ("bounds.weight", 0.0, "bounds.weight"),
    ("bounds.max_norm_ratio", 1.0, "bounds.max_norm_ratio"),
    ("transport.host_maddrs", [], "transport.host_maddrs"), ("swarm_id", "", "swarm_id"),
    ("sparse.k", 63, "sparse.k"), ("sparse.error_decay", 1.5, "sparse.error_decay"),
    ("outer_lr", -1.0, "optimizer.lr"),  # an old flat key: checked at its new place
    ("deadline_s", 0.0, "schedule.deadline_s"),
])
def test_config_rejects_bad_values(key: str, value: object, named: str) -> None:
    *path, last = key.split(".")
    table: dict = {last: value}
    for part in reversed(path):
        table = {part: table}
    with pytest.raises(TableError) as e:
        OuterConfig.from_dict(table)
    assert e.value.key == named
    assert dataclasses.is_dataclass(OuterConfig())


def test_every_old_flat_outer_key_still_lands_at_its_new_place() -> None:
    old = {"outer_lr": 0.5, "outer_momentum": 0.5, "deadline_s": 40.0, "join_window_s": 4.0,
           "period_s": 8.0, "min_period_s": 4.0, "max_period_s": 400.0, "prepare_s": 0.5,
           "final_wait_s": 20.0, "min_peers": 3, "max_peers": 9, "minority_patience": 1,
           "weight": 2.0, "max_weight": 50.0, "max_norm": 9.0, "max_norm_ratio": 4.0,
           "anchor": "ab" * 32, "state_requests_per_minute": 3, "dht_min_interval_s": 0.1,
           "dht_timeout_s": 4.0, "startup_timeout_s": 20.0, "slow_start_for_tests_s": 1.0,
           "host_maddrs": ["/ip4/127.0.0.1/tcp/5"], "announce_maddrs": ["/ip4/1.2.3.4/tcp/5"]}
    assert set(old) == set(OuterConfig.MOVED_KEYS)
    cfg = OuterConfig.from_dict(old)
    for key, value in old.items():
        section, name = OuterConfig.MOVED_KEYS[key].split(".")
        got = getattr(getattr(cfg, section), name)
        assert got == (tuple(value) if isinstance(value, list) else value), key
    assert cfg != OuterConfig()
    assert OuterConfig.from_dict({"schedule": {"deadline_s": 40.0}}).schedule.deadline_s == 40


def test_weights_are_capped_by_the_median_and_two_peers_are_norm_bounded() -> None:
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(32, generator=g) for _ in range(2)]
    a = Contribution(peer="a", weight=1.0, values=xs[0])
    heavy = Contribution(peer="b", weight=1000.0, values=xs[1])
    res = reduce_shard([a, heavy], own="a", **BOUNDS)
    assert res.weights == {"a": 1.0, "b": 1.0}
    assert torch.allclose(res.mean, (xs[0] + xs[1]) / 2, atol=1e-6)
    huge = Contribution(peer="b", weight=1.0, values=xs[1] * 1e6)
    # two contributions: bounded relative to the reducer's own
    assert reduce_shard([a, huge], own="a", **BOUNDS).excluded == {"b": "norm"}
    assert reduce_shard([a, huge], own="a", **{**BOUNDS, "max_norm_ratio": 1e9}).excluded == {}
    # no reference at all (no own contribution, no accepted mean): nothing non-zero passes
    assert reduce_shard([a, heavy], **BOUNDS).excluded == {"a": "norm", "b": "norm"}


def test_centred_clipping_bounds_an_outlier_and_keeps_honest_means_exact() -> None:
    g = torch.Generator().manual_seed(4)
    honest = [Contribution(peer=f"h{i}", weight=1.0, values=torch.randn(256, generator=g))
              for i in range(4)]
    plain = reduce_shard(honest, **BOUNDS)
    assert plain.clipped == ()
    ref = torch.stack([c.values for c in honest]).double().mean(0)
    assert torch.allclose(plain.mean.double(), ref, atol=1e-6)
    # an outlier below the exclusion bound (5x < ratio 10) is clipped, not averaged in full
    out = Contribution(peer="z", weight=1.0, values=torch.randn(256, generator=g) * 5)
    res = reduce_shard([*honest, out], **BOUNDS)
    assert res.clipped == ("z",) and not res.excluded
    naive = torch.stack([c.values for c in [*honest, out]]).mean(0)
    assert (res.mean - ref.float()).norm() < 0.6 * (naive - ref.float()).norm()
    shuffled = reduce_shard([honest[2], out, honest[0], honest[3], honest[1]], **BOUNDS)
    assert torch.equal(res.mean, shuffled.mean)  # deterministic in peer-id order


def test_state_wire_size_bounds_the_bytes_and_rate_limit() -> None:
    for n in (0, 1, 100, 70000):
        st = OuterState(theta=torch.randn(n), momentum=torch.randn(n), applied=2**40)
        assert len(st.to_bytes()) <= OuterState.wire_size(n) <= len(st.to_bytes()) + 16
    rl = RateLimit(2)
    assert rl.allow("a", 0.0) and rl.allow("a", 1.0) and not rl.allow("a", 2.0)
    assert rl.allow("b", 2.0) and rl.allow("a", 61.0)


def test_state_hash_cache_follows_every_change() -> None:
    st = OuterState(theta=torch.randn(50), momentum=torch.zeros(50))

    def fresh() -> str:  # the same state in new tensors: nothing cached
        return OuterState(theta=st.theta.clone(), momentum=st.momentum.clone(),
                          applied=st.applied).hash()

    seen = {st.hash()}
    for change in (lambda: setattr(st, "applied", 7), lambda: st.theta.__setitem__(3, 1.5),
                   lambda: st.momentum.add_(1.0), lambda: st.theta.mul_(2.0),
                   lambda: setattr(st, "theta", torch.zeros(50))):
        change()
        assert st.hash() == fresh() and st.hash() not in seen
        seen.add(st.hash())


def test_genesis_must_match_the_params(tmp_path) -> None:
    from collectives import OuterLoop

    with pytest.raises(ValueError, match="genesis"):
        OuterLoop(OuterConfig(), identity=Identity.generate(), group="g",
                  params=torch.nn.Linear(2, 2), data_dir=str(tmp_path), discover=lambda: [],
                  genesis=torch.zeros(5))


def test_a_group_without_most_of_the_last_contributors_does_not_advance() -> None:
    from collectives.holding import Holding
    from collectives.work import Work

    holding = Holding(torch.zeros(4), peer_id="me", momentum=0.0, minority_patience=2)
    assert holding.may_advance({"z"})  # genesis: no witnesses, no rule
    work = Work(snapshot=torch.zeros(4), rounds=1, weight=None)
    state = holding.copy()
    holding.adopt(state, Lineage(hash="h", version=4,
                                 witnesses=frozenset({"me", "a", "b", "c"})), work, base=None)
    assert holding.may_advance({"a", "b"})  # 3 of 4 witnesses (us included)
    assert not holding.may_advance({"a", "x", "y"})  # 2 of 4: the other half may be stepping
    assert not holding.may_advance({"a"})
    assert holding.may_advance({"a"})  # patience (2) exhausted: the majority is gone
    assert not holding.may_advance({"z"})  # the streak starts again


@pytest.mark.parametrize("case", ["honest2", "honest4", "outlier", "clipped", "nan", "weight",
                                  "own_small"])
def test_streamed_verdict_agrees_with_whole_shard_reduction(case: str) -> None:
    """plain_mean_holds on per-chunk statistics says "ok" exactly when reduce_shard on the
    whole shards accepts everyone and clips no one (the reducer then streams the plain mean)."""
    from collectives.reduce import chunk_stats, plain_mean_holds

    g = torch.Generator().manual_seed(3)
    n = 4 if case in ("honest4", "outlier", "clipped", "nan", "weight") else 2
    vals = {f"p{i}": torch.randn(3000, generator=g) for i in range(n)}
    weights = {p: 1.0 for p in vals}
    if case == "outlier":
        vals["p2"] = vals["p2"] * 50  # norm > 10 x the median: excluded
    if case == "clipped":
        vals["p1"] = vals["p1"] * 4  # far from the coordinate median, within the norm bound
    if case == "nan":
        vals["p3"][17] = float("nan")
    if case == "weight":
        weights["p0"] = 5000.0  # outside (0, max_weight]
    if case == "own_small":
        vals["p0"] = vals["p0"] * 0.01  # group of two: p1 is > 10 x our own norm
    contribs = [Contribution(peer=p, weight=weights[p], values=v) for p, v in vals.items()]
    whole = reduce_shard(contribs, own="p0", **BOUNDS)
    sq = {p: 0.0 for p in vals}
    off = {p: 0.0 for p in vals}
    for a in range(0, 3000, 700):  # uneven chunks, as a shard's tail
        s, o = chunk_stats({p: v[a : a + 700] for p, v in vals.items()})
        for p in vals:
            sq[p] += s[p]
            off[p] += o.get(p, 0.0)
    holds = plain_mean_holds(weights=weights, sq_norms=sq, sq_offsets=off if n >= 3 else {},
                             own="p0", **BOUNDS)
    expected = len(whole.accepted) == n and not whole.clipped
    assert holds == expected
    assert expected == (case in ("honest2", "honest4"))


def test_in_place_collect_adds_the_same_bits_as_flatten_add_copy() -> None:
    from collectives.work import _add_in_place

    g = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(30, 7, generator=g)),
              torch.nn.Parameter(torch.randn(11, generator=g))]
    shift = torch.randn(221, generator=g) * 1e-3
    expected = flatten(params) + shift
    assert _add_in_place(params, shift)
    assert torch.equal(flatten(params), expected)
    half = [torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))]
    assert not _add_in_place(half, torch.ones(4)) and torch.equal(
        half[0].detach(), torch.ones(4, dtype=torch.bfloat16))  # not written: the caller
    # falls back to flatten + add + copy


def test_finite_check_by_max_and_min_catches_every_non_finite_value() -> None:
    from collectives.work import finite as _finite

    g = torch.Generator().manual_seed(7)
    assert _finite(torch.randn(70_001, generator=g) * 1e30) and _finite(torch.zeros(0))
    for bad in (math.nan, math.inf, -math.inf):
        for pos in (0, 1, 4095, 70_000):  # inside and at the ends of vectorised blocks
            x = torch.randn(70_001, generator=g)
            x[pos] = bad
            assert not _finite(x), (bad, pos)


def test_a_member_that_trained_little_accepts_an_honest_mean_not_a_blown_up_one() -> None:
    """member.py's check: the reference is the larger of the member's own input
    norm for the shard and the last accepted mean's size (a joiner's: the adopted
    momentum's, holding.py), so a member whose own delta is near zero (it just rebased)
    does not fail the others' honest mean, and a hostile reducer still gets at most
    max_norm_ratio x that."""
    from collectives.holding import _step_rms
    from collectives.member import check_shard

    cfg = OuterConfig()

    def check(shard, own, rms=0.0):  # type: ignore[no-untyped-def]
        return check_shard(shard, own, ref_rms=rms, max_norm=cfg.bounds.max_norm,
                           max_norm_ratio=cfg.bounds.max_norm_ratio)
    g = torch.Generator().manual_seed(11)
    mean = torch.randn(5000, generator=g) * 1e-2  # the others' honest mean for our shard
    own = mean * 1e-3  # we trained a round or two since we rebased
    assert check(mean, own)[0] == "norm"  # the own norm alone fails it
    state = OuterState(theta=torch.zeros(5000), momentum=mean * 10)  # m ~ g / (1 - mu)
    rms = _step_rms(state, 0.9)
    assert rms == pytest.approx(float(mean.norm()) / math.sqrt(5000), rel=1e-5)
    # no momentum (the default): the state's buffer is the last average itself
    plain = OuterState(theta=torch.zeros(5000), momentum=torch.zeros(5000)).stepped(
        mean, lr=1.0, momentum=0.0)
    assert torch.equal(plain.momentum, mean)
    assert _step_rms(plain, 0.0) == pytest.approx(rms, rel=1e-5)
    assert check(mean, own, rms) == (None, pytest.approx(float(mean.norm())))
    assert check(mean * 11, own, rms)[0] == "norm"  # still bounded
    assert check(mean[:100], own[:100], rms)[0] is None  # scaled to the length
    assert check(mean * 11, mean * 2, rms)[0] is None  # or by our own input
    assert check(mean * float("nan"), own, rms)[0] == "non_finite"


def test_dht_calls_go_back_to_back_in_a_burst_then_one_per_interval(monkeypatch) -> None:
    """A step's phase boundaries (store then read) do not wait for the throttle; a polling
    loop still gets one call per ``dht_min_interval_s``. On a fake clock: no timed test."""
    from collectives import transport
    from collectives.transport import DHT_BURST, Transport

    now = [1000.0]
    waits: list[float] = []
    me, real_sleep, real_clock = threading.get_ident(), time.sleep, time.monotonic

    def sleep(s: float) -> None:  # (time is one module: other threads keep the real one)
        if threading.get_ident() != me:
            return real_sleep(s)
        waits.append(s)
        now[0] += s

    monkeypatch.setattr(transport.time, "monotonic",
                        lambda: now[0] if threading.get_ident() == me else real_clock())
    monkeypatch.setattr(transport.time, "sleep", sleep)
    t = object.__new__(Transport)  # only the throttle's state: no p2pd, no DHT
    t.config = OuterConfig(transport=TransportConfig(dht_min_interval_s=0.05))
    t._last_dht_call, t._dht_tokens = 0.0, float(DHT_BURST)
    assert DHT_BURST >= 2  # a phase's store and read at least
    start = now[0]
    for _ in range(DHT_BURST):
        t._dht_throttle()
    assert now[0] - start < 0.04 and not waits  # the burst: no wait
    for _ in range(6):
        t._dht_throttle()
    assert now[0] - start >= 6 * 0.05 * 0.99  # then the interval
    now[0] += 0.3  # the bucket refills while idle, up to the burst
    start, waits[:] = now[0], []
    for _ in range(DHT_BURST):
        t._dht_throttle()
    assert now[0] - start < 0.04 and not waits


def test_peers_with_another_wire_format_meet_in_another_namespace() -> None:
    """Frames of one codec do not decode in another: a node with another compression (or
    another sparse k) must not be grouped with ours, so its namespace differs."""
    from collectives.config import SparseConfig
    from collectives.loop import group_id

    ids = {group_id("model", OuterConfig(compression=c)) for c in ("none", "fp16", "int8")}
    ids |= {group_id("model", OuterConfig(compression="sparse", sparse=SparseConfig(k=k)))
            for k in (64, 128)}
    assert len(ids) == 5
    assert group_id("model", OuterConfig()) == group_id("model", OuterConfig())
    assert group_id("other", OuterConfig()) != group_id("model", OuterConfig())
