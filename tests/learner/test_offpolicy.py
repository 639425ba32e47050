"""The bound on off-policy external completions (node/learner/offpolicy.py and its use in grpo.py)."""

from __future__ import annotations

import math

import pytest
import torch

from node.learner.config import EXTERNAL_CORRECTIONS, TrainerConfig
from node.learner.grpo import GrpoTrainer, TrainingGroup, grpo_loss
from node.learner.offpolicy import _WEIGHTS, completion_weights, excess_surprise


def test_every_named_correction_has_a_rule():
    assert set(_WEIGHTS) == set(EXTERNAL_CORRECTIONS)


def test_excess_surprise_is_the_mean_over_completion_tokens_of_nll_minus_entropy():
    logp = torch.tensor([[-9.0, -0.1, -0.3], [-9.0, -4.0, -6.0], [-1.0, -1.0, -1.0]])
    entropy = torch.tensor([[5.0, 0.2, 0.1], [5.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # position 0: prompt
    s = excess_surprise(logp, entropy, mask)
    # row 0: ((0.1 - 0.2) + (0.3 - 0.1)) / 2; row 1: ((4 - 1) + (6 - 1)) / 2; row 2: no token
    assert s.tolist() == pytest.approx([0.05, 4.0, 0.0])
    with pytest.raises(ValueError):
        excess_surprise(logp, entropy[:, :2], mask)


def test_our_own_samples_have_no_excess_surprise_and_a_drifted_policy_s_have_some():
    """The proxy is calibrated: over samples of π itself the mean is 0; over samples of
    another policy it is KL(μ || π) + H(μ) - H(π) > 0 here."""
    gen = torch.Generator().manual_seed(0)
    ours = torch.softmax(torch.randn(50, 12, generator=gen) * 2, dim=-1)   # 50 positions
    theirs = torch.softmax(torch.randn(50, 12, generator=gen) * 2, dim=-1)
    entropy = -(ours * ours.log()).sum(-1)

    def mean_surprise(sampler: torch.Tensor) -> float:
        tokens = torch.multinomial(sampler, 4000, replacement=True, generator=gen)  # (50, 4000)
        logp = ours.log().gather(1, tokens).T  # 4000 completions x 50 positions
        ent = entropy.expand_as(logp)
        return float(excess_surprise(logp, ent, torch.ones_like(logp)).mean())

    assert abs(mean_surprise(ours)) < 0.02
    assert mean_surprise(theirs) > 1.0


def test_completion_weights_by_mode():
    s = torch.tensor([-0.5, 0.0, 1.0, 1.5, 3.0, math.inf, math.nan])
    assert completion_weights(s, mode="off", bound=1.0).tolist() == [1.0] * 7
    assert completion_weights(s, mode="mask", bound=1.0).tolist() == [1, 1, 1, 0, 0, 0, 0]
    w = completion_weights(s, mode="weight", bound=1.0).tolist()
    assert w[:3] == [1.0, 1.0, 1.0]
    assert w[3:5] == pytest.approx([math.exp(-0.5), math.exp(-2.0)])
    assert w[5:] == [0.0, 0.0]  # never trained on a completion we cannot judge
    with pytest.raises(ValueError, match="mode"):
        completion_weights(s, mode="clamp", bound=1.0)


def test_row_scale_drops_a_row_from_the_sum_not_from_the_count():
    logp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    loss, _ = grpo_loss(logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.28,
                        row_scale=torch.tensor([1.0, 0.0]))
    loss.backward()
    assert logp.grad[1].tolist() == [0.0, 0.0]
    assert logp.grad[0].tolist() == [-0.25, -0.25]  # -A / 4 tokens: the denominator kept row 1


LOCAL = TrainingGroup(prompt="dcba=", completions=("abcd\n", "abdc\n", "dcba\n", "abcd\n"),
                      rewards=(1.0, 0.0, 0.0, 1.0))
FAR = TrainingGroup(prompt="zyx=", completions=("}}}}}}}", "~~~~~~~", "}~}~}~}", "~}~}~}~"),
                    rewards=(1.0, 0.0, 1.0, 0.0), source="external")
"""An external group no policy close to the embedded model would sample."""


def _train(base, config: TrainerConfig, groups: list[TrainingGroup], steps: int = 2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        trainer = GrpoTrainer(config, model, tok)
        stats = [trainer.step(groups) for _ in range(steps)]
        return [p.detach().clone() for p in model.parameters()], stats
    finally:
        torch.set_num_threads(threads)


def test_the_default_weighs_external_completions_by_their_excess_surprise_from_0():
    """The default (bench/results/sapo_vs_isolated.json: 1.26x the isolated nodes, where the
    paper's uncorrected update is at 0.96x)."""
    cfg = TrainerConfig()
    assert (cfg.external_correction, cfg.external_surprise_bound) == ("weight", 0.0)


def test_correction_that_keeps_everything_is_the_paper_s_update_bit_for_bit(embedded_base):
    cfg = TrainerConfig(epochs=2, max_completion_tokens=8, external_correction="off")
    off, off_stats = _train(embedded_base, cfg, [LOCAL, FAR])
    kept, kept_stats = _train(embedded_base, TrainerConfig(
        epochs=2, max_completion_tokens=8, external_correction="mask",
        external_surprise_bound=1e6), [LOCAL, FAR])
    assert all(torch.equal(a, b) for a, b in zip(off, kept))
    assert "external_surprise" not in off_stats[0]  # off computes nothing
    assert kept_stats[0]["external_weight"] == 1.0 and kept_stats[0]["external_downweighted"] == 0.0


def test_a_masked_external_group_moves_the_model_as_if_it_were_absent(embedded_base):
    """Adam's first step and the gradient clip do not see a positive scale of the gradient, so
    with the far group masked (its share still in the denominator) one step equals the step
    on the local group alone; without the mask it does not."""
    masked_cfg = TrainerConfig(max_completion_tokens=8, external_correction="mask",
                               external_surprise_bound=1.0)
    masked, stats = _train(embedded_base, masked_cfg, [LOCAL, FAR], steps=1)
    plain = TrainerConfig(max_completion_tokens=8, external_correction="off")
    alone, _ = _train(embedded_base, plain, [LOCAL], steps=1)
    off, _ = _train(embedded_base, plain, [LOCAL, FAR], steps=1)
    assert stats[0]["external_downweighted"] == 1.0 and stats[0]["external_surprise"] > 1.0
    assert abs(stats[0]["local_surprise"]) < stats[0]["external_surprise"]
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(masked, alone))
    assert not all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(off, alone))
