from __future__ import annotations

import pytest

from protocol import (
    Identity,
    OuterJoin,
    OuterLeft,
    OuterVersion,
    OuterVote,
    PeerAnnouncement,
    Rollout,
    RolloutBatch,
    TaskSpec,
)


def sample_messages():
    task = TaskSpec(family="arith", config={"digits": 2, "op": "+"}, seed=7, index=3)
    rollout = Rollout(task=task, prompt="2+2=", completions=("4", "5"), rewards=(1.0, 0.0),
                      token_counts=(1, 1))
    return [
        RolloutBatch(model="tiny-abc123", round=4, rollouts=(rollout, rollout)),
        PeerAnnouncement(peer_id="12D3KooWabc", addrs=("/ip4/127.0.0.1/tcp/4001",),
                         model="tiny-abc123", capabilities=("train",), version="0.1.0",
                         collective_addrs=("/ip4/127.0.0.1/tcp/5001",)),
        OuterVersion(group="g1", step=3, state_hash="ab" * 32, parent="cd" * 32,
                     members=("12D3KooWabc", "12D3KooWdef"), period=33),
        OuterVote(group="g1", step=3, state_hash="ab" * 32, parent="cd" * 32,
                  members=("12D3KooWabc",)),
        OuterJoin(group="g1", step=2, state_hash="cd" * 32, clock=65, finished=True,
                  pending=True),
        OuterLeft(group="g1", step=2),
    ]


@pytest.fixture
def identity() -> Identity:
    return Identity.from_seed(bytes(range(32)))


@pytest.fixture(params=range(6), ids=["rollouts", "announce", "version", "vote", "join",
                                      "left"])
def message(request):
    return sample_messages()[request.param]


def real_model_batch(rollouts: int = 8, completions: int = 8, chars: int = 2048) -> RolloutBatch:
    """A round of a real model: ``rollouts`` groups of ``completions`` texts of ~``chars``."""
    out = []
    for i in range(rollouts):
        task = TaskSpec(family="countdown", config={"min_numbers": 3, "max_numbers": 4}, seed=i,
                        index=i)
        texts = tuple((f"<think>{i}.{j} " + "step by step, reasoning ü " * chars)[:chars]
                      for j in range(completions))
        out.append(Rollout(task=task, prompt="Using the numbers 3 5 7, make 22. " * 4,
                           completions=texts, rewards=tuple(0.1 * j for j in range(completions)),
                           token_counts=tuple(len(t) // 4 for t in texts)))
    return RolloutBatch(model="Qwen/Qwen2.5-0.5B-Instruct@abc", round=3, rollouts=tuple(out))
