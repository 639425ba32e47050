from __future__ import annotations

import pytest
import torch

from node.learner.grpo import TrainingGroup, build_batch, group_advantages, grpo_loss


def test_group_advantages_are_normalised():
    adv = group_advantages(torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert adv is not None
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, 1.0, -1.0]), atol=1e-4)
    adv = group_advantages(torch.tensor([0.2, 0.5, 0.8]))
    assert adv is not None
    assert abs(float(adv.mean())) < 1e-6 and abs(float(adv.std(unbiased=False)) - 1) < 1e-4


def test_zero_variance_group_has_no_advantage():
    assert group_advantages(torch.tensor([0.7, 0.7, 0.7])) is None
    assert group_advantages(torch.tensor([1.0])) is None


def test_ratio_one_gives_plain_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 2)
    loss, d = grpo_loss(logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))  # -A / n_tokens each
    assert d["approx_kl"] == pytest.approx(0.0) and d["clipfrac"] == 0.0


def test_clipping_is_asymmetric_and_stops_gradient():
    old = torch.zeros(1, 3)
    # ratios 1.25 (inside 1+0.28), 1.35 (above), 0.75 (below 1-0.2)
    logp = torch.log(torch.tensor([[1.25, 1.35, 0.75]])).requires_grad_(True)
    loss, d = grpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3), clip_low=0.2, clip_high=0.28)
    loss.backward()
    g = logp.grad[0]
    assert g[0] != 0          # positive advantage, ratio inside: gradient flows
    assert g[1] == 0          # positive advantage, ratio above 1+clip_high: clipped
    assert g[2] != 0          # positive advantage, ratio low: min() keeps unclipped term
    assert d["clipfrac"] == pytest.approx(2 / 3)
    assert d["approx_kl"] > 0


def test_mask_excludes_prompt_tokens():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), torch.tensor([[0.0, 1.0]]),
                        clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == -1.0


def test_build_batch_masks_completion_tokens_and_skips_flat_groups(embedded_base):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_base)
    groups = [TrainingGroup(prompt="1+2=", completions=("3\n", "45"), rewards=(1.0, 0.0)),
              TrainingGroup(prompt="1+1=", completions=("2\n", "2\n"), rewards=(1.0, 1.0))]
    batch, skipped = build_batch(groups, tok, max_completion_tokens=8, device=torch.device("cpu"))
    assert skipped == 1 and batch is not None
    assert batch.input_ids.shape == (2, 6)
    # predictions of completion tokens: positions 3 and 4 (next tokens at 4 and 5)
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    assert batch.advantages.tolist() == pytest.approx([1.0, -1.0], abs=1e-4)


def test_rows_are_cut_to_the_model_context(embedded_base):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_base)
    groups = [TrainingGroup(prompt="1+2=", completions=("3" * 50, "x" * 50), rewards=(1.0, 0.0)),
              TrainingGroup(prompt="9" * 30, completions=("a", "b"), rewards=(1.0, 0.0))]
    batch, _ = build_batch(groups, tok, max_completion_tokens=40, device=torch.device("cpu"),
                           max_length=20)
    assert batch is not None and batch.input_ids.shape == (2, 20)  # long prompt rows dropped


# -- external groups: anchored advantages, equal weight per group --------------------------------

@pytest.mark.parametrize("size", [8, 64])
def test_steering_group_gets_no_positive_advantage_against_a_higher_own_baseline(size):
    from node.learner.grpo import Anchor, anchored_advantages

    rewards = torch.tensor([0.3] + [0.0] * (size - 1))        # "9999" (0.3) among worse ones
    plain = group_advantages(rewards)
    assert plain is not None and float(plain[0]) == pytest.approx((size - 1) ** 0.5, rel=1e-3)
    anchor = Anchor(mean=0.45, std=0.15, max_abs=7 ** 0.5)
    assert anchored_advantages(rewards, anchor) is None        # nothing beats our bar: no push
    # with better companions too (group mean 0.28 < 0.3), the bar is still our own 0.45
    assert anchored_advantages(torch.tensor([0.3] + [0.28] * (size - 1)), anchor) is None
    # one completion above our bar: only it is pushed up, and the group sums to zero
    adv = anchored_advantages(torch.tensor([0.3, 0.9] + [0.0] * (size - 2)), anchor)
    assert adv is not None and float(adv[1]) > 0 and float(adv[0]) < 0
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-5)


def test_anchored_advantage_is_grpo_for_a_better_group_and_bounded():
    from node.learner.grpo import Anchor, anchored_advantages

    better = torch.tensor([1.0, 0.3, 1.0, 0.4, 0.3, 1.0, 0.6, 0.3])
    adv = anchored_advantages(better, Anchor(mean=0.2, std=0.05, max_abs=7 ** 0.5))
    assert torch.allclose(adv, group_advantages(better), atol=1e-5)
    # a tiny spread cannot inflate advantages beyond what a local group of 8 can produce
    tiny = torch.tensor([0.31] + [0.30] * 63)
    adv = anchored_advantages(tiny, Anchor(mean=0.0, std=0.0, max_abs=7 ** 0.5))
    assert float(adv.max()) == pytest.approx(7 ** 0.5) and float(adv.abs().max()) <= 7 ** 0.5 + 1e-6
    assert anchored_advantages(torch.tensor([0.5, 0.5]), Anchor(mean=0.0, std=0.1, max_abs=1.0)) is None


def test_every_group_weighs_the_same_in_the_loss(embedded_base):
    """A 64-completion group (8 copies of an 8-group, longer rows) moves the model exactly as
    the 8-group does: same advantages, same total weight."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.learner.grpo import token_logprobs

    tok = AutoTokenizer.from_pretrained(embedded_base)
    model = AutoModelForCausalLM.from_pretrained(embedded_base)
    local = TrainingGroup(prompt="1+2=", completions=("3\n", "4\n", "12\n", "x\n") * 2,
                          rewards=(1.0, 0.7, 0.5, 0.0) * 2)
    ext8 = TrainingGroup(prompt="2+2=", completions=("4\n", "9999\n", "1\n", "=\n") * 2,
                         rewards=(1.0, 0.3, 0.6, 0.0) * 2, source="external")
    ext64 = TrainingGroup(prompt="2+2=", completions=ext8.completions * 8, rewards=ext8.rewards * 8,
                          source="external")

    def grads(groups):
        batch, _ = build_batch(groups, tok, max_completion_tokens=8, device=torch.device("cpu"))
        assert batch is not None
        weighted = batch.loss_mask * batch.row_weight[:, None]
        assert float(weighted.sum()) == pytest.approx(len(groups))      # 1 per group
        model.zero_grad()
        logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
        loss, _ = grpo_loss(logp, logp.detach(), batch.advantages, batch.loss_mask,
                            clip_low=0.2, clip_high=0.28, row_weight=batch.row_weight)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    g8, g64 = grads([local, ext8]), grads([local, ext64])
    assert torch.allclose(g8, g64, atol=1e-6, rtol=1e-4)
    assert not torch.allclose(grads([local, ext8, ext8]), g8, atol=1e-6)  # the test can fail
