from __future__ import annotations

import random

from node.bridge import Received
from node.learner.config import SapoConfig
from node.learner.config import TaskConfig
from node.learner.rescore import Rescorer
from node.learner.sapo import ExternalPool, plan_round
from node.learner.tasks import build_task
from protocol import Rollout, RolloutBatch, TaskSpec


def _rollout(seed: int, completions: tuple[str, ...], *, family="tiny_add", prompt=None,
             rewards=None) -> Rollout:
    spec = TaskSpec(family=family, config={"max_operand": 9, "closeness": 0.5}, seed=seed, index=0)
    completions = completions + ("x",) * (8 - len(completions))  # the receiver's group size
    if prompt is None:
        prompt = build_task(spec).prompt if family == "tiny_add" else "?"
    return Rollout(task=spec, prompt=prompt, completions=completions,
                   rewards=rewards or tuple(0.0 for _ in completions))


def _answer(seed: int) -> str:
    return build_task(TaskSpec(family="tiny_add", config={"max_operand": 9, "closeness": 0.5}, seed=seed, index=0)).answer


def _received(*rollouts: Rollout) -> Received:
    return Received(sender="12D3KooWpeer", received_ms=0,
                    message=RolloutBatch(model="m", round=0, rollouts=tuple(rollouts)))


def _ingest(pool: ExternalPool, received: list[Received]):
    rescorer = Rescorer(TaskConfig(), pool.config)
    try:
        result = rescorer.rescore(received)
    finally:
        rescorer.close()
    pool.add(result.groups)
    return result


def test_plan_round_keeps_the_budget():
    cfg = SapoConfig(questions_per_round=8, local=4, external=4)
    assert plan_round(cfg, 10) == (4, 4)
    assert plan_round(cfg, 1) == (7, 1)
    assert plan_round(cfg, 0) == (8, 0)
    assert plan_round(SapoConfig(local=8, external=0), 10) == (8, 0)


def test_zero_advantage_groups_are_discarded_before_sampling():
    flat = _rollout(4, ("x", "y", "z"))                  # all score 0
    useful = _rollout(5, (_answer(5) + "\n", "x"))
    pool = ExternalPool(SapoConfig())
    _ingest(pool, [_received(flat, useful)])
    assert len(pool) == 1 and pool.zero_advantage_discarded == 1
    unfiltered = ExternalPool(SapoConfig(filter_zero_advantage=False))
    _ingest(unfiltered, [_received(flat, useful)])
    assert len(unfiltered) == 2


def test_take_draws_without_replacement_and_removes():
    pool = ExternalPool(SapoConfig())
    _ingest(pool, [_received(*[_rollout(s, (_answer(s) + "\n", "x")) for s in range(10)])])
    rng = random.Random(0)
    a = pool.take(4, rng)
    b = pool.take(4, rng)
    c = pool.take(4, rng)
    assert (len(a), len(b), len(c), len(pool)) == (4, 4, 2, 0)
    assert len({id(g) for g in a + b + c}) == 10
