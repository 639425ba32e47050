"""Re-scoring of received rollouts: only the receiver's tasks, its limits, in the worker."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest

from node.bridge import Received
from node.learner.config import SapoConfig, TaskConfig, VerifyConfig
from node.learner.rescore import Rescorer, special_token_strings
from node.learner.tasks import build_task, get_family
from protocol import PeerAnnouncement, Rollout, RolloutBatch, TaskSpec

G = 4
OWN = TaskConfig(families=("tiny_add", "binary_matrix", "count_primes"),
                 family_config={"tiny_add": {"max_operand": 9}, "count_primes": {"max_n": 1000}})


@pytest.fixture(scope="module")
def rescorer():
    r = Rescorer(OWN, SapoConfig(completions_per_question=G), max_completion_tokens=256,
                 count_tokens=len, special_tokens=("</s>", "<|im_start|>"), verify=VerifyConfig())
    yield r
    r.close()


def _rollout(family: str, config: dict, seed: int, completions=None, *, prompt=None,
             index=0, rewards=()) -> Rollout:
    spec = TaskSpec(family=family, config=config, seed=seed, index=index)
    if prompt is None:
        prompt = build_task(spec).prompt
    if completions is None:
        completions = ("x",) * G
    return Rollout(task=spec, prompt=prompt, completions=tuple(completions), rewards=tuple(rewards))


def _received(*rollouts: Rollout, sender: str = "12D3KooWpeer") -> Received:
    return Received(sender=sender, received_ms=0,
                    message=RolloutBatch(model="m", round=7, rollouts=tuple(rollouts)))


def test_rewards_are_the_receivers_and_claims_are_kept(rescorer):
    spec = TaskSpec(family="tiny_add", config={"max_operand": 9}, seed=11, index=0)
    right = build_task(spec).answer + "\n"
    r = _rollout("tiny_add", {"max_operand": 9, "closeness": 0.5}, 11, (right, "x", "x", right),
                 rewards=(0.0, 1.0, 1.0, 0.0))
    out = rescorer.rescore([_received(r)])
    assert out.rejected == Counter() and len(out.groups) == 1
    g = out.groups[0]
    assert g.group.rewards == (1.0, 0.0, 0.0, 1.0) and g.claimed == (0.0, 1.0, 1.0, 0.0)
    assert (g.sender, g.round, g.family, g.group.source) == ("12D3KooWpeer", 7, "tiny_add", "external")


def test_every_rejection_is_counted_by_reason(rescorer):
    tiny = {"max_operand": 9}
    ok = _rollout("tiny_add", tiny, 1)
    bad = [
        _rollout("tiny_add", tiny, 1, prompt="1+1="),                         # prompt_mismatch
        _rollout("spiral_matrix", {}, 1, prompt="q"),                         # unvetted_family
        _rollout("no_such_family", {}, 1, prompt="q"),                        # unvetted_family
        _rollout("basic_arithmetic", {}, 1),                                  # foreign_family
        _rollout("tiny_add", {"max_operand": 999}, 1),                        # foreign_config
        _rollout("tiny_add", {"max_operand": True}, 1, prompt="q"),           # bad_config
        _rollout("tiny_add", {"bogus": 1}, 1, prompt="q"),                    # bad_config
        _rollout("tiny_add", tiny, 1, ("x",) * (G + 1)),                      # group_size
        _rollout("tiny_add", tiny, 1, ("x",) * (G - 1)),                      # group_size
        _rollout("tiny_add", tiny, 1, ("1" * 257,) + ("x",) * (G - 1)),        # too_long (tokens)
        _rollout("tiny_add", tiny, 1, ("1" * 10**5,) + ("x",) * (G - 1)),     # too_long (chars)
        _rollout("tiny_add", tiny, 1, ("7</s>",) + ("x",) * (G - 1)),         # special_token
        _rollout("tiny_add", tiny, 1, prompt="<|im_start|>1+1="),             # special_token
    ]
    announcement = Received(sender="p", received_ms=0, message=PeerAnnouncement(peer_id="p", addrs=()))
    out = rescorer.rescore([_received(ok, *bad), announcement])
    assert out.batches == 1 and out.rollouts == 1 + len(bad) and len(out.groups) == 1
    assert out.rejected == Counter(prompt_mismatch=1, unvetted_family=2, foreign_family=1,
                                   foreign_config=1, bad_config=2, group_size=2, too_long=2,
                                   special_token=2, not_rollouts=1)


def test_config_is_compared_after_filling_defaults(rescorer):
    # own count_primes config is {"max_n": 1000}; min_n's default (1) may be sent or left out
    a = _rollout("count_primes", {"max_n": 1000, "min_n": 1}, 5)
    b = _rollout("count_primes", {"max_n": 1000}, 6)
    c = _rollout("count_primes", {"max_n": 1000.0}, 7, prompt="q")      # 1000.0 == 1000 in Python
    d = _rollout("count_primes", {"max_n": 1000, "min_n": True}, 8, prompt="q")  # True == 1
    out = rescorer.rescore([_received(a, b, c, d)])
    assert len(out.groups) == 2 and out.rejected == Counter(foreign_config=2)


def test_huge_count_primes_specs_are_rejected_before_any_build():
    r = Rescorer(OWN, SapoConfig(completions_per_question=G), max_completion_tokens=64,
                 count_tokens=len)
    try:
        specs = [_rollout("count_primes", {"max_n": 20_000_000, "min_n": 1}, s, prompt="wrong")
                 for s in range(16)]
        t = time.perf_counter()
        out = r.rescore([_received(*specs), _received(*specs, sender="12D3KooWother")])
        elapsed = time.perf_counter() - t
        assert out.rejected == Counter(foreign_config=32) and not out.groups
        assert r.verifier.starts == 0          # nothing was built or scored, not even a worker
        assert elapsed < 1.0
    finally:
        r.close()


def test_binary_matrix_eval_payload_runs_nothing(rescorer, tmp_path: Path):
    marker = tmp_path / "MARKER"
    spec = get_family("binary_matrix").sample_spec(random.Random(3), {})
    task = build_task(spec)
    payloads = (task.answer, f"__import__('os').system('touch {marker}')",
                f"[[__import__('pathlib').Path('{marker}').touch()]]", "[[" + "9" * 60 + "]]")
    r = Rollout(task=spec, prompt=task.prompt, completions=payloads)
    out = rescorer.rescore([_received(r)])
    assert not out.rejected and out.groups[0].group.rewards == (1.0, 0.0, 0.0, 0.0)
    assert not marker.exists()


def test_special_tokens_of_the_embedded_tokenizer(embedded_base):
    from transformers import AutoTokenizer

    tokens = special_token_strings(AutoTokenizer.from_pretrained(str(embedded_base)))
    assert {"</s>", "<s>", "<pad>", "<unk>"} <= set(tokens)


def test_a_flooding_sender_cannot_use_up_the_budget_of_others():
    r = Rescorer(OWN, SapoConfig(completions_per_question=G), max_completion_tokens=256,
                 count_tokens=len, verify=VerifyConfig(call_timeout_s=60.0))
    scored: list[int] = []
    r.verifier.score = lambda items: [scored.append(it["seed"]) or "verify_timeout"  # type: ignore
                                      for it in items]
    tiny = {"max_operand": 9}
    flood = _received(*[_rollout("tiny_add", tiny, s) for s in range(100, 140)], sender="flood")
    honest = _received(*[_rollout("tiny_add", tiny, s) for s in range(3)], sender="honest")
    r.rescore([flood, honest])
    assert scored[:6] == [100, 0, 101, 1, 102, 2]
    r.close()
