"""The sparse wire formats (collectives/sparse.py): sizes, selection, determinism, refusals.

Bytes are parsed and built here with Python ints as bit strings, independently of the
module's numpy packing, so the layout is checked as documented, not as implemented.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from collectives.codec import CodecError
from collectives.sparse import SUB, SparseMean, SparseTopK

SIZES = [0, 1, 2, 3, 63, 64, 65, 4095, 4096, 4097, 3 * SUB + 7, 8191, (1 << 18) - 1, 1 << 18,
         (1 << 18) + 5]


def _bits(values, width: int) -> bytes:
    """``values`` as a little-endian stream of ``width``-bit fields, zero-padded to a byte."""
    acc = 0
    for i, v in enumerate(values):
        acc |= int(v) << (width * i)
    return acc.to_bytes((width * len(values) + 7) // 8, "little")


def _fields(data: bytes, n: int, width: int) -> list[int]:
    acc = int.from_bytes(data, "little")
    return [(acc >> (width * i)) & ((1 << width) - 1) for i in range(n)]


def _sub_lengths(numel: int) -> list[int]:
    return [min(SUB, numel - a) for a in range(0, numel, SUB)]


def _topk_size(numel: int, k: int) -> int:
    kk = sum(min(k, n) for n in _sub_lengths(numel))
    return 16 + -(-12 * kk // 8) + -(-2 * kk // 8)


def _parse_topk(data: bytes, numel: int, k: int):
    """(lookup, per-sub-chunk index lists, codes) read as the docstring lays them out."""
    ks = [min(k, n) for n in _sub_lengths(numel)]
    kk = sum(ks)
    lookup = np.frombuffer(data[:16], "<f4")
    nidx = -(-12 * kk // 8)
    flat = _fields(data[16:16 + nidx], kk, 12)
    codes = _fields(data[16 + nidx:], kk, 2)
    starts = np.cumsum([0] + ks)
    return lookup, [flat[a:b] for a, b in zip(starts[:-1], starts[1:])], codes


def _reference_topk(x: np.ndarray, k: int) -> list[list[int]]:
    """Per sub-chunk: the k largest |x|, ties to the lower index, ascending (slow, obvious)."""
    out = []
    for a in range(0, x.size, SUB):
        sub = x[a:a + SUB]
        order = np.lexsort((np.arange(sub.size), -np.abs(sub)))
        out.append(sorted(order[:min(k, sub.size)].tolist()))
    return out


def _randn(n: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(n).astype(np.float32))


# ---------------------------------------------------------------- SparseTopK

@pytest.mark.parametrize("k", [2, 64, 128, 4096])
def test_topk_sizes_are_exact(k: int) -> None:
    codec = SparseTopK(k)
    for n in SIZES:
        assert codec.encoded_size(n) == _topk_size(n, k)
        if k < 4096 or n <= 3 * SUB + 7:
            assert len(codec.encode(_randn(n))) == codec.encoded_size(n), n
    assert SparseTopK(64).encoded_size(1 << 18) == 16 + 64 * 64 * 14 // 8  # 0.0274 B/value


@pytest.mark.parametrize("bad", [0, 1, 3, 63, 4098, 8192, -2, True, 64.0])
def test_topk_k_is_checked(bad) -> None:
    with pytest.raises(ValueError, match="k must be"):
        SparseTopK(bad)


def test_topk_options_are_checked() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_abs"):
            SparseTopK(64, max_abs=bad)


def _tied(n: int, seed: int) -> np.ndarray:
    """Few magnitudes, random signs, a quarter zeros: ties at every rank, zeros selected."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, n).astype(np.float32) * rng.choice([-1.0, 1.0], n).astype(np.float32)
    x[rng.random(n) < 0.25] = 0.0
    return x


@pytest.mark.parametrize("k", [2, 64, 256])
@pytest.mark.parametrize("case", ["random", "tied", "constant", "zeros", "sparse"])
def test_topk_selects_largest_with_lower_index_ties(k: int, case: str) -> None:
    n = 5 * SUB + 1234
    rng = np.random.default_rng(k)
    x = {"random": rng.standard_normal(n).astype(np.float32),
         "tied": _tied(n, k),
         "constant": np.full(n, -0.5, np.float32),
         "zeros": np.zeros(n, np.float32),
         "sparse": np.where(rng.random(n) < 10 / SUB, 1.0, 0.0).astype(np.float32)}[case]
    if case == "random":  # plant ties across the k-th rank of every sub-chunk
        for a in range(0, n, SUB):
            sub = x[a:a + SUB]
            t = np.sort(np.abs(sub))[-min(k, sub.size)]
            sub[rng.choice(sub.size, 7, replace=False)] = t * rng.choice([-1, 1], 7)
    data = SparseTopK(k).encode(torch.from_numpy(x))
    lookup, idx, codes = _parse_topk(data, n, k)
    assert idx == _reference_topk(x, k)
    # the value rule: signs kept, buckets ordered by value, lookup = bucket means
    vals = np.concatenate([x[a + np.array(i, dtype=np.int64)]
                           for a, i in zip(range(0, n, SUB), idx)])
    codes_a = np.array(codes)
    assert np.all(vals[codes_a <= 1] < 0) and np.all(vals[codes_a >= 2] >= 0)
    for lo, hi in ((0, 1), (1, 2), (2, 3)):
        if (codes_a == lo).any() and (codes_a == hi).any():
            assert vals[codes_a == lo].max() <= vals[codes_a == hi].min()
    if case == "random":  # distinct non-zeros: the lower median stays in the small bucket
        neg, pos = int((vals < 0).sum()), int((vals > 0).sum())
        assert np.bincount(codes_a, minlength=4).tolist() \
            == [neg // 2, neg - neg // 2, pos - pos // 2, pos // 2]
    for c in range(4):
        chosen = vals[codes_a == c]
        want = np.float32(chosen.astype(np.float64).mean()) if chosen.size else 0.0
        assert lookup[c] == pytest.approx(want, rel=1e-6, abs=0)


def test_topk_decodes_exactly_k_nonzeros_per_sub_chunk() -> None:
    k, n = 64, 6 * SUB + 100
    rng = np.random.default_rng(1)
    for x in (rng.standard_normal(n),  # dense, and exactly k_j non-zeros per sub-chunk
              np.concatenate([np.where(np.isin(np.arange(m), rng.choice(m, min(k, m), False)),
                                       rng.standard_normal(m), 0.0) for m in _sub_lengths(n)])):
        out = SparseTopK(k).roundtrip(torch.from_numpy(x.astype(np.float32)))
        per = [int((out[a:a + SUB] != 0).sum()) for a in range(0, n, SUB)]
        assert per == [min(k, m) for m in _sub_lengths(n)]
        np.testing.assert_array_equal(np.sign(out.numpy()[out.numpy() != 0]),
                                      np.sign(x[out.numpy() != 0]))


def test_topk_is_deterministic_and_decode_into_matches() -> None:
    codec = SparseTopK(64)
    x = _randn(3 * SUB + 77, seed=3)
    assert codec.encode(x) == codec.encode(x.clone())
    data = codec.encode(x)
    a, b = codec.decode(data, x.numel()), codec.decode(memoryview(data), x.numel())
    out = torch.full((x.numel() + 10,), 7.0)
    codec.decode_into(data, out[5:-5])
    assert torch.equal(a, b) and torch.equal(out[5:-5], a)
    assert torch.all(out[:5] == 7.0) and torch.all(out[-5:] == 7.0)
    assert codec.encode(torch.from_numpy(x.numpy()[::1].copy())) == data
    assert codec.encode(torch.stack([x, x], 1)[:, 0]) == data  # non-contiguous input


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_encoders_refuse_non_finite_input(bad: float) -> None:
    x = _randn(SUB + 9)
    x[SUB + 3] = bad
    with pytest.raises(ValueError, match="non-finite"):
        SparseTopK(64).encode(x)
    with pytest.raises(ValueError, match="non-finite"):
        SparseMean().encode(x)


# Hand-built SparseTopK wires: k = 4, numel = SUB + 3, so K = 4 + 3 = 7 (odd: both streams
# end in padding bits).
K4_NUMEL = SUB + 3


def _topk_wire(lookup=(-2.0, -1.0, 0.5, 3.0), idx=((0, 5, 9, 4095), (0, 1, 2)),
               codes=(0, 1, 2, 3, 3, 2, 1)) -> bytes:
    flat = [i for sub in idx for i in sub]
    return np.array(lookup, "<f4").tobytes() + _bits(flat, 12) + _bits(codes, 2)


def test_hand_built_topk_wire_decodes() -> None:
    out = SparseTopK(4).decode(_topk_wire(), K4_NUMEL)
    want = np.zeros(K4_NUMEL, np.float32)
    want[[0, 5, 9, 4095, SUB, SUB + 1, SUB + 2]] = [-2.0, -1.0, 0.5, 3.0, 3.0, 0.5, -1.0]
    np.testing.assert_array_equal(out.numpy(), want)
    assert len(_topk_wire()) == SparseTopK(4).encoded_size(K4_NUMEL)


def _flip_last_bit(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] |= 0x80
    return bytes(b)


TOPK_BAD = {  # case: (bytes, what the refusal says)
    "duplicate index": (_topk_wire(idx=((0, 5, 5, 9), (0, 1, 2))), "ascending"),
    "unsorted": (_topk_wire(idx=((0, 9, 5, 10), (0, 1, 2))), "ascending"),
    "unsorted tail": (_topk_wire(idx=((0, 5, 9, 10), (0, 2, 1))), "last sub-chunk"),
    "duplicate in tail": (_topk_wire(idx=((0, 5, 9, 10), (1, 1, 2))), "last sub-chunk"),
    "out of range in tail": (_topk_wire(idx=((0, 5, 9, 10), (0, 1, 3))), "last sub-chunk"),
    "far out of range in tail": (_topk_wire(idx=((0, 5, 9, 10), (0, 1, 4095))), "last sub-chunk"),
    "NaN lookup": (_topk_wire(lookup=(-2.0, float("nan"), 0.5, 3.0)), "non-finite"),
    "inf lookup": (_topk_wire(lookup=(-2.0, -1.0, 0.5, float("inf"))), "non-finite"),
    "lookup for an unused code": (_topk_wire(codes=(0, 0, 2, 3, 3, 2, 0)), "unused code"),
    "-0.0 for an unused code": (_topk_wire(lookup=(-2.0, -0.0, 0.5, 3.0),
                                          codes=(0, 0, 2, 3, 3, 2, 0)), "unused code"),
    "truncated": (_topk_wire()[:-1], "payload"),
    "extended": (_topk_wire() + b"\0", "payload"),
    "empty": (b"", "payload"),
    "index padding": (_flip_last_bit(_topk_wire(), 16 + (12 * 7 + 7) // 8 - 1), "12-bit"),
    "code padding": (_flip_last_bit(_topk_wire(), -1), "2-bit"),
}


@pytest.mark.parametrize("case", sorted(TOPK_BAD))
def test_topk_refuses_malformed(case: str) -> None:
    codec = SparseTopK(4)
    data, says = TOPK_BAD[case]
    with pytest.raises(CodecError, match=says):
        codec.decode(data, K4_NUMEL)
    out = torch.full((K4_NUMEL,), 7.0)
    with pytest.raises(CodecError, match=says):
        codec.decode_into(data, out)
    assert torch.all(out == 7.0)  # refused before anything was written


def test_topk_max_abs_bounds_the_lookup() -> None:
    assert SparseTopK(4, max_abs=3.0).decode(_topk_wire(), K4_NUMEL).abs().max() == 3.0
    with pytest.raises(CodecError, match="max_abs"):
        SparseTopK(4, max_abs=3.0).decode(_topk_wire(lookup=(-2.0, -1.0, 0.5, 3.5)), K4_NUMEL)
    with pytest.raises(CodecError, match="max_abs"):
        SparseTopK(4, max_abs=3.0).decode(_topk_wire(lookup=(-30.0, -1.0, 0.5, 3.0)), K4_NUMEL)


@pytest.mark.parametrize("codec", [SparseTopK(8), SparseMean(64)], ids=["topk", "mean"])
def test_random_corruption_gives_codec_error_or_a_tensor(codec) -> None:
    """Whatever a hostile peer sends, decode answers a tensor or CodecError, nothing else."""
    rng = np.random.default_rng(7)
    n = 2 * SUB + 300
    x = SparseTopK(8).roundtrip(_randn(n)) + SparseTopK(8).roundtrip(_randn(n, seed=1))
    good = bytearray(codec.encode(x))
    for _ in range(300):
        b = bytearray(good)
        for pos in rng.integers(0, len(b), rng.integers(1, 4)):
            b[pos] = int(rng.integers(0, 256))
        try:
            out = codec.decode(bytes(b), n)
        except CodecError:
            continue
        assert out.shape == (n,) and bool(torch.isfinite(out).all())


def test_error_feedback_tracks_the_true_sum() -> None:
    """e <- e + g; e <- e - decode(encode(e)): 50 steps send nearly 50 g; without EF they
    send 50 decode(encode(g)), which misses most of it."""
    g = _randn(3 * SUB + 1000, seed=11)
    for k, bound in ((64, 0.6), (256, 0.25)):
        codec = SparseTopK(k)
        e, sent = torch.zeros_like(g), torch.zeros_like(g)
        for _ in range(50):
            e += g
            d = codec.roundtrip(e)
            e -= d
            sent += d
        rel = float((sent - 50 * g).norm() / (50 * g).norm())
        rel_without = float((50 * codec.roundtrip(g) - 50 * g).norm() / (50 * g).norm())
        assert rel < bound < rel_without, (k, rel, rel_without)


# ---------------------------------------------------------------- SparseMean

def _mean_size(counts: list[int], lengths: list[int]) -> int:
    listed = [12 * c <= 8 * -(-n // 8) for c, n in zip(counts, lengths)]
    n_list = sum(c for c, lst in zip(counts, listed) if lst)
    bitmaps = sum(-(-n // 8) for n, lst in zip(lengths, listed) if not lst)
    s = sum(counts)
    return 2 * len(counts) + -(-12 * n_list // 8) + bitmaps + 4 * -(-s // 1024) + s


@pytest.mark.parametrize("max_support", [1, 64, 256, 341, 342, 4096])
def test_mean_encoded_size_is_the_bound_and_is_reached(max_support: int) -> None:
    codec = SparseMean(max_support)
    rng = np.random.default_rng(max_support)
    for n in SIZES:
        lengths = _sub_lengths(n)
        assert codec.encoded_size(n) == _mean_size([min(max_support, m) for m in lengths],
                                                   lengths)
        if n > 3 * SUB + 7 and max_support == 4096:
            continue
        full = np.concatenate([np.where(np.isin(np.arange(m),
                                                rng.choice(m, min(m, max_support), False)),
                                        rng.standard_normal(m), 0.0) for m in lengths] or [[]])
        assert len(codec.encode(torch.from_numpy(full.astype(np.float32)))) \
            == codec.encoded_size(n), n
        half = np.where(rng.random(n) < 0.5, full, 0.0).astype(np.float32)
        assert len(codec.encode(torch.from_numpy(half))) <= codec.encoded_size(n)


@pytest.mark.parametrize("bad", [0, -1, 4097, True, 64.0])
def test_mean_max_support_is_checked(bad) -> None:
    with pytest.raises(ValueError, match="max_support"):
        SparseMean(bad)


def test_mean_refuses_to_encode_beyond_max_support() -> None:
    x = torch.zeros(2 * SUB)
    x[SUB:SUB + 65] = 1.0
    with pytest.raises(ValueError, match="max_support"):
        SparseMean(64).encode(x)


@pytest.mark.parametrize("count", [0, 1, 340, 341, 342, 1000, 4095, 4096])
def test_mean_list_or_bitmap_roundtrips_positions(count: int) -> None:
    """Values k / 8 with absmax 127 / 8: the scale is 1/8 exactly, so decode is exact."""
    rng = np.random.default_rng(count)
    n = 2 * SUB + 13
    x = np.zeros(n, np.float32)
    for a, m in zip(range(0, n, SUB), _sub_lengths(n)):
        c = min(count, m)
        pos = np.sort(rng.choice(m, c, replace=False))
        x[a + pos] = rng.choice([v for v in range(-127, 128) if v], c) / 8
    x[np.flatnonzero(x)[::1024]] = 127 / 8  # every 1024-value block's absmax
    data = SparseMean().encode(torch.from_numpy(x))
    counts = [min(count, m) for m in _sub_lengths(n)]
    assert len(data) == _mean_size(counts, _sub_lengths(n))
    assert list(np.frombuffer(data[:6], "<u2")) == counts
    np.testing.assert_array_equal(SparseMean().decode(data, n).numpy(), x)


def test_mean_of_members_topk_roundtrips() -> None:
    """The reducer's path: 4 members' decoded top-k, their dense mean, SparseMean once."""
    k, n = 64, (1 << 18) + 5 * SUB + 17
    members = [SparseTopK(k).roundtrip(_randn(n, seed=20 + i) * (i + 1)) for i in range(4)]
    mean = torch.stack(members).sum(0) / 4
    codec = SparseMean(4 * k)
    data = codec.encode(mean)
    assert data == codec.encode(mean.clone())
    assert len(data) <= codec.encoded_size(n)
    out = codec.decode(data, n)
    assert torch.equal(out, codec.decode(data, n))
    support = mean != 0
    nsub = -(-n // SUB)
    assert np.frombuffer(data[:2 * nsub], "<u2").tolist() \
        == [int(support[a:a + SUB].sum()) for a in range(0, n, SUB)]
    assert not bool(out[~support].any())
    # within int8 precision: half a step of each 1024-non-zero block's scale; a value under
    # half a step (members that cancel out) keeps its place on the wire and decodes to 0.0
    vals, got = mean[support].numpy(), out[support].numpy()
    for a in range(0, vals.size, 1024):
        v, d = vals[a:a + 1024], got[a:a + 1024]
        step = np.abs(v).max() / 127
        assert np.abs(d - v).max() <= step * 0.5001
        assert np.all((d != 0) | (np.abs(v) <= step * 0.5001))
    assert int((got == 0).sum()) == 2  # a coordinate all 4 chose, lookups in ratio 1:2:3:4


def test_mean_value_with_code_zero_keeps_its_position_and_decodes_to_zero() -> None:
    x = torch.zeros(SUB)
    x[[3, 10, 20]] = torch.tensor([1.0, 1e-4, -0.5])
    data = SparseMean().encode(x)
    assert np.frombuffer(data[:2], "<u2")[0] == 3
    out = SparseMean().decode(data, SUB)
    assert out[10] == 0.0 and out[3] == 1.0 and out[20] != 0


def test_mean_zero_tensor_and_negative_zero() -> None:
    x = torch.zeros(SUB + 5)
    x[7] = -0.0
    data = SparseMean().encode(x)
    assert data == b"\0" * 4  # two zero counts, nothing else
    assert torch.equal(SparseMean().decode(data, SUB + 5), torch.zeros(SUB + 5))


# Hand-built SparseMean wires: numel = SUB + 10; sub-chunk 0 lists 3 indices (odd: padding),
# the 10-value tail holds 2 non-zeros, so a 2-byte bitmap (12 * 2 > 16 bits).
M_NUMEL = SUB + 10


def _mean_wire(counts=(3, 2), idx=(4, 100, 4095), bitmap=(1, 9), scale=0.5,
               codes=(127, -3, 1, 2, -127), bitmap_bits=16) -> bytes:
    bm = _bits([1 if i in bitmap else 0 for i in range(bitmap_bits)], 1)
    return (np.array(counts, "<u2").tobytes() + _bits(idx, 12) + bm
            + np.array([scale], "<f4").tobytes() + np.array(codes, np.int8).tobytes())


def test_hand_built_mean_wire_decodes() -> None:
    want = np.zeros(M_NUMEL, np.float32)
    want[[4, 100, 4095, SUB + 1, SUB + 9]] = np.array([127, -3, 1, 2, -127]) * 0.5
    np.testing.assert_array_equal(SparseMean(3).decode(_mean_wire(), M_NUMEL).numpy(), want)
    assert SparseMean().encode(torch.from_numpy(want)) == _mean_wire()
    # a 24-value sub-chunk with 2 non-zeros: 24 bits either way, and the rule says a list
    listed = _mean_wire(counts=(2,), idx=(3, 17), bitmap_bits=0, codes=(127, 1))
    want = np.zeros(24, np.float32)
    want[[3, 17]] = [63.5, 0.5]
    np.testing.assert_array_equal(SparseMean().decode(listed, 24).numpy(), want)
    assert SparseMean().encode(torch.from_numpy(want)) == listed


def _bitmap_row_wire() -> tuple[bytes, int]:
    """A full sub-chunk with 400 non-zeros (bitmap mode): (bytes, offset of the bitmap)."""
    x = np.zeros(SUB, np.float32)
    x[np.arange(0, 4000, 10)] = 1.0
    return SparseMean().encode(torch.from_numpy(x)), 2


def _edit(data: bytes, offset: int, value: int) -> bytes:
    b = bytearray(data)
    b[offset] = value
    return bytes(b)


def _mean_bad() -> dict[str, tuple[bytes, int, int, str]]:
    """Malformed wires: (bytes, numel, max_support, what the refusal says)."""
    row, at = _bitmap_row_wire()
    return {
        "count > max_support": (_mean_wire(), M_NUMEL, 2, "count beyond"),
        "count > L of the tail": (_mean_wire(counts=(3, 11)), M_NUMEL, 4096, "count beyond"),
        "truncated": (_mean_wire()[:-1], M_NUMEL, 4096, "payload"),
        "extended": (_mean_wire() + b"\0", M_NUMEL, 4096, "payload"),
        "shorter than the counts": (b"\3", M_NUMEL, 4096, "payload"),
        "empty": (b"", M_NUMEL, 4096, "payload"),
        "duplicate index": (_mean_wire(idx=(4, 4, 4095)), M_NUMEL, 4096, "ascending"),
        "unsorted": (_mean_wire(idx=(100, 4, 4095)), M_NUMEL, 4096, "ascending"),
        "index beyond the tail": (_mean_wire(counts=(2, 1), idx=(4, 100, 10), bitmap_bits=0,
                                             codes=(127, -3, 1)),
                                  M_NUMEL, 4096, "beyond its sub-chunk"),
        # a 100-value tail lists up to 8 indices (12 * 8 <= 8 * 13 bits)
        "index at L of a listed tail": (_mean_wire(counts=(0, 2), idx=(5, 100), bitmap_bits=0,
                                                   codes=(127, 1)),
                                        SUB + 100, 4096, "beyond its sub-chunk"),
        "unsorted listed tail": (_mean_wire(counts=(0, 3), idx=(5, 2, 7), bitmap_bits=0,
                                            codes=(127, 1, 2)), SUB + 100, 4096, "ascending"),
        "duplicate in listed tail": (_mean_wire(counts=(0, 3), idx=(2, 5, 5), bitmap_bits=0,
                                                codes=(127, 1, 2)), SUB + 100, 4096, "ascending"),
        "NaN scale": (_mean_wire(scale=float("nan")), M_NUMEL, 4096, "scale"),
        "inf scale": (_mean_wire(scale=float("inf")), M_NUMEL, 4096, "scale"),
        "negative scale": (_mean_wire(scale=-0.5), M_NUMEL, 4096, "scale"),
        "code -128": (_mean_wire(codes=(127, -128, 1, 2, -127)), M_NUMEL, 4096, "-128"),
        "index padding": (_flip_last_bit(_mean_wire(), 2 * 2 + 5 - 1), M_NUMEL, 4096, "12-bit"),
        "tail bitmap padding": (_mean_wire(bitmap=(1, 12)), M_NUMEL, 4096, "bitmap"),
        "tail popcount < count": (_mean_wire(bitmap=(1,)), M_NUMEL, 4096, "popcount"),
        "tail popcount > count": (_mean_wire(bitmap=(1, 2, 9)), M_NUMEL, 4096, "popcount"),
        "full popcount > count": (_edit(row, at + 1, 0xFF), SUB, 4096, "popcount"),
        "full popcount < count": (_edit(row, at, 0), SUB, 4096, "popcount"),
    }


@pytest.mark.parametrize("case", sorted(_mean_bad()))
def test_mean_refuses_malformed(case: str) -> None:
    data, numel, max_support, says = _mean_bad()[case]
    codec = SparseMean(max_support)
    with pytest.raises(CodecError, match=says):
        codec.decode(data, numel)
    out = torch.full((numel,), 7.0)
    with pytest.raises(CodecError, match=says):
        codec.decode_into(data, out)
    assert torch.all(out == 7.0)


def test_bases_of_the_malformed_mean_wires_are_valid() -> None:
    """Each refusal above is its edit's doing: the unedited wires decode."""
    row, _ = _bitmap_row_wire()
    assert int((SparseMean().decode(row, SUB) != 0).sum()) == 400
    listed = _mean_wire(counts=(0, 3), idx=(2, 5, 99), bitmap_bits=0, codes=(127, 1, 2))
    assert SparseMean().decode(listed, SUB + 100)[SUB + 99] == 2 * 0.5
    assert SparseMean().decode(_mean_wire(counts=(2, 1), idx=(4, 100, 9), bitmap_bits=0,
                                          codes=(127, -3, 1)),
                               M_NUMEL)[SUB + 9] == 1 * 0.5


def test_topk_names_the_codec_of_its_mean() -> None:
    """A reducer's mean of n members' top-k holds at most n * k values per sub-chunk."""
    mean = SparseTopK(64).for_mean(4)
    assert isinstance(mean, SparseMean) and mean.max_support == 256
    assert SparseTopK(64).for_mean(100).max_support == SUB


# ---------------------------------------------------------------- across processes

_CHILD = textwrap.dedent("""
    import hashlib, sys
    import numpy as np, torch
    torch.set_num_threads(int(sys.argv[1]))
    from collectives.sparse import SparseMean, SparseTopK
    n = 3 * (1 << 18) + 4099
    xs = [torch.from_numpy(np.random.default_rng(s).standard_normal(n).astype(np.float32))
          for s in range(3)]
    wires = [SparseTopK(64).encode(x) for x in xs]
    mean = sum(SparseTopK(64).decode(w, n) for w in wires) / 3
    m = SparseMean(192).encode(mean)
    h = hashlib.sha256()
    for b in (*wires, m, SparseMean(192).decode(m, n).numpy().tobytes()):
        h.update(b)
    print(h.hexdigest())
""")


def test_bytes_are_identical_across_processes_and_thread_counts() -> None:
    root = Path(__file__).resolve().parents[2]
    digests = {subprocess.run([sys.executable, "-c", _CHILD, str(t)], check=True, text=True,
                              capture_output=True, timeout=120, cwd=root).stdout.strip()
               for t in (1, 2)}
    assert len(digests) == 1 and len(digests.pop()) == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_topk_selection_on_cuda_gives_the_same_bytes() -> None:
    """Selection runs on the input's device; comparisons and top-k values are exact there."""
    for x in (_randn(5 * SUB + 77, seed=4), torch.from_numpy(_tied(5 * SUB + 77, 4))):
        assert SparseTopK(64).encode(x.cuda()) == SparseTopK(64).encode(x)
