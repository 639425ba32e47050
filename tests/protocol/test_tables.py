"""protocol.tables: keys moved into sub-tables still work under their old flat names."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from protocol.tables import TableError, build_table


@dataclass(frozen=True)
class Inner:
    lr: float = 1.0
    momentum: float = 0.0


@dataclass(frozen=True)
class Outer:
    MOVED_KEYS: ClassVar[dict[str, str]] = {"outer_lr": "optimizer.lr"}
    every: int = 1
    optimizer: Inner = field(default_factory=Inner)


def test_an_old_flat_key_lands_in_its_sub_table_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="protocol.tables"):
        got = build_table(Outer, {"outer_lr": 0.5, "optimizer": {"momentum": 0.9}})
    assert got == Outer(optimizer=Inner(lr=0.5, momentum=0.9))
    assert "outer_lr is now lr in [optimizer]" in caplog.text


def test_the_new_place_works_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="protocol.tables"):
        assert build_table(Outer, {"optimizer": {"lr": 0.25}}).optimizer.lr == 0.25
    assert caplog.text == ""


def test_a_setting_given_both_ways_is_refused():
    with pytest.raises(TableError, match="outer_lr: given twice"):
        build_table(Outer, {"outer_lr": 0.5, "optimizer": {"lr": 0.25}})


def test_a_moved_key_is_still_type_checked_at_its_new_place():
    with pytest.raises(TableError, match=r"optimizer\.lr: expected a number"):
        build_table(Outer, {"outer_lr": "fast"})
    with pytest.raises(TableError, match="optimizer: must be a table"):
        build_table(Outer, {"outer_lr": 0.5, "optimizer": 3})


def test_a_typo_of_an_old_flat_key_is_told_the_old_name_that_still_works():
    with pytest.raises(TableError, match=r"outer_l: unknown key \(did you mean outer_lr\?\)"):
        build_table(Outer, {"outer_l": 0.5})
