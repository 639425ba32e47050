"""SIGKILL a peer during the all-reduce on the clock path nodes use, a few randomized times,
a fresh joiner each time: the survivors agree at the kill meeting and the retry progresses
(the bench runs more trials: ``bench/collectives_bench.py --churn-trials``)."""

from __future__ import annotations

import pytest

from tests.collectives.harness import Swarm, by_meet, run_churn

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


def test_survivors_of_a_member_that_died_before_its_vote_go_to_the_next_meeting(
        swarm: Swarm) -> None:
    """A member that contributed to every shard and died before its vote (Fault.VOTE): the
    survivors do not wait for a vote that cannot change their decision (until 0.9 x
    deadline, past the next meeting), so all of them attend the meeting right after the
    kill one and step there.
    Before: each waited 7.2 s of the 8 s deadline with a 4 s period, let the next meeting
    pass; where one survivor did not count the dead peer (it never saw its contribution, or
    suspected it), that one went there alone (bench trial 54 of churn_clock_100.json)."""
    period = 4.0
    results = run_churn(swarm, trials=2, seed=3, peers=3, kinds=("vote",),
                        opts={"period": period})
    assert len(results) == 2, results
    for r in results:
        names = r["survivors"] + [f"j{r['trial']}"]
        assert "error" not in r, (r, swarm.logs(names))
        assert r["kill_ok"] and set(r["kill_status"].values()) == {"ok"}, \
            (r, swarm.logs(r["survivors"]))
        # the meeting right after the kill one, every survivor there, stepping together
        assert r["retry_meet"] == r["kill_meet"] + period, (r, swarm.logs(names))
        assert set(r["survivors"]) <= set(r["retry_status"]), (r, swarm.logs(names))
        assert r["retry_ok"], (r, swarm.logs(names))
        # the vote settled without the dead member's (the survivors' agreeing votes
        # outnumber it), not waited for until the deadline
        for n in r["survivors"]:
            rec = by_meet(swarm, n)[r["kill_meet"]]
            assert len(rec.get("settled_without", [])) == 1, (n, rec)


def test_survivors_do_not_wait_for_the_parts_of_a_member_that_died_before_sending(
        swarm: Swarm) -> None:
    """A member killed before it sent any part (Fault.MEMBER after 0): each survivor's
    reducer sees the victim's connection go and excludes it ("gone") instead of waiting for
    its part until the reduce deadline (0.55 x deadline from the attempt's start: about the
    next meeting's opening with a 4 s period, so some survivors made that meeting and some
    did not: churn_clock_25_votes.json trial 18, a minority at the retry). Every survivor
    fails the kill attempt alike (the victim's shard is missing) and all are at the next
    meeting."""
    period = 4.0
    results = run_churn(swarm, trials=2, seed=5, peers=3, kinds=("member",), after=0,
                        opts={"period": period})
    assert len(results) == 2, results
    for r in results:
        names = r["survivors"] + [f"j{r['trial']}"]
        assert "error" not in r, (r, swarm.logs(names))
        assert r["kill_ok"], (r, swarm.logs(r["survivors"]))
        for n in r["survivors"]:
            rec = by_meet(swarm, n)[r["kill_meet"]]
            assert "gone" in rec["excluded"].values(), (n, rec)
        assert r["retry_meet"] == r["kill_meet"] + period, (r, swarm.logs(names))
        assert set(r["survivors"]) <= set(r["retry_status"]), (r, swarm.logs(names))
        assert r["retry_ok"], (r, swarm.logs(names))
