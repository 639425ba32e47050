"""Runs shared by the adversary tests: one baseline and two attacked runs per session.

Every run is a bootstrap + two honest ``join`` nodes with the same identities, ports
chosen fresh, the same seeds and the same number of rounds; the attacked runs add hostile
processes. Run A holds the attacks whose effects have their own counters and bounds
(code execution, CPU/memory bomb, unknown keys, bad pubsub signatures, DiLoCo takeover);
run B the two that target what the honest nodes learn (one steering identity and 20 Sybils),
so a reward or hijack failure is attributed to one family of attack.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.adversary.attacks import Attack
from tests.adversary.harness import Plan, run_swarm

ROUNDS = 30
"""Enough rounds for the embedded model to learn visibly (mean reward 0.04 → ~0.25) and
for steering to show on main (7 % "9999" in the last 15 rounds; 0.6 % after 20 rounds)."""
EVERY_ROUNDS = 10
"""Outer steps after rounds 9, 19 and 29: the takeover has three chances."""
TIMEOUT_S = 300.0

RUN_A = ((Attack.CODE_EXEC, {}),
         # 1 message of 8 specs (main: ~1.3 GB more per learner, a minute of sieving): far
         # past the RSS and round-time bounds, yet safe to run on a shared CI machine
         (Attack.CPU_BOMB, {"messages": 1, "specs": 8}),
         (Attack.UNKNOWN_KEYS, {}),
         (Attack.BAD_SIGNATURES, {}),
         (Attack.DILOCO_TAKEOVER, {}))
RUN_B = ((Attack.STEERING, {}), (Attack.SYBIL, {}), (Attack.OBSERVE, {}))


def _run(attacks: tuple[tuple[Attack, dict[str, Any]], ...]) -> dict[str, Any]:
    return run_swarm(Plan(rounds=ROUNDS, every_rounds=EVERY_ROUNDS, timeout_s=TIMEOUT_S,
                          attacks=attacks))


@pytest.fixture(scope="session")
def baseline() -> dict[str, Any]:
    return _run(())


@pytest.fixture(scope="session")
def run_a() -> dict[str, Any]:
    return _run(RUN_A)


@pytest.fixture(scope="session")
def run_b() -> dict[str, Any]:
    return _run(RUN_B)
