from __future__ import annotations

import pytest

from node.bridge import Received
from node.learner.baseline import OwnBaseline
from node.learner.config import SapoConfig, TaskConfig
from node.learner.grpo import TrainingGroup
from node.learner.rescore import Rescorer, ScoredGroup
from node.learner.sapo import ExternalPool, RoundSignals, SignalTracker, adaptive_target, plan_round
from node.learner.tasks import build_task
from protocol import Rollout, RolloutBatch, TaskSpec

SPEC_CONFIG = {"max_operand": 9, "closeness": 0.5}


def _rollout(seed: int, completions: tuple[str, ...], *, family="tiny_add", prompt=None,
             rewards=None) -> Rollout:
    spec = TaskSpec(family=family, config=SPEC_CONFIG, seed=seed, index=0)
    completions = completions + ("x",) * (8 - len(completions))  # the receiver's group size
    if prompt is None:
        prompt = build_task(spec).prompt if family == "tiny_add" else "?"
    return Rollout(task=spec, prompt=prompt, completions=completions,
                   rewards=rewards or tuple(0.0 for _ in completions))


def _answer(seed: int) -> str:
    return build_task(TaskSpec(family="tiny_add", config=SPEC_CONFIG, seed=seed, index=0)).answer


def _received(*rollouts: Rollout, sender="12D3KooWpeer", round_=0) -> Received:
    return Received(sender=sender, received_ms=0,
                    message=RolloutBatch(model="m", round=round_, rollouts=tuple(rollouts)))


def _ingest(pool: ExternalPool, received: list[Received], now: int = 0):
    rescorer = Rescorer(TaskConfig(families=("tiny_add",)), pool.config)
    try:
        result = rescorer.rescore(received)
    finally:
        rescorer.close()
    pool.add(result.groups, now=now)
    return result


def _scored(sender: str, key: int, *, round_=0, rewards=(1.0, 0.0), prompt=None,
            completions=None) -> ScoredGroup:
    """A synthetic re-scored group (distinct content per ``key``), honest claims."""
    completions = completions or tuple(f"{key}-{i}\n" for i in range(len(rewards)))
    group = TrainingGroup(prompt=prompt or f"q{key}=", completions=completions, rewards=rewards,
                          source="external")
    return ScoredGroup(sender=sender, round=round_, received_ms=0, family="tiny_add", group=group,
                       claimed=rewards)


def _earn_trust(pool: ExternalPool, sender: str, start: int = 900_000) -> None:
    """Let ``sender`` prove useful ``trust_after`` times, alone in the pool."""
    for i in range(pool.config.trust_after):
        pool.add([_scored(sender, start + i, round_=i)], now=i)
        assert len(pool.take(1, now=i)) == 1
    assert pool.book.trusted(sender)


# -- I/J split ---------------------------------------------------------------------------------

def test_plan_round_keeps_the_budget():
    cfg = SapoConfig(questions_per_round=8, external=4)
    assert plan_round(cfg, 10) == (4, 4)
    assert plan_round(cfg, 1) == (7, 1)
    assert plan_round(cfg, 0) == (8, 0)
    assert plan_round(SapoConfig(external=0), 10) == (8, 0)
    # signals are ignored unless adaptive_external is on
    assert plan_round(cfg, 10, RoundSignals(external_signal=0.0)) == (4, 4)


def test_adaptive_j_stays_within_bounds():
    cfg = SapoConfig(external=6, min_external=1, adaptive_external=True)
    grid = [i / 4 for i in range(5)]
    for flat in grid:
        for useful in grid:
            for trend in (-0.2, -0.01, 0.0, 0.1):
                s = RoundSignals(local_flat=flat, external_signal=useful, reward_trend=trend)
                assert 1 <= adaptive_target(cfg, s) <= 6
                i, j = plan_round(cfg, 100, s)
                assert i + j == 8 and 1 <= j <= 6
                assert plan_round(cfg, 0, s) == (8, 0)      # never more than is available


def test_adaptive_j_responds_to_what_the_node_measures():
    cfg = SapoConfig(external=8, adaptive_external=True)
    useless = RoundSignals(local_flat=1.0, external_signal=0.0)
    assert adaptive_target(cfg, useless) == 0                      # externals never help: none
    flat = adaptive_target(cfg, RoundSignals(local_flat=1.0, external_signal=1.0))
    informative = adaptive_target(cfg, RoundSignals(local_flat=0.0, external_signal=1.0))
    assert flat == 8 and informative == 4                          # flat locals: lean on the swarm
    falling = adaptive_target(cfg, RoundSignals(local_flat=1.0, external_signal=1.0, reward_trend=-0.1))
    assert falling < flat                                          # destabilised: pull back
    tracker = SignalTracker()
    for reward in (0.6, 0.6, 0.6, 0.3, 0.2, 0.1):
        tracker.observe(local_flat=1.0, external_signal=1.0, mean_reward=reward)
    sig = tracker.signals()
    assert sig.reward_trend < 0 and sig.local_flat > 0.8 and sig.external_signal > 0.8
    assert adaptive_target(cfg, sig) < 8
    # externals that carried nothing push J to its floor; unmeasured rounds let it be tried again
    tracker = SignalTracker()
    for _ in range(20):
        tracker.observe(local_flat=0.0, external_signal=0.0, mean_reward=0.5)
    assert adaptive_target(cfg, tracker.signals()) == 0
    for _ in range(20):
        tracker.observe(local_flat=0.0, external_signal=None, mean_reward=0.5)
    assert adaptive_target(cfg, tracker.signals()) > 0


# -- re-scoring and the filter -----------------------------------------------------------------

def test_zero_advantage_groups_are_discarded_before_sampling():
    flat = _rollout(4, ("x", "y", "z"))                  # all score 0
    useful = _rollout(5, (_answer(5) + "\n", "x"))
    pool = ExternalPool(SapoConfig())
    _ingest(pool, [_received(flat, useful)])
    assert len(pool) == 1 and pool.zero_advantage_discarded == 1
    unfiltered = ExternalPool(SapoConfig(filter_zero_advantage=False))
    _ingest(unfiltered, [_received(flat, useful)])
    assert len(unfiltered) == 2


def test_filter_runs_before_sampling_so_flat_groups_never_take_a_slot():
    pool = ExternalPool(SapoConfig(trust_after=0))
    flat = [_scored("A", k, rewards=(0.5, 0.5)) for k in range(10)]
    pool.add(flat + [_scored("A", 99)], now=0)
    assert pool.available(0) == 1
    taken = pool.take(4, now=0)
    assert [t.group.prompt for t in taken] == ["q99="] and pool.counters["zero_advantage"] == 10


def test_take_draws_without_replacement_and_removes():
    pool = ExternalPool(SapoConfig(trust_after=0, per_sender_round=8))
    pool.add([_scored("A", k) for k in range(10)], now=0)
    a, b, c = (pool.take(4, now=0) for _ in range(3))
    assert (len(a), len(b), len(c), len(pool)) == (4, 4, 2, 0)
    assert len({t.group.prompt for t in a + b + c}) == 10


# -- freshness ---------------------------------------------------------------------------------

def test_groups_older_than_the_bound_are_never_used():
    pool = ExternalPool(SapoConfig(max_age_rounds=2, trust_after=0, per_sender_round=8))
    pool.add([_scored("A", k, round_=0) for k in range(4)], now=0)
    assert pool.available(2) == 4                         # age 2: still fresh
    assert pool.available(3) == 0 and pool.take(4, now=3) == []
    assert pool.counters["stale"] == 4 and len(pool) == 0
    # by the sender's clock: once it shows round 5, its round-0 groups are 5 rounds old
    pool.add([_scored("B", 10, round_=0)], now=3)
    pool.add([_scored("B", 11, round_=5)], now=3)
    taken = pool.take(8, now=3)
    assert [t.group.prompt for t in taken] == ["q11="] and pool.counters["stale"] == 5
    # a group that arrives already stale is dropped at once
    pool.add([_scored("B", 12, round_=1)], now=3)
    assert len(pool) == 0 and pool.counters["stale"] == 6


def test_freshest_first_and_age_reported():
    pool = ExternalPool(SapoConfig(max_age_rounds=2, trust_after=0, per_sender_round=8))
    for now in range(3):
        pool.add([_scored("A", 10 * now + k, round_=now) for k in range(2)], now=now)
    taken = pool.take(3, now=2)
    assert [t.age for t in taken] == [0, 0, 1]
    assert {t.group.prompt for t in taken[:2]} == {"q20=", "q21="}


# -- dedupe ------------------------------------------------------------------------------------

def test_duplicates_are_dropped_and_counted():
    pool = ExternalPool(SapoConfig(trust_after=0))
    first = _scored("A", 1, completions=("1\n", "2\n"))
    copy_by_other = _scored("B", 1, completions=("2\n", "1\n"))           # same multiset
    same_prompt_again = _scored("A", 1, completions=("3\n", "4\n"))       # A already has q1=
    other_sender_same_prompt = _scored("B", 1, completions=("5\n", "6\n"))
    pool.add([first, copy_by_other, same_prompt_again, other_sender_same_prompt], now=0)
    assert len(pool) == 2 and pool.counters["duplicate"] == 2
    pool.take(8, now=0)
    pool.add([_scored("C", 1, completions=("1\n", "2\n"))], now=1)       # replay after use
    assert len(pool) == 0 and pool.counters["duplicate"] == 3


# -- shares, reputation, Sybils ----------------------------------------------------------------

def test_per_sender_caps_per_round_and_in_the_pool():
    cfg = SapoConfig(trust_after=0, per_sender_round=2, sender_pool_share=0.25, pool_capacity=16)
    pool = ExternalPool(cfg)
    pool.add([_scored("A", k) for k in range(10)] + [_scored("B", 100 + k) for k in range(3)], now=0)
    assert sum(1 for e in pool._entries.values() if e.sender == "A") == 4      # 25% of 16
    assert pool.counters["sender_capped"] == 6
    taken = pool.take(8, now=0)
    by_sender = [t.sender for t in taken]
    assert by_sender.count("A") == 2 and by_sender.count("B") == 2
    assert pool.counters["round_capped"] > 0


def test_new_identity_starts_below_a_good_record():
    pool = ExternalPool(SapoConfig())
    _earn_trust(pool, "good")
    assert pool.book.reputation("fresh") < pool.book.reputation("good")
    pool.add([_scored("fresh", 1, round_=9), _scored("good", 2, round_=9)], now=9)
    assert [t.sender for t in pool.take(2, now=9)] == ["good", "fresh"]


def test_useless_sender_loses_trust():
    pool = ExternalPool(SapoConfig())
    _earn_trust(pool, "turncoat")
    baseline = OwnBaseline(momentum=0.0, group_size=8)
    baseline.update("tiny_add", [(0.5, 0.7)])                 # we already do better than 0.3
    for i in range(20):
        pool.add([_scored("turncoat", 200 + i, round_=10 + i, rewards=(0.3, 0.0))], now=10 + i)
        assert pool.take(1, now=10 + i, baseline=baseline) == []
    assert not pool.book.trusted("turncoat") and pool.counters["not_useful"] == 20


def _attacker_share(senders: list[str], rounds: int = 8) -> tuple[int, int]:
    """(attacker groups trained on, most attacker groups held by the untrusted bucket) while a
    trusted honest peer also publishes 4 fresh groups a round and the attackers flood 40."""
    pool = ExternalPool(SapoConfig(pool_capacity=64))
    _earn_trust(pool, "honest")
    used = held = 0
    for r in range(10, 10 + rounds):
        flood = [_scored(senders[k % len(senders)], 1000 * r + k, round_=r) for k in range(40)]
        pool.add(flood + [_scored("honest", 1000 * r + 500 + k, round_=r) for k in range(4)], now=r)
        held = max(held, sum(not pool.book.trusted(e.sender) for e in pool._entries.values()))
        taken = pool.take(4, now=r)
        assert sum(t.sender == "honest" for t in taken) == 2          # the honest share holds
        used += sum(t.sender != "honest" for t in taken)
    return used, held


def test_twenty_sybils_gain_nothing_over_one_identity():
    one = _attacker_share(["evil"])
    twenty = _attacker_share([f"sybil{i}" for i in range(20)])
    assert twenty[0] <= one[0] and twenty[1] <= one[1] <= 16      # 16 = 25% of 64, shared
    assert one[0] <= 2 * 8                                         # 2 slots a round at most


@pytest.mark.parametrize("size", [8, 64])
def test_steering_group_from_the_pool_gets_no_positive_advantage(size):
    from node.learner.grpo import advantages

    pool = ExternalPool(SapoConfig())
    baseline = OwnBaseline(momentum=0.0, group_size=8)
    baseline.update("tiny_add", [(0.3, 0.6, 0.7, 0.4, 0.5, 0.6, 0.3, 0.4)])   # own mean 0.475
    rewards = (0.3,) + (0.0,) * (size - 1)
    pool.add([_scored("evil", 1, rewards=rewards)], now=0)
    assert pool.available(0, baseline=baseline) == 0          # no signal against our bar
    assert pool.take(1, now=0, baseline=baseline) == []
    assert pool.counters["not_useful"] == 1 and len(pool) == 0
    # without our own baseline (a node that never sampled the family) it is plain GRPO
    pool.add([_scored("evil", 2, rewards=rewards)], now=0)
    (taken,) = pool.take(1, now=0)
    adv = advantages(taken.group)
    assert adv is not None and float(adv[0]) > 0


@pytest.mark.parametrize("bad", [{"min_external": 5}, {"sender_pool_share": 0.0},
                                 {"sender_pool_share": 1.5}, {"trust_min": 2.0},
                                 {"baseline_momentum": 1.0}, {"per_sender_round": 0},
                                 {"max_age_rounds": -1}])
def test_pool_config_is_validated(bad):
    with pytest.raises(ValueError):
        SapoConfig(**bad)


def test_full_pool_evicts_the_oldest_group():
    pool = ExternalPool(SapoConfig(trust_after=0, pool_capacity=4, sender_pool_share=1.0))
    pool.add([_scored("A", 1), _scored("A", 2)] + [_scored("B", k) for k in (3, 4, 5)], now=0)
    assert pool.counters["evicted_full"] == 1 and len(pool) == 4
    assert sorted(e.group.prompt for e in pool._entries.values()) == ["q2=", "q3=", "q4=", "q5="]
