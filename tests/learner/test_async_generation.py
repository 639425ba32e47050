"""Generation and training overlapped (``engine.staleness``): behaviour log-probs, the
staleness bound, the weights the generator samples from, and the decoupled correction."""

from __future__ import annotations

import math

import pytest
import torch

from node.bridge import LoopbackHub
from node.learner import (EngineConfig, LearnerConfig, PolicyConfig, SapoConfig, TaskConfig,
                          TrainerConfig, run_learner)
from node.learner.generator import weights_hash
from node.learner.grpo import GrpoTrainer, TrainingGroup, build_rows
from node.learner.logprobs import token_logprobs
from node.learner.loop import Learner
from protocol import Identity
from protocol.tables import TableError


def _config(d, *, staleness=0, **kw):
    return LearnerConfig(data_dir=str(d), seed=3, policy=PolicyConfig(device="cpu"), checkpoint_every=0,
                         engine=EngineConfig(staleness=staleness), sapo=SapoConfig(external=0), **kw)


def test_behaviour_logprobs_equal_a_fresh_forward_pass(data_dir):
    """At eta = 0 the engine's recorded log-probs are the trainer's log-probs of the same
    tokens at the same weights (what the decoupled correction divides by)."""
    learner = Learner(_config(data_dir), peer_id="p")
    tok, model = learner.policy.tokenizer, learner.policy.model
    prompts = [learner.prompts.render(p) for p in ("Sort the letters: dcba", "Sort the letters: zyx")]
    groups = learner.engine.generate(prompts, n=4, seed=11)
    checked = 0
    for prompt, group in zip(prompts, groups):
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        for c in group:
            assert len(c.logprobs) == len(c.token_ids) == c.token_count > 0
            ids = torch.tensor([prompt_ids + list(c.token_ids)])
            positions = torch.zeros((1, ids.shape[1] - 1), dtype=torch.bool)
            positions[0, len(prompt_ids) - 1:] = True
            with torch.no_grad():
                logp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=1.0,
                                         positions=positions)
            fresh = logp[0, len(prompt_ids) - 1:]
            assert torch.allclose(fresh, torch.tensor(c.logprobs), atol=1e-4), (fresh, c.logprobs)
            checked += 1
    assert checked == 8


def _row_group(version, behaviour, rewards=(1.0, 0.0)):
    return TrainingGroup(prompt="ab", completions=("x", "y"), rewards=rewards,
                         completion_ids=((5, 6), (7, 8)), behaviour_logp=behaviour, version=version)


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return [1, 2]


def test_rows_train_on_engine_ids_and_are_stale_only_when_older():
    beh = ((-1.0, -2.0), (-0.5, -0.25))
    rows, _ = build_rows([_row_group(3, beh)], _Tok(), max_completion_tokens=8, version=3)
    assert [r.ids for r in rows] == [[1, 2, 5, 6], [1, 2, 7, 8]]   # the engine's ids, not the text
    assert not any(r.stale for r in rows) and all(r.behaviour is None for r in rows)
    rows, _ = build_rows([_row_group(1, beh)], _Tok(), max_completion_tokens=1, version=3)
    assert all(r.stale for r in rows)
    assert [r.behaviour for r in rows] == [(-1.0,), (-0.5,)]       # cut with the completion


@pytest.mark.parametrize("mode", ["decoupled", "off"])
def test_the_decoupled_correction_weighs_and_masks_stale_tokens(data_dir, mode):
    """A stale row's token weight is pi_now / pi_behaviour, 0 above the cap; a fresh row's
    is 1; with ``off`` (the naive control) nothing is weighed."""
    learner = Learner(_config(data_dir, trainer=TrainerConfig(stale_correction=mode, stale_weight_cap=5.0)),
                      peer_id="p")
    tok, model = learner.policy.tokenizer, learner.policy.model
    prompt = learner.prompts.render("Sort the letters: dcba")
    comps = learner.engine.generate([prompt], n=2, seed=5)[0]
    ids = [tuple(c.token_ids) for c in comps]
    assert all(len(i) >= 2 for i in ids), ids
    now = [list(c.logprobs) for c in comps]
    # completion 0: behaviour = now - log 2 on every token (weight 2, kept); completion 1:
    # its first token behaviour = now - log 10 (weight 10 > cap: masked), the rest = now
    beh = ([x - math.log(2.0) for x in now[0]], [now[1][0] - math.log(10.0)] + now[1][1:])
    trainer: GrpoTrainer = learner.trainer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for version, stale in ((0, True), (1, False)):
        group = TrainingGroup(prompt=prompt, completions=tuple(c.text for c in comps), rewards=(1.0, 0.0),
                              completion_ids=tuple(ids), behaviour_logp=tuple(map(tuple, beh)), version=version)
        captured = {}
        original = trainer._behaviour_weights

        def spy(mb, rows, old, behave, _orig=original):
            _orig(mb, rows, old, behave)
            captured.update({i: behave[i].clone() for i in behave})
        trainer._behaviour_weights = spy
        stats = trainer.step([group], version=1)
        trainer._behaviour_weights = original
        model.load_state_dict(before)
        assert stats["stale_rows"] == (2.0 if stale else 0.0)
        if not stale or mode == "off":
            assert captured == {}
            assert "stale_masked" not in stats
            continue
        n_prompt = len(tok.encode(prompt, add_special_tokens=False))
        w0 = captured[0][n_prompt - 1:]
        w1 = captured[1][n_prompt - 1:]
        assert torch.allclose(w0, torch.full_like(w0, 2.0), atol=1e-3), w0
        assert float(w1[0]) == 0.0                                   # above the cap: masked
        assert torch.allclose(w1[1:], torch.ones_like(w1[1:]), atol=1e-3)
        assert float(captured[0][:n_prompt - 1].sum()) == n_prompt - 1   # prompt positions: 1
        assert stats["stale_masked"] == pytest.approx(1 / (len(ids[0]) + len(ids[1])))
        assert stats["stale_token_share"] == 1.0


def test_staleness_bound_holds_and_the_generator_samples_the_trainers_weights(data_dir):
    """eta = 1 with an outer step every 3 rounds (an extra version the generator did not
    see): no group is trained more than eta versions after it was sampled, groups that
    would be are dropped and counted, and the worker's weights hash equal the trainer's."""
    eta = 1
    # graded rewards (format credit): few flat groups, so every round moves the weights
    config = _config(data_dir, staleness=eta,
                     tasks=TaskConfig(family_config={"letter_sort": {"format_credit": 0.2}}))
    hub = LoopbackHub()

    def outer(model, rnd):
        if rnd % 3 != 2:
            return None
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 - 1e-3)     # an outer step: the weights move, a new version
        return {"round": rnd}

    def finish():
        pass

    report = run_learner(config, hub.bridge(Identity.from_seed(b"\x07" * 32)), rounds=12, outer=outer,
                         finish=finish)
    rounds = report["rounds"]
    assert len(rounds) == 12
    staleness = [r["local_staleness"] for r in rounds if r["local_staleness"] is not None]
    assert staleness and max(staleness) <= eta
    assert max(staleness) == eta                 # it did overlap
    assert sum(r["dropped_stale"] for r in rounds) > 0   # the outer steps' extra versions
    assert all(0 <= r["trainer_busy"] <= 1 and 0 <= r["generator_busy"] <= 1 for r in rounds)
    versions = [r["policy_version"] for r in rounds]
    assert versions == sorted(versions) and versions[-1] > 0

    learner = Learner(config, peer_id="q")      # resumes the final checkpoint
    try:
        assert learner.generator is not None
        worker, version = learner.generator.worker_hash()
        assert (worker, version) == (weights_hash(learner.policy.model), 0)
        for _ in range(2):
            learner.run_round(hub.bridge(Identity.from_seed(b"\x08" * 32)))
            learner.round += 1
        learner.generator.drain()
        worker, version = learner.generator.worker_hash()
        assert version == learner.version
        assert worker == weights_hash(learner.policy.model)
    finally:
        learner.close()


def test_staleness_config_is_checked_at_the_door():
    with pytest.raises(TableError, match="staleness"):
        EngineConfig(staleness=1, backend="vllm")
    with pytest.raises(TableError, match="staleness"):
        EngineConfig(staleness=-1)
    with pytest.raises(TableError, match="stale_correction"):
        TrainerConfig(stale_correction="clamp")
    with pytest.raises(TableError, match="stale_weight_cap"):
        TrainerConfig(stale_weight_cap=1.0)
    with pytest.raises(TableError, match="generation_device"):
        EngineConfig(generation_device="tpu")


def test_a_resumed_partial_rollout_continues_the_same_token_sequence(data_dir):
    """PartialPool (generator.py) over the real engine: a group left unfinished by one request
    comes back later with its first tokens, their log-probs and versions unchanged, and every
    token's log-prob is the policy's at the version that sampled it (left-padded prefixes)."""
    from node.learner.generator import PartialPool

    learner = Learner(LearnerConfig(data_dir=str(data_dir), seed=3, policy=PolicyConfig(device="cpu"),
                                    checkpoint_every=0, sapo=SapoConfig(external=0),
                                    engine=EngineConfig(max_new_tokens=32, staleness=2,
                                                        partial_rollouts=3.0, partial_segment_tokens=2)),
                      peer_id="p")
    learner.close()  # the test drives a PartialPool over the in-process engine itself
    tok, model, engine = learner.policy.tokenizer, learner.policy.model, learner.engine
    pool = PartialPool(engine, over=3.0, segment=2, staleness=1)
    version = [0]
    prompts = [learner.prompts.render(f"Sort the letters: {w}") for w in ("dcba", "zyxw", "qpon")]
    first = pool.run({"keys": ["a", "b", "c"], "prompts": prompts, "n": 4, "seed": 1, "want": 1},
                     0, lambda: version[0])
    assert len(first["groups"]) == 1 and first["unused"] == []
    kept = {g.key: [(list(r.ids), list(r.logprobs), list(r.versions)) for r in g.rows] for g in pool.pending}
    assert len(kept) == 2 and any(r[0] for rows in kept.values() for r in rows)
    version[0] = 1  # the trainer stepped: the rest is sampled by version 1
    second = pool.run({"keys": ["d"], "prompts": [prompts[0]], "n": 4, "seed": 2, "want": 2}, 1,
                      lambda: version[0])
    resumed = {key: group for key, _, group in second["groups"] if key in kept}
    assert resumed, second["groups"]
    for key, group in resumed.items():
        for (ids, lps, versions), c in zip(kept[key], group):
            assert list(c[2][:len(ids)]) == ids and c[3][:len(lps)] == lps   # same tokens, same log-probs
            assert all(v == 0 for v in versions)
    assert second["resumed_tokens"] > 0
    oldest = {key: v for key, v, _ in second["groups"]}
    assert all(oldest[k] == 0 for k in resumed if any(kept[k][i][0] for i in range(4)))
    # every token of a finished group is the policy's sample: its log-prob is a fresh forward
    # pass's at the version that sampled it (weights unchanged here, so at the current ones)
    key, _, group = second["groups"][0]
    prompt_ids = tok.encode(next(p for k, p in zip("abcd", prompts + [prompts[0]]) if k == key),
                            add_special_tokens=False)
    for text, count, ids, lps in group:
        full = torch.tensor([prompt_ids + list(ids)])
        positions = torch.zeros((1, full.shape[1] - 1), dtype=torch.bool)
        positions[0, len(prompt_ids) - 1:] = True
        with torch.no_grad():
            logp, _ = token_logprobs(model, full, torch.ones_like(full), temperature=1.0, positions=positions)
        assert torch.allclose(logp[0, len(prompt_ids) - 1:], torch.tensor(lps), atol=1e-4)


def test_partial_rollouts_in_a_node_resume_the_long_tail_within_the_bound(data_dir):
    """A node with partial rollouts (max_new_tokens 32: most answers end in under 8 tokens,
    a few run to the cap) trains on resumed groups and never on one older than eta = 2."""
    config = LearnerConfig(data_dir=str(data_dir), seed=3, policy=PolicyConfig(device="cpu"),
                           checkpoint_every=0, sapo=SapoConfig(external=0),
                           engine=EngineConfig(max_new_tokens=32, staleness=2, partial_rollouts=2.0,
                                               partial_segment_tokens=4))
    report = run_learner(config, LoopbackHub().bridge(Identity.from_seed(b"\x09" * 32)), rounds=10)
    rounds = report["rounds"]
    assert all(r["local_used"] == 8 or r["dropped_stale"] for r in rounds)
    assert sum(r["resumed_tokens"] for r in rounds) > 0
    assert max(r["local_staleness"] for r in rounds if r["local_staleness"] is not None) <= 2
    assert any(r["train"].get("stale_token_share", 0) > 0 for r in rounds)


def test_partial_rollouts_need_a_staleness_bound():
    with pytest.raises(TableError, match="partial_rollouts"):
        EngineConfig(partial_rollouts=2.0)
    with pytest.raises(TableError, match="partial_rollouts"):
        EngineConfig(staleness=2, partial_rollouts=0.5)
    with pytest.raises(TableError, match="at least 2 policy versions"):
        EngineConfig(staleness=1, partial_rollouts=2.0)
