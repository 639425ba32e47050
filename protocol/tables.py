"""Config tables: a frozen dataclass built from an untyped table (TOML or JSON), or refused
with the key at fault.

Every process boundary of a node carries its configs as JSON tables (the supervisor hands
each child its table), and the supervisor checks the same tables before any child starts,
so both build them here::

    config = build_table(OuterConfig, {"every_rounds": 2})   # or TableError

``build_table`` refuses unknown keys (naming the closest known one), values whose type does
not match the field's annotation (``int``, ``float``, ``bool``, ``str``, ``X | None``,
``tuple[X, ...]``, ``dict[K, V]``, ``Any``; lists are taken for tuples), builds fields whose
type is itself a dataclass from their sub-table, and lets the class's ``__post_init__`` check
ranges. A ``__post_init__`` names the field at fault by raising ``TableError(key, reason)``.

A class that moved keys into sub-tables lists them in a ``MOVED_KEYS`` class attribute
(``{"outer_lr": "optimizer.lr"}``): an old flat key is still taken, put in its place, and a
warning names the new place; the same setting given both ways is refused.
Imports nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["TableError", "build_table", "check_table", "non_negative", "positive"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


class TableError(ValueError):
    """A config value a user must fix: ``key`` (dotted for a sub-table: ``sapo.external``; ""
    for the table as a whole) and ``reason``."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}" if key else reason)
        self.key = key
        self.reason = reason

    def within(self, table: str) -> TableError:
        """The same error seen from the table that holds ``table``."""
        return TableError(f"{table}.{self.key}" if self.key else table, self.reason)


def build_table(cls: type[T], data: Any) -> T:
    """An instance of the dataclass ``cls`` from ``data`` (an instance passes through)."""
    if isinstance(data, cls):
        return data
    kwargs = check_table(cls, data)
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise TableError(missing[0], "required")
    return cls(**kwargs)


def check_table(cls: type, data: Any) -> dict[str, Any]:
    """``data``'s keys and value types checked against the fields of ``cls`` (a partial table
    is fine); the values as ``cls`` takes them (tuples for lists, built sub-tables)."""
    if not isinstance(data, Mapping):
        raise TableError("", f"must be a table, got {_kind(data)}")
    moved = getattr(cls, "MOVED_KEYS", None)
    if moved:
        data = _nest_moved(data, moved, cls.__name__)
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise TableError(str(key), "unknown key" + _did_you_mean(
                str(key), [*names, *(moved or ())]))  # an old name is still a fine one
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            try:
                out[key] = build_table(hint, value)
            except TableError as e:
                raise e.within(key) from None
            continue
        try:
            out[key] = _typed(value, hint)
        except _Mismatch:
            raise TableError(key, f"expected {_describe(hint)}, got {_kind(value)}") from None
    return out


def positive(obj: object, *names: str) -> None:
    """``TableError`` for the first of ``obj``'s fields ``names`` that is not > 0."""
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise TableError(name, f"must be positive, got {value!r}")


def non_negative(obj: object, *names: str) -> None:
    """``TableError`` for the first of ``obj``'s fields ``names`` that is not >= 0."""
    for name in names:
        value = getattr(obj, name)
        if not value >= 0:
            raise TableError(name, f"must be >= 0, got {value!r}")


def _nest_moved(data: Mapping[str, Any], moved: Mapping[str, str], name: str) -> dict[str, Any]:
    """``data`` with each old flat key of ``moved`` put at its dotted place."""
    out = dict(data)
    for old, new in moved.items():
        if old not in out:
            continue
        value = out.pop(old)
        *path, key = new.split(".")
        table = out
        for part in path:
            sub = table.get(part, {})
            if not isinstance(sub, Mapping):
                raise TableError(part, f"must be a table, got {_kind(sub)}")
            table[part] = table = dict(sub)
        if key in table:
            raise TableError(old, f"given twice: as {old} and as [{'.'.join(path)}] {key}")
        table[key] = value
        logger.warning("%s: key %s is now %s in [%s] (the old name still works)", name, old,
                       key, ".".join(path))
    return out


class _Mismatch(Exception):
    pass


def _typed(value: Any, hint: Any) -> Any:
    """``value`` as a field annotated ``hint`` takes it, or ``_Mismatch``."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _typed(value, arm)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is tuple and isinstance(value, (list, tuple)):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(v, args[0]) for v in value)
        if len(args) == len(value):
            return tuple(_typed(v, a) for v, a in zip(value, args))
        raise _Mismatch
    if origin is dict and isinstance(value, Mapping):
        k, v = args or (Any, Any)
        return {_typed(key, k): _typed(val, v) for key, val in value.items()}
    if hint is type(None) and value is None:
        return value
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if hint is str and isinstance(value, str):
        return value
    raise _Mismatch


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" \
            if len(args) == 2 and args[1] is Ellipsis else "a list"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            type(None): "nothing"}.get(hint, getattr(hint, "__name__", str(hint)))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _did_you_mean(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
