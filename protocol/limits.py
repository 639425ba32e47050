"""Size limits and the strict msgpack codec used at every boundary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from protocol.errors import DecodeError, TooLarge


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Upper bounds applied while decoding untrusted bytes."""

    max_message_bytes: int = 960 * 1024
    """Whole encoded message; stays under gossipsub's 1 MiB RPC cap with room for framing."""
    max_str: int = 64 * 1024
    """Longest string (characters) or byte string anywhere in a message."""
    max_list: int = 1024
    """Longest list or map anywhere in a message."""
    max_depth: int = 8
    """Deepest nesting of lists/maps."""

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_str", "max_list", "max_depth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")


DEFAULT_LIMITS = Limits()


def packb(obj: Any) -> bytes:
    """Encode with msgpack (bin type for bytes, str for text). Deterministic for our inputs."""
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode untrusted msgpack with every limit enforced; raise DecodeError/TooLarge only."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        raise TooLarge(f"message of {len(data)} bytes exceeds {limits.max_message_bytes}")
    try:
        obj = msgpack.unpackb(
            bytes(data),
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_str * 4,  # msgpack counts bytes; utf-8 is ≤4 bytes/char
            max_bin_len=limits.max_str,
            max_array_len=limits.max_list,
            max_map_len=limits.max_list,
            max_ext_len=0,
        )
    except ValueError as e:  # msgpack reports size limits as ValueError
        if "exceeds max" in str(e):
            raise TooLarge(str(e)) from None
        raise DecodeError(f"invalid msgpack: {e}") from None
    except Exception as e:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ...
        raise DecodeError(f"invalid msgpack: {type(e).__name__}: {e}") from None
    _check_depth(obj, limits.max_depth)
    return obj


def _check_depth(obj: Any, max_depth: int) -> None:
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > max_depth:
                raise TooLarge(f"nesting deeper than {max_depth}")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)
