"""The sandboxed verifier worker: budgets, restarts and reply checks (faults injected)."""

from __future__ import annotations

import os
import random
import time

import pytest

from node.learner.config import VerifyConfig
from node.learner.tasks import build_task, get_family
from node.learner.verifier import VerifierClient
from tests.learner.hostile_worker import Fault

FAST = VerifyConfig(memory_mb=1024, cpu_s=30, rollout_timeout_s=2.0, call_timeout_s=20.0,
                    start_timeout_s=60.0, max_restarts=3)


def _item(seed: int, prompt: str | None = None) -> dict:
    spec = get_family("tiny_add").sample_spec(random.Random(seed), {})
    task = build_task(spec)
    return {"family": spec.family, "config": dict(spec.config), "seed": spec.seed,
            "index": spec.index, "prompt": task.prompt if prompt is None else prompt,
            "completions": [task.answer + "\n", "x"]}


@pytest.fixture
def hostile():
    clients: list[VerifierClient] = []

    def make(config: VerifyConfig = FAST) -> VerifierClient:
        clients.append(VerifierClient(config, module="tests.learner.hostile_worker"))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def test_worker_is_a_separate_process_and_scores_a_batch(hostile):
    client = hostile()
    out = client.score([_item(1), _item(2, prompt="0+0="), _item(3, prompt=Fault.PRINT)])
    assert out == [(1.0, 0.0), "prompt_mismatch", (0.5, 0.5)]  # stdout noise cannot corrupt frames
    assert client.pid is not None and client.pid != os.getpid() and client.starts == 1


def test_slow_rollout_is_killed_and_the_rest_rescored_by_a_fresh_worker(hostile):
    client = hostile()
    out = client.score([_item(1), _item(2, prompt=Fault.SLOW), _item(3)])
    assert out == [(1.0, 0.0), "verify_timeout", (1.0, 0.0)]
    assert client.starts == 2


@pytest.mark.parametrize("fault,reason", [(Fault.CRASH, "verify_crashed"),
                                          (Fault.BAD, "verify_bad_reply"),
                                          (Fault.HOG, "verify_memory")])
def test_worker_failures_reject_only_that_rollout(hostile, fault, reason):
    client = hostile()
    out = client.score([_item(1, prompt=fault), _item(2)])
    assert out == [reason, (1.0, 0.0)]


def test_cpu_limit_kills_a_spinning_worker(hostile):
    client = hostile(VerifyConfig(cpu_s=1, rollout_timeout_s=30.0, call_timeout_s=30.0))
    out = client.score([_item(1, prompt=Fault.SPIN), _item(2)])
    assert out == ["verify_timeout", (1.0, 0.0)]


def test_restarts_and_call_time_are_bounded(hostile):
    client = hostile(VerifyConfig(max_restarts=1, rollout_timeout_s=5.0))
    out = client.score([_item(i, prompt=Fault.CRASH) for i in range(4)])
    assert out == ["verify_crashed", "verify_crashed", "verify_unavailable", "verify_unavailable"]
    client = hostile(VerifyConfig(rollout_timeout_s=1.0, call_timeout_s=1.5))
    assert client.score([_item(0)]) == [(1.0, 0.0)]  # started (start time counts in a call)
    t = time.monotonic()
    out = client.score([_item(i, prompt=Fault.SLOW) for i in range(4)])
    assert time.monotonic() - t < 1.5 + 1.0  # the call's budget, plus killing the worker
    # the first overran; the rest ran out of the call's time (or a restart could not finish in it)
    assert out[0] == "verify_timeout" and set(out[1:]) <= {"verify_timeout", "verify_unavailable"}
