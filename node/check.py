"""One line of `swarm-node doctor` (and of the refusal `join` prints): a verdict, what was
found and, when not ok, the fix."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Check", "Verdict", "fail", "ok", "warn"]


class Verdict(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True, kw_only=True)
class Check:
    """One line of the doctor's output."""

    name: str
    verdict: Verdict
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.verdict.value:<4}  {self.name:<9}  {self.detail}"
        return f"{text}; fix: {self.fix}" if self.fix and self.verdict is not Verdict.OK else text


def ok(name: str, detail: str) -> Check:
    return Check(name=name, verdict=Verdict.OK, detail=detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name=name, verdict=Verdict.WARN, detail=detail, fix=fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name=name, verdict=Verdict.FAIL, detail=detail, fix=fix)
