"""Typed message fields, checked on decode.

A message is a frozen dataclass whose fields carry a ``Spec`` in their metadata. ``to_wire``
turns it into a plain msgpack-able dict; ``from_wire`` checks a decoded dict against the specs:
required fields present, types exact, numbers in range, lengths bounded. Keys the receiver does
not know are ignored, so a newer peer can add optional fields without breaking older ones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from protocol.errors import SchemaError

T = TypeVar("T", bound="Message")

SCALARS = (str, int, float, bool)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """How one field is checked. ``kind`` is one of: str, bytes, int, float, bool, list,
    scalar_map (str → str/int/float/bool) or a Message subclass (nested message)."""

    kind: Any
    lo: float | None = None
    hi: float | None = None
    max_len: int | None = None
    min_len: int = 0
    item: Spec | None = None


def spec(kind: Any, *, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A dataclass field with a Spec; fields with a default are optional on the wire."""
    meta = {"spec": Spec(kind=kind, **kw)}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples / factories for defaults")
    return dataclasses.field(default=default, metadata=meta)


class Message:
    """Base class of every wire message. Subclasses are frozen kw-only dataclasses."""

    TYPE: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            out[f.name] = _to_wire(getattr(self, f.name))
        return out

    @classmethod
    def from_wire(cls: type[T], obj: Any, path: str = "") -> T:
        if not isinstance(obj, dict):
            raise SchemaError(path or cls.__name__, f"expected a map, got {type(obj).__name__}")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            name = f"{path}.{f.name}" if path else f.name
            if f.name not in obj:
                if f.default is dataclasses.MISSING:
                    raise SchemaError(name, "required field missing")
                continue
            values[f.name] = _check(obj[f.name], f.metadata["spec"], name)
        try:
            return cls(**values)
        except ValueError as e:  # cross-field checks in __post_init__
            raise SchemaError(path or cls.__name__, str(e)) from None


def _to_wire(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_wire()
    if isinstance(value, tuple):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


def _check(value: Any, s: Spec, name: str) -> Any:
    kind = s.kind
    if isinstance(kind, type) and issubclass(kind, Message):
        return kind.from_wire(value, name)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(name, f"expected a number, got {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value):
            raise SchemaError(name, "not finite")
        _range(value, s, name)
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(name, f"expected an integer, got {type(value).__name__}")
        _range(value, s, name)
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise SchemaError(name, f"expected a bool, got {type(value).__name__}")
        return value
    if kind in (str, bytes):
        if not isinstance(value, kind):
            raise SchemaError(name, f"expected {kind.__name__}, got {type(value).__name__}")
        _length(value, s, name)
        return value
    if kind is list:
        if not isinstance(value, list):
            raise SchemaError(name, f"expected a list, got {type(value).__name__}")
        _length(value, s, name)
        if s.item is None:
            raise TypeError(f"list spec of {name} has no item spec")  # a bug in a definition
        return tuple(_check(v, s.item, f"{name}[{i}]") for i, v in enumerate(value))
    if kind == "scalar_map":
        if not isinstance(value, dict):
            raise SchemaError(name, f"expected a map, got {type(value).__name__}")
        _length(value, s, name)
        for k, v in value.items():
            if not isinstance(k, str) or len(k) > 64:
                raise SchemaError(name, "map keys must be strings of ≤64 characters")
            if not isinstance(v, SCALARS) or (isinstance(v, str) and len(v) > 256):
                raise SchemaError(f"{name}.{k}", "values must be scalars (strings ≤256)")
            if isinstance(v, float) and not math.isfinite(v):
                raise SchemaError(f"{name}.{k}", "not finite")
        return dict(value)
    raise TypeError(f"unknown spec kind {kind!r}")  # a bug in a message definition


def _range(value: float, s: Spec, name: str) -> None:
    if s.lo is not None and value < s.lo:
        raise SchemaError(name, f"{value} is below {s.lo}")
    if s.hi is not None and value > s.hi:
        raise SchemaError(name, f"{value} is above {s.hi}")


def _length(value: Any, s: Spec, name: str) -> None:
    if s.max_len is not None and len(value) > s.max_len:
        raise SchemaError(name, f"length {len(value)} exceeds {s.max_len}")
    if len(value) < s.min_len:
        raise SchemaError(name, f"length {len(value)} is below {s.min_len}")
