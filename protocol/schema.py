"""Typed message fields, checked on decode.

A message is a frozen dataclass whose fields carry a ``Spec`` in their metadata. ``to_wire``
turns it into a plain msgpack-able dict; ``from_wire`` checks a decoded dict against the specs:
required fields present, types exact, numbers in range, lengths bounded.

Keys the receiver does not know are skipped, so a newer peer can add optional fields without
breaking older ones, but they are paid for: an ``UnknownBudget`` (one per message, shared by
every nested map) allows a few unknown keys per map and a small total of objects and bytes
under them; beyond it the message is refused with ``UnknownFields`` (reason
``unknown_fields``). A schema walk therefore touches a bounded number of objects whatever the
sender put in the map, and needs no separate depth check.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from protocol.errors import SchemaError, UnknownFields

T = TypeVar("T", bound="Message")

SCALARS = (str, int, float, bool)

MAX_UNKNOWN_PER_MAP = 4
"""Unknown keys allowed in one map."""
MAX_UNKNOWN_DEPTH = 3
"""Deepest nesting under one unknown key."""


@dataclass(kw_only=True)
class UnknownBudget:
    """What the keys a receiver does not know may cost in one message, all maps together."""

    keys: int = 16
    """Unknown keys in the whole message."""
    objects: int = 256
    """Values, list items and map entries under unknown keys."""
    size: int = 4096
    """Characters of unknown keys plus characters/bytes of strings under them."""

    def charge(self, obj: dict[Any, Any], known: frozenset[str], path: str) -> None:
        """Pay for the keys of ``obj`` not in ``known``; raise UnknownFields when over."""
        extra = [k for k in obj if k not in known]
        where = path or "message"
        if len(extra) > MAX_UNKNOWN_PER_MAP:
            raise UnknownFields(where, f"{len(extra)} unknown keys (at most {MAX_UNKNOWN_PER_MAP})")
        self.keys -= len(extra)
        if self.keys < 0:
            raise UnknownFields(where, "too many unknown keys in the message")
        for k in extra:
            self.size -= len(k) if isinstance(k, (str, bytes)) else 1
            self._walk(obj[k], f"{path}.{k}" if path else str(k))

    def _walk(self, value: Any, name: str) -> None:
        stack = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            self.objects -= 1
            if isinstance(item, (str, bytes)):
                self.size -= len(item)
            elif isinstance(item, (list, dict)):
                if depth > MAX_UNKNOWN_DEPTH:
                    raise UnknownFields(name, f"nested deeper than {MAX_UNKNOWN_DEPTH}")
                if len(item) > self.objects:
                    raise UnknownFields(name, "too many objects under unknown keys")
                if isinstance(item, dict):
                    self.size -= sum(len(k) for k in item if isinstance(k, str))
                    stack.extend((v, depth + 1) for v in item.values())
                else:
                    stack.extend((v, depth + 1) for v in item)
            if self.objects < 0 or self.size < 0:
                raise UnknownFields(name, "unknown keys carry too much data")


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
    def from_wire(cls: type[T], obj: Any, path: str = "",
                  budget: UnknownBudget | None = None) -> T:
        """Check a decoded map; ``budget`` is shared by the maps nested in one message."""
        if not isinstance(obj, dict):
            raise SchemaError(path or cls.__name__, f"expected a map, got {type(obj).__name__}")
        if budget is None:
            budget = UnknownBudget()
        # mypy reads type[T] as unhashable (a Message *instance* is: an eq dataclass); a class is
        fields, known = _fields(cls)  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        for fname, fspec, required in fields:
            if fname not in obj:
                if required:
                    raise SchemaError(f"{path}.{fname}" if path else fname,
                                      "required field missing")
                continue
            values[fname] = _check(obj[fname], fspec, f"{path}.{fname}" if path else fname,
                                   budget)
        if len(values) != len(obj):
            budget.charge(obj, known, path)
        try:
            return cls(**values)
        except ValueError as e:  # cross-field checks in __post_init__
            raise SchemaError(path or cls.__name__, str(e)) from None


@functools.cache
def _fields(cls: type[Message]) -> tuple[tuple[tuple[str, Spec, bool], ...], frozenset[str]]:
    fs = dataclasses.fields(cls)  # type: ignore[arg-type]
    return (tuple((f.name, f.metadata["spec"], f.default is dataclasses.MISSING) for f in fs),
            frozenset(f.name for f in fs))


def _to_wire(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_wire()
    if isinstance(value, tuple):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


def _check(value: Any, s: Spec, name: str, budget: UnknownBudget) -> Any:
    kind = s.kind
    if isinstance(kind, type) and issubclass(kind, Message):
        return kind.from_wire(value, name, budget)
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
        fast = _scalar_list(value, s.item)
        if fast is not None:
            return fast
        return tuple(_check(v, s.item, f"{name}[{i}]", budget) for i, v in enumerate(value))
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


_EXACT: dict[type, set[type]] = {str: {str}, bytes: {bytes}, int: {int}, float: {float, int}}


def _scalar_list(value: list[Any], s: Spec) -> tuple[Any, ...] | None:
    """A list of valid scalars checked in bulk (C-level type, length and range checks, no
    per-item path strings); None when any item may be bad or the kind is not a scalar: then
    the item-by-item path runs and names the bad item."""
    allowed = _EXACT.get(s.kind)
    if allowed is None or not set(map(type, value)) <= allowed:
        return None
    if not value:
        return ()
    out: tuple[Any, ...]
    if s.kind is float:
        out = tuple(map(float, value))
        if not all(map(math.isfinite, out)):
            return None
    else:
        out = tuple(value)
    if s.kind in (str, bytes):
        lengths = tuple(map(len, out))
        if min(lengths) < s.min_len or (s.max_len is not None and max(lengths) > s.max_len):
            return None
    elif (s.lo is not None and min(out) < s.lo) or (s.hi is not None and max(out) > s.hi):
        return None
    return out


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
