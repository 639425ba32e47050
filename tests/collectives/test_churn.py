"""SIGKILL a peer during the all-reduce on the clock path nodes use, a few randomized times,
a fresh joiner each time: the survivors agree at the kill meeting and the retry progresses
(the bench runs more trials: ``bench/collectives_bench.py --churn-trials``)."""

from __future__ import annotations

import pytest

from tests.collectives.harness import Swarm, run_churn

pytestmark = pytest.mark.slow


def test_survivors_agree_after_kill_during_allreduce_and_the_retry_progresses(
        swarm: Swarm) -> None:
    results = run_churn(swarm, trials=3, seed=7, peers=3)
    assert len(results) == 3, results
    for r in results:
        names = r["survivors"] + [f"j{r['trial']}"]
        assert "error" not in r, (r, swarm.logs(names))
        # the kill meeting: every survivor stepped, or every one failed with its state
        # untouched: one state either way
        assert r["kill_ok"], (r, swarm.logs(r["survivors"]))
        # the next meeting: every survivor there stepped with others, at one state (the
        # joiner's too if it was already in)
        assert r["retry_ok"], (r, swarm.logs(names))
        # the fresh joiner took part in a later meeting
        assert r["joiner_grouped"], (r, swarm.logs(names))
