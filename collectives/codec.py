"""Wire codecs for flat fp32 tensors: a strategy ABC and a registry.

Every codec is deterministic: the same tensor always gives the same bytes, and ``decode``
of the same bytes always gives the same tensor on every peer. That is what the all-reduce
relies on for bit-parity: a reducer encodes the averaged shard once and every member
(the reducer included) uses ``decode(those bytes)``.

- ``none``: raw little-endian fp32, 4 bytes/value.
- ``fp16``: IEEE half, 2 bytes/value (values beyond the fp16 range saturate to +-65504).
- ``int8``: blockwise absmax; per block of 1024 values one fp32 scale and 1024 int8 codes
  (1.004 bytes/value). We do not use hivemind's 8-bit codecs: with numpy >= 2.4 they raise
  inside the all-reduce and the failure is swallowed (docs/notes/hivemind.md).
"""

from __future__ import annotations

import abc

import numpy as np
import torch

__all__ = ["Codec", "CODECS", "CODEC_NAMES", "get_codec", "CodecError", "CHUNK_VALUES",
           "chunk_bounds"]

CHUNK_VALUES = 1 << 18
"""Values per wire chunk of a shard (1 MiB as fp32; a multiple of every codec's block)."""


def chunk_bounds(numel: int, chunk: int = CHUNK_VALUES) -> list[tuple[int, int]]:
    """Consecutive chunks [start, end) of ``numel`` values (one empty chunk for 0 values)."""
    return [(a, min(a + chunk, numel)) for a in range(0, numel, chunk)] or [(0, 0)]


class CodecError(ValueError):
    """Bytes that do not decode to a tensor of the expected length."""


class Codec(abc.ABC):
    """Encode a 1-D fp32 CPU tensor to bytes and back."""

    name: str = ""

    @abc.abstractmethod
    def encode(self, x: torch.Tensor) -> bytes:
        """Bytes for the 1-D fp32 tensor ``x``."""

    @abc.abstractmethod
    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        """The 1-D fp32 tensor of ``numel`` values held by ``data``; CodecError if malformed."""

    @abc.abstractmethod
    def encoded_size(self, numel: int) -> int:
        """Exact length of ``encode`` of ``numel`` values (frames are bounded by it)."""

    def decode_into(self, data: bytes | memoryview, out: torch.Tensor) -> None:
        """``out[:] = decode(data, out.numel())`` without an intermediate tensor where the
        codec allows; ``out`` is a contiguous 1-D fp32 CPU tensor (a view is fine)."""
        out.copy_(self.decode(data, out.numel()))

    def for_mean(self, members: int) -> Codec:
        """The codec of the mean a reducer returns for ``members`` contributions in this one
        (a dense codec: itself; ``sparse``: the support of n top-k selections)."""
        return self

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x), x.numel())


def _as_f32(x: torch.Tensor) -> np.ndarray:
    if x.dim() != 1:
        raise ValueError("codecs take 1-D tensors")
    return x.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()


class NoCompression(Codec):
    name = "none"

    def encode(self, x: torch.Tensor) -> bytes:
        return _as_f32(x).astype("<f4", copy=False).tobytes()

    def encoded_size(self, numel: int) -> int:
        return 4 * numel

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        if len(data) != 4 * numel:
            raise CodecError(f"fp32 payload of {len(data)} bytes for {numel} values")
        return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))

    def decode_into(self, data: bytes | memoryview, out: torch.Tensor) -> None:
        if len(data) != 4 * out.numel():
            raise CodecError(f"fp32 payload of {len(data)} bytes for {out.numel()} values")
        np.copyto(out.numpy(), np.frombuffer(data, dtype="<f4"))


class Float16(Codec):
    name = "fp16"

    def encode(self, x: torch.Tensor) -> bytes:
        t = x.detach().to("cpu", torch.float32).clamp(-65504.0, 65504.0).to(torch.float16)
        return t.numpy().tobytes()  # little-endian on every platform torch supports

    def encoded_size(self, numel: int) -> int:
        return 2 * numel

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        if len(data) != 2 * numel:
            raise CodecError(f"fp16 payload of {len(data)} bytes for {numel} values")
        return torch.from_numpy(np.frombuffer(data, dtype="<f2").astype(np.float32))

    def decode_into(self, data: bytes | memoryview, out: torch.Tensor) -> None:
        if len(data) != 2 * out.numel():
            raise CodecError(f"fp16 payload of {len(data)} bytes for {out.numel()} values")
        np.copyto(out.numpy(), np.frombuffer(data, dtype="<f2"))  # exact, like torch's cast


class BlockwiseInt8(Codec):
    """Per block: scale = absmax / 127 (fp32), code = round(x / scale) in [-127, 127]."""

    name = "int8"
    block = 1024

    def encode(self, x: torch.Tensor) -> bytes:
        a = _as_f32(x)
        n = a.size
        nblocks = -(-n // self.block)
        padded = np.zeros(nblocks * self.block, dtype=np.float32)
        padded[:n] = a
        blocks = padded.reshape(nblocks, self.block)
        absmax = np.abs(blocks).max(axis=1) if nblocks else np.zeros(0, np.float32)
        if not np.all(np.isfinite(absmax)):
            raise ValueError("int8 codec cannot encode non-finite values")
        scale = (absmax / np.float32(127.0)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
        codes = np.rint(blocks / safe[:, None]).clip(-127, 127).astype(np.int8)
        return scale.astype("<f4").tobytes() + codes.reshape(-1)[:n].tobytes()

    def encoded_size(self, numel: int) -> int:
        return 4 * -(-numel // self.block) + numel

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        nblocks = -(-numel // self.block)
        if len(data) != 4 * nblocks + numel:
            raise CodecError(f"int8 payload of {len(data)} bytes for {numel} values")
        scale = np.frombuffer(data, dtype="<f4", count=nblocks).astype(np.float32)
        codes = np.frombuffer(data, dtype=np.int8, offset=4 * nblocks).astype(np.float32)
        out = np.zeros(nblocks * self.block, dtype=np.float32)
        out[:numel] = codes
        out = (out.reshape(nblocks, self.block) * scale[:, None]).reshape(-1)[:numel]
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    def decode_into(self, data: bytes | memoryview, out: torch.Tensor) -> None:
        numel = out.numel()
        nblocks = -(-numel // self.block)
        if len(data) != 4 * nblocks + numel:
            raise CodecError(f"int8 payload of {len(data)} bytes for {numel} values")
        scale = np.frombuffer(data, dtype="<f4", count=nblocks)
        codes = np.frombuffer(data, dtype=np.int8, offset=4 * nblocks)
        dst = out.numpy()
        full = numel // self.block * self.block  # int8 x fp32 -> fp32: the same as decode()
        np.multiply(codes[:full].reshape(-1, self.block), scale[: full // self.block, None],
                    out=dst[:full].reshape(-1, self.block))
        if full < numel:
            np.multiply(codes[full:], scale[-1], out=dst[full:])


CODECS: dict[str, type[Codec]] = {c.name: c for c in (NoCompression, Float16, BlockwiseInt8)}
"""The dense codecs: one byte string per value count, decode(encode(x)) close to x."""
CODEC_NAMES = (*CODECS, "sparse")
"""Every codec ``get_codec`` builds: the dense ones and ``sparse`` (collectives/sparse.py)."""


def get_codec(name: str, *, k: int = 64) -> Codec:
    """The codec registered under ``name`` (ValueError if unknown); ``k``: the values per
    4096 that ``sparse`` keeps."""
    if name == "sparse":
        from collectives.sparse import SparseTopK  # it builds on this module

        return SparseTopK(k)
    try:
        return CODECS[name]()
    except KeyError:
        raise ValueError(f"unknown compression {name!r}; known: {list(CODEC_NAMES)}") from None


