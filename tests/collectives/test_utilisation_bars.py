"""The utilisation bench's bars (bench/utilisation.py ``judge``): what counts as an outer step,
and that each bar can fail."""

from __future__ import annotations

from typing import Any

from bench.utilisation import judge


def rec(status: str, peers: int = 1, made_by: int | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"status": status, "peers": peers}
    if made_by is not None:
        r["made_by"] = made_by
    return r


COLD = [rec("alone"), rec("alone"), rec("resynced", made_by=2), rec("ok", 4), rec("ok", 4)]


def test_lone_attempts_before_the_first_step_are_reported_not_failed() -> None:
    row = judge("n", 0.95, COLD, 0)
    assert row["ok"] and row["outer_steps"] == 3 and row["made_by"] == [2, 4, 4]
    assert row["before_first_step"] == ["alone", "alone"]
    assert row["later_records_grouped"] == 2 and row["later_records"] == 4  # the strict count


def test_each_bar_fails_on_its_own() -> None:
    assert not judge("n", 0.89, COLD, 0)["ok"]  # utilisation
    assert not judge("n", 0.95, COLD, 1)["ok"]  # a discarded round
    assert not judge("n", 0.95, COLD, None)["ok"]  # no count reported
    late_alone = COLD[:3] + [rec("alone")] + COLD[3:]
    row = judge("n", 0.95, late_alone, 0)
    assert not row["ok"] and row["vain_after_first_step"] == ["alone"]
    assert not judge("n", 0.95, COLD + [rec("failed"), rec("ok", 4)], 0)["ok"]
    assert not judge("n", 0.95, COLD + [rec("minority", 2), rec("ok", 4)], 0)["ok"]
    # the last attempt may find the others gone (they stopped first)
    assert judge("n", 0.95, COLD + [rec("minority", 2)], 0)["ok"]
    # a version made by one peer (a lone step) is a step with < 2 peers
    assert not judge("n", 0.95, COLD + [rec("resynced", made_by=1)], 0)["ok"]
    assert not judge("n", 0.95, COLD + [rec("ok", 1)], 0)["ok"]


def test_a_node_that_only_adopts_or_never_steps_fails() -> None:
    adopts = [rec("resynced", made_by=3)] * 4
    row = judge("n", 0.95, adopts, 0)
    assert not row["ok"] and row["grouped_steps"] == 0
    assert not judge("n", 0.95, [rec("alone")] * 5, 0)["ok"]  # no step at all
    assert not judge("n", 0.95, [], 0)["ok"]
