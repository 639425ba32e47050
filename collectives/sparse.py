"""Sparse wire formats for low-communication outer steps (notes/compression.md B.3).

A flat fp32 vector is cut into sub-chunks of ``SUB = 4096`` values from the start of the
tensor handed to the codec; callers hand it one wire chunk (``codec.CHUNK_VALUES`` values
starting at a multiple of it), so sub-chunks line up across peers. Only the last sub-chunk
may be shorter. Both codecs are canonical (one byte string per content) and their decoders
refuse anything else with ``CodecError``, never another exception.

``sparse`` (``SparseTopK``): one member's contribution, its error-feedback accumulator.
    Per sub-chunk of length L the ``min(k, L)`` coordinates of largest ``|x|`` are kept; ties
    go to the lower index (a resumed node reproduces its payload). Layout, K = sum of the
    ``min(k, L)``::

        lookup   4 x '<f4'                                   16 bytes
        indices  K x 12 bits, sub-chunk by sub-chunk, each   ceil(12 K / 8) bytes
                 strictly ascending and < L, relative to its
                 sub-chunk; 2 indices per 3 bytes (i0 | i1 << 12,
                 little-endian); zero bits pad the last byte
        codes    K x 2 bits, in index order, code i in bits  ceil(2 K / 8) bytes
                 2(i % 4)..2(i % 4)+1 of byte i // 4; zero padding

    Value rule (2 bits, one lookup per encode call): m- is the lower median of the selected
    negatives' magnitudes, m+ that of the selected positives. Code 0: v < -m-; 1: -m- <= v
    < 0; 2: 0 <= v <= m+ (selected zeros land here); 3: v > m+. ``lookup[c]`` is the mean of
    the selected values with code c (float64 sum in index order, rounded to fp32); an unused
    code's entry is +0.0 and the decoder refuses anything else there. Decoding gives
    ``lookup[code]`` at each selected coordinate and 0 elsewhere; the rounding error is the
    caller's error feedback to carry (``e <- e - decode(encode(e))``).

``sparse-mean`` (``SparseMean``): the reducer's robust mean, encoded once and applied by
    every member, so encoding is deterministic and decoding is exact fp32 arithmetic (one
    multiply per value, no reductions). Any tensor is encoded by its support (entries != 0;
    -0.0 counts as 0). With c the non-zero count of a sub-chunk of length L, its positions
    are an index list when ``12 c <= 8 ceil(L / 8)`` and an L-bit bitmap otherwise (for L =
    4096: a list up to 341 non-zeros), so the count alone fixes the layout::

        counts   one '<u2' per sub-chunk                      2 x nsub bytes
        indices  the list-mode sub-chunks' indices, as in     ceil(12 A / 8) bytes
                 ``sparse`` (A = their total count)
        bitmaps  each bitmap-mode sub-chunk's ceil(L / 8)     sum of ceil(L / 8)
                 bytes, bit i = byte i // 8 bit i % 8;
                 zero padding; popcount = its count
        values   ``codec.BlockwiseInt8``'s payload of the     4 ceil(S / 1024) + S bytes
                 S non-zeros in position order: blocks of
                 1024, a '<f4' scale = absmax / 127 each,
                 then S int8 codes round(v / scale)

    A non-zero whose code rounds to 0 (|v| < scale / 2) keeps its position on the wire and
    decodes to 0.0. Counts are bounded by ``max_support``; ``encoded_size`` is the size with
    ``min(max_support, L)`` non-zeros in every sub-chunk, the largest a frame can be.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from collectives.codec import BlockwiseInt8, Codec, CodecError

__all__ = ["SUB", "SparseTopK", "SparseMean"]

SUB = 4096
"""Values per sub-chunk; 12-bit indices address one."""

_SHIFTS2 = np.array([0, 2, 4, 6], dtype=np.uint8)


def _split(numel: int) -> tuple[int, int]:
    """(full sub-chunks, length of the short last one or 0)."""
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    return divmod(numel, SUB)


def _lengths(numel: int) -> np.ndarray:
    rows, tail = _split(numel)
    return np.array([SUB] * rows + ([tail] if tail else []), dtype=np.int64)


def _bytes(data: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def _pack12(idx: np.ndarray) -> bytes:
    """Values < 4096 as a 12-bit little-endian stream, zero-padded to a whole byte."""
    n = idx.size
    pairs = np.zeros(2 * ((n + 1) // 2), dtype=np.uint32)
    pairs[:n] = idx
    w = pairs[0::2] | (pairs[1::2] << 12)
    out = np.empty((w.size, 3), dtype=np.uint8)
    out[:, 0] = w & 0xFF
    out[:, 1] = (w >> 8) & 0xFF
    out[:, 2] = w >> 16
    return out.reshape(-1)[: (12 * n + 7) // 8].tobytes()


def _unpack12(buf: np.ndarray, n: int) -> np.ndarray:
    """Inverse of ``_pack12`` (``buf`` holds exactly its bytes); CodecError on padding."""
    if n % 2 and buf[-1] >> 4:
        raise CodecError("non-zero padding bits after the 12-bit indices")
    g = (n + 1) // 2
    flat = np.zeros(3 * g, dtype=np.uint32)
    flat[: buf.size] = buf
    b = flat.reshape(g, 3)
    w = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    out = np.empty(2 * g, dtype=np.int64)
    out[0::2] = w & 0xFFF
    out[1::2] = w >> 12
    return out[:n]


def _pack2(codes: np.ndarray) -> bytes:
    c = np.zeros(4 * ((codes.size + 3) // 4), dtype=np.uint8)
    c[: codes.size] = codes
    return np.bitwise_or.reduce(c.reshape(-1, 4) << _SHIFTS2, axis=1).astype(np.uint8).tobytes()


def _unpack2(buf: np.ndarray, n: int) -> np.ndarray:
    codes = ((buf[:, None] >> _SHIFTS2) & 3).reshape(-1)
    if codes[n:].any():
        raise CodecError("non-zero padding bits after the 2-bit codes")
    return codes[:n]


def _top_rows(a: torch.Tensor, k: int) -> torch.Tensor:
    """Flat row-major positions in the (rows, L) magnitudes ``a`` of each row's ``k`` largest,
    ties to the lower index: all above the row's k-th largest t, then the first ones at t."""
    if k == a.shape[1]:
        return torch.arange(a.numel(), device=a.device)
    t = torch.topk(a, k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    mask = a >= t
    flat = mask.view(-1).nonzero().view(-1)
    if flat.numel() == a.shape[0] * k:  # no row holds more than k at >= t (the usual case)
        return flat
    over = (mask.sum(dim=1) > k).nonzero().view(-1)
    sub, ts = a[over], t[over]
    gt, eq = sub > ts, sub == ts
    need = k - gt.sum(dim=1, keepdim=True)
    mask[over] = gt | (eq & (eq.cumsum(dim=1) <= need))
    return mask.view(-1).nonzero().view(-1)


def _lower_median(a: np.ndarray) -> np.float32:
    if a.size == 0:
        return np.float32(0.0)
    i = (a.size - 1) // 2
    return np.float32(np.partition(a, i)[i])


def _quantise2(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(2-bit codes, fp32 lookup) of the selected values, by the module's value rule."""
    neg = vals < 0
    m_neg = _lower_median(-vals[neg])
    m_pos = _lower_median(vals[vals > 0])
    codes = np.where(neg, np.where(vals < -m_neg, 0, 1), np.where(vals > m_pos, 3, 2))
    codes = codes.astype(np.uint8)
    counts = np.bincount(codes, minlength=4)
    sums = np.bincount(codes, weights=vals.astype(np.float64), minlength=4)
    lookup = np.zeros(4, dtype=np.float32)
    used = counts > 0
    lookup[used] = (sums[used] / counts[used]).astype(np.float32)
    return codes, lookup


def _read_bitmaps(buf: np.ndarray, rows: np.ndarray, lengths: np.ndarray,
                  counts: np.ndarray) -> np.ndarray:
    """Positions set in the bitmaps of sub-chunks ``rows`` (ascending), which start ``buf``;
    CodecError on padding bits or a popcount other than the sub-chunk's count."""
    out, off = [np.zeros(0, dtype=np.int64)], 0
    for sel in (rows[lengths[rows] == SUB], rows[lengths[rows] < SUB]):  # full, then the tail
        if not sel.size:
            continue
        width = int(lengths[sel[0]])
        nb = (width + 7) // 8
        bits = np.unpackbits(buf[off : off + nb * sel.size].reshape(sel.size, nb), axis=1,
                             bitorder="little")
        off += nb * sel.size
        if bits[:, width:].any():
            raise CodecError("non-zero padding bits after a sparse-mean bitmap")
        if (bits.sum(axis=1) != counts[sel]).any():
            raise CodecError("sparse-mean bitmap popcount differs from its count")
        r, c = np.nonzero(bits)
        out.append(sel[r] * SUB + c)
    return np.concatenate(out)


class _Support(Codec):
    """A codec whose bytes name positions and their values (zero elsewhere): ``_parse``
    checks the bytes and gives both; decoding scatters them."""

    def _parse(self, data: bytes | memoryview, numel: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        pos, vals = self._parse(data, numel)
        out = np.zeros(numel, dtype=np.float32)
        out[pos] = vals
        return torch.from_numpy(out)

    def decode_into(self, data: bytes | memoryview, out: torch.Tensor) -> None:
        pos, vals = self._parse(data, out.numel())
        dst = out.numpy()
        dst.fill(0.0)
        dst[pos] = vals


class SparseTopK(_Support):
    """Top-k per 4096-value sub-chunk, 12-bit indices and 2-bit values (module docstring).

    ``k``: coordinates kept per sub-chunk, even, in [2, 4096]. ``max_abs``: the decoder
    refuses a lookup entry with a larger magnitude (a bound on a hostile member's values).
    """

    name = "sparse"

    def __init__(self, k: int = 64, *, max_abs: float = math.inf) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= SUB or k % 2:
            raise ValueError(f"k must be an even int in [2, {SUB}], got {k!r}")
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.k = k
        self.max_abs = float(max_abs)

    def selected(self, numel: int) -> int:
        """K: how many coordinates an encoding of ``numel`` values carries."""
        rows, tail = _split(numel)
        return rows * self.k + min(self.k, tail)

    def for_mean(self, members: int) -> Codec:
        """A reducer's mean of ``members`` top-k contributions is non-zero on at most
        ``members * k`` values of a sub-chunk: its frames are bounded by that."""
        return SparseMean(min(SUB, max(1, members) * self.k))

    def encoded_size(self, numel: int) -> int:
        n = self.selected(numel)
        return 16 + (12 * n + 7) // 8 + (2 * n + 7) // 8

    def encode(self, x: torch.Tensor) -> bytes:
        """Selection runs on ``x``'s device (it is exact there too); packing on the CPU."""
        if x.dim() != 1:
            raise ValueError("codecs take 1-D tensors")
        v = x.detach().to(torch.float32).contiguous()
        a = v.abs()
        if v.numel() and not bool(torch.isfinite(a.amax())):  # amax propagates NaN
            raise ValueError("sparse codec cannot encode non-finite values")
        rows, tail = _split(v.numel())
        parts = []
        if rows:
            parts.append(_top_rows(a[: rows * SUB].view(rows, SUB), self.k))
        if tail:
            parts.append(_top_rows(a[rows * SUB :].view(1, tail), min(self.k, tail)) + rows * SUB)
        pos = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=v.device)
        vals = v[pos].cpu().numpy()
        codes, lookup = _quantise2(vals)
        local = pos.cpu().numpy() & (SUB - 1)
        return lookup.astype("<f4").tobytes() + _pack12(local) + _pack2(codes)

    def _parse(self, data: bytes | memoryview, numel: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, values) of a valid encoding; CodecError otherwise."""
        buf = _bytes(data)
        if buf.size != self.encoded_size(numel):
            raise CodecError(f"sparse payload of {buf.size} bytes for {numel} values "
                             f"(expected {self.encoded_size(numel)})")
        n = self.selected(numel)
        lookup = buf[:16].view("<f4").astype(np.float32)
        if not np.isfinite(lookup).all():
            raise CodecError("non-finite sparse lookup")
        if (np.abs(lookup) > self.max_abs).any():
            raise CodecError(f"sparse lookup beyond max_abs={self.max_abs}")
        nidx = (12 * n + 7) // 8
        local = _unpack12(buf[16 : 16 + nidx], n)
        codes = _unpack2(buf[16 + nidx :], n)
        rows, tail = _split(numel)
        full = rows * self.k
        grid = local[:full].reshape(rows, self.k)
        if (np.diff(grid, axis=1) <= 0).any():
            raise CodecError("sparse indices not strictly ascending within a sub-chunk")
        last = local[full:]
        if (np.diff(last) <= 0).any() or (last >= tail).any():
            raise CodecError("sparse indices of the last sub-chunk out of order or range")
        unused = np.bincount(codes, minlength=4) == 0
        if buf[:16].view("<u4")[unused].any():
            raise CodecError("non-zero lookup entry for an unused code")
        pos = np.empty(n, dtype=np.int64)
        pos[:full] = (grid + (np.arange(rows, dtype=np.int64) * SUB)[:, None]).reshape(-1)
        pos[full:] = last + rows * SUB
        return pos, lookup[codes]



class SparseMean(_Support):
    """The support of any fp32 tensor, positions exact and values int8 (module docstring).

    ``max_support``: the most non-zeros a sub-chunk may hold, in [1, 4096]; with n members'
    top-k contributions it is n * k (capped at 4096).
    """

    name = "sparse-mean"
    _values = BlockwiseInt8()

    def __init__(self, max_support: int = SUB) -> None:
        if isinstance(max_support, bool) or not isinstance(max_support, int) \
                or not 1 <= max_support <= SUB:
            raise ValueError(f"max_support must be an int in [1, {SUB}], got {max_support!r}")
        self.max_support = max_support

    @staticmethod
    def _layout(counts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, int]:
        """(which sub-chunks list their indices, total encoded size)."""
        bitmap = (lengths + 7) // 8
        listed = 12 * counts <= 8 * bitmap
        s = int(counts.sum())
        size = (2 * counts.size + (12 * int(counts[listed].sum()) + 7) // 8
                + int(bitmap[~listed].sum()) + SparseMean._values.encoded_size(s))
        return listed, size

    def encoded_size(self, numel: int) -> int:
        lengths = _lengths(numel)
        return self._layout(np.minimum(lengths, self.max_support), lengths)[1]

    def encode(self, x: torch.Tensor) -> bytes:
        if x.dim() != 1:
            raise ValueError("codecs take 1-D tensors")
        a = x.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
        if a.size and not np.isfinite(np.abs(a).max()):
            raise ValueError("sparse-mean codec cannot encode non-finite values")
        rows, tail = _split(a.size)
        lengths = _lengths(a.size)
        nonzero = a != 0
        pos = np.flatnonzero(nonzero)
        row = pos >> 12
        counts = np.bincount(row, minlength=lengths.size)
        if (counts > self.max_support).any():
            raise ValueError(f"a sub-chunk holds {counts.max()} non-zeros, more than "
                             f"max_support={self.max_support}")
        listed, _ = self._layout(counts, lengths)
        parts = [counts.astype("<u2").tobytes(), _pack12(pos[listed[row]] & (SUB - 1))]
        bitmap_rows = np.flatnonzero(~listed[:rows])
        if bitmap_rows.size:
            grid = nonzero[: rows * SUB].reshape(rows, SUB)[bitmap_rows]
            parts.append(np.packbits(grid, axis=1, bitorder="little").tobytes())
        if tail and not listed[-1]:
            parts.append(np.packbits(nonzero[rows * SUB :], bitorder="little").tobytes())
        parts.append(self._values.encode(torch.from_numpy(a[pos])))
        return b"".join(parts)

    def _parse(self, data: bytes | memoryview, numel: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, values) of a valid encoding; CodecError otherwise."""
        buf = _bytes(data)
        lengths = _lengths(numel)
        nsub = lengths.size
        if buf.size < 2 * nsub:
            raise CodecError(f"sparse-mean payload of {buf.size} bytes for {numel} values")
        counts = buf[: 2 * nsub].view("<u2").astype(np.int64)
        if (counts > np.minimum(lengths, self.max_support)).any():
            raise CodecError(f"sparse-mean count beyond min(L, max_support={self.max_support})")
        listed, size = self._layout(counts, lengths)
        if buf.size != size:
            raise CodecError(f"sparse-mean payload of {buf.size} bytes, counts say {size}")
        off = 2 * nsub
        list_rows = np.flatnonzero(listed)
        n_list = int(counts[list_rows].sum())
        nidx = (12 * n_list + 7) // 8
        local = _unpack12(buf[off : off + nidx], n_list)
        off += nidx
        row = np.repeat(list_rows, counts[list_rows])
        if ((np.diff(local) <= 0) & (row[1:] == row[:-1])).any():
            raise CodecError("sparse-mean indices not strictly ascending within a sub-chunk")
        if (local >= lengths[row]).any():
            raise CodecError("sparse-mean index beyond its sub-chunk")
        mapped = _read_bitmaps(buf[off:], np.flatnonzero(~listed), lengths, counts)
        off += int(((lengths[~listed] + 7) // 8).sum())
        s = int(counts.sum())
        nblocks = -(-s // BlockwiseInt8.block)
        scales = buf[off : off + 4 * nblocks].view("<f4")
        if not np.isfinite(scales).all() or (scales < 0).any():
            raise CodecError("non-finite or negative sparse-mean scale")
        if (buf[off + 4 * nblocks :].view(np.int8) == -128).any():
            raise CodecError("sparse-mean value code -128")
        pos = np.empty(s, dtype=np.int64)
        in_list = np.repeat(listed, counts)
        pos[in_list] = row * SUB + local
        pos[~in_list] = mapped
        return pos, self._values.decode(buf[off:].tobytes(), s).numpy()

