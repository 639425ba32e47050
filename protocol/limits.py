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
    max_objects: int = 32 * 1024
    """Most list items plus map keys and values in one decoded message (containers included).
    The largest honest RolloutBatch (64 rollouts x 64 completions, 32 config entries) has
    about 18k; a payload over the budget is refused while msgpack decodes it, before any
    Python-level walk, so no message costs more to decode than the largest honest one."""

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_str", "max_list", "max_depth", "max_objects"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")


DEFAULT_LIMITS = Limits()


def packb(obj: Any) -> bytes:
    """Encode with msgpack (bin type for bytes, str for text). Deterministic for our inputs."""
    return msgpack.packb(obj, use_bin_type=True)


class _ObjectBudget(Exception):
    pass


class _Counter:
    """msgpack hooks that count decoded objects and stop the decoder past ``budget``.

    msgpack calls a hook once per list or map, after building it, so the check costs one
    Python call per container (not per item), and at most ``max_list`` items are built past
    the budget before the decoder stops."""

    __slots__ = ("left",)

    def __init__(self, budget: int) -> None:
        self.left = budget

    def hook(self, container: Any) -> Any:
        self.left -= len(container) * (2 if isinstance(container, dict) else 1) + 1
        if self.left < 0:
            raise _ObjectBudget
        return container


def unpackb(data: bytes, limits: Limits = DEFAULT_LIMITS, *, check_depth: bool = True) -> Any:
    """Decode untrusted msgpack with every limit enforced; raise DecodeError/TooLarge only.

    ``check_depth=False`` skips the nesting walk (it visits every object in Python): only for
    callers that walk the result with a bounded schema themselves (``Message.from_wire``).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        raise TooLarge(f"message of {len(data)} bytes exceeds {limits.max_message_bytes}")
    counter = _Counter(limits.max_objects)
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
            list_hook=counter.hook,
            object_hook=counter.hook,
        )
    except _ObjectBudget:
        raise TooLarge(f"more than {limits.max_objects} msgpack objects") from None
    except ValueError as e:  # msgpack reports size limits as ValueError
        if "exceeds max" in str(e):
            raise TooLarge(str(e)) from None
        raise DecodeError(f"invalid msgpack: {e}") from None
    except Exception as e:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ...
        raise DecodeError(f"invalid msgpack: {type(e).__name__}: {e}") from None
    if check_depth:
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
            stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))
