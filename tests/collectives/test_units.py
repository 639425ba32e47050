"""Pure unit tests: codecs, shard reduction, state, config, commits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import collectives
from collectives import OuterConfig, get_codec
from collectives.codec import CODECS, CodecError
from collectives.consistency import CommitBook, canonical
from collectives.reduce import Contribution, reduce_shard, shard_bounds
from collectives.state import OuterState, flatten, unflatten_into
from protocol import Identity, OuterStepCommit

TOL = {"none": 1e-6, "fp16": 2e-3, "int8": 2e-2}
BOUNDS = dict(max_weight=1000.0, max_norm=float("inf"), max_norm_ratio=10.0)


def test_all_is_exported() -> None:
    for name in collectives.__all__:
        assert hasattr(collectives, name)


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
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    ref = (torch.stack([c.values.double() for c in honest]) * w[:, None]).sum(0) / w.sum()
    assert torch.allclose(a.mean.double(), ref, atol=1e-6)
    assert reduce_shard([nan], **BOUNDS).mean is None


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
        st.apply(grad, lr=0.7, momentum=0.9)
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


@pytest.mark.parametrize("field,value", [
    ("every_rounds", 0), ("outer_lr", -1.0), ("outer_momentum", 1.0), ("compression", "zip"),
    ("deadline_s", 0.0), ("join_window_s", 20.0), ("min_peers", 1), ("weight", 0.0),
    ("max_norm_ratio", 1.0), ("host_maddrs", ()), ("swarm_id", ""),
])
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        OuterConfig(**{field: value})
    assert dataclasses.is_dataclass(OuterConfig())


def test_commits_verify_signer_group_and_majority() -> None:
    ids = [Identity.generate() for _ in range(4)]
    books = [CommitBook(identity=i, group="g", gid="x", swarm_id="s") for i in ids]
    raw = {i.peer_id: b.seal(3, "aa" if n < 3 else "bb", 4) for n, (i, b) in
           enumerate(zip(ids, books))}
    reader = CommitBook(identity=ids[0], group="g", gid="x", swarm_id="s")
    got = reader.verify(raw, step=3)
    assert len(got) == 4 and canonical(got) == ("aa", sorted(i.peer_id for i in ids[:3]))
    forged = {ids[1].peer_id: books[0].seal(3, "cc", 4)}  # signed by someone else
    other_group = {ids[2].peer_id: CommitBook(identity=ids[2], group="h", gid="x",
                                              swarm_id="s").seal(3, "aa", 4)}
    assert reader.verify({**forged, **other_group, ids[3].peer_id: b"junk"}, step=3) == {}
    assert reader.verify(raw, step=4) == {}
    assert reader.invalid == 7
    tie = {"a": OuterStepCommit(group="g", step=1, state_hash="01", peers=2),
           "b": OuterStepCommit(group="g", step=1, state_hash="02", peers=2)}
    assert canonical(tie) == ("02", ["b"]) and canonical({}) is None


def test_state_hash_cache_follows_every_change() -> None:
    st = OuterState(theta=torch.randn(50), momentum=torch.zeros(50))

    def fresh() -> str:  # the same state in new tensors: nothing cached
        return OuterState(theta=st.theta.clone(), momentum=st.momentum.clone(),
                          attempt=st.attempt, applied=st.applied).hash()

    seen = {st.hash()}
    for change in (lambda: setattr(st, "attempt", 1), lambda: st.apply(torch.ones(50), lr=0.5,
                   momentum=0.9), lambda: st.momentum.add_(1.0), lambda: st.theta.mul_(2.0),
                   lambda: setattr(st, "theta", torch.zeros(50))):
        change()
        assert st.hash() == fresh() and st.hash() not in seen
        seen.add(st.hash())
