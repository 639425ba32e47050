"""Golden per-step GRPO numbers on the embedded model (torchtitan's loss-curve check, small).

The embedded model (its shipped, pinned weights: ``tiny_model.py``) takes three
``GrpoTrainer`` rounds of two epochs each on one fixed batch of letter-sort groups, on one CPU
thread; each round's loss, policy loss, approx_kl, clipfrac and gradient norm, and a checksum
of the parameters after the last round, must equal the values below. The first epoch of a
round has ratio 1 (plain policy gradient), the second exercises the ratio and clipping, and
later rounds start from moved weights: a change anywhere in the maths (advantages, weights,
masks, log-probs at the temperature, clipping, the optimizer step) moves these numbers, where
the unit tests in test_grpo.py only pin properties.

The numbers belong to one torch build (CPU, the version Makefile installs) and the pinned
transformers; float reductions may differ in the last bits on another build or CPU, hence the
tolerance, which is far below any real change (one line of the loss changed moves them by
more than 1e-3).

To regenerate, after a change that is meant to move them (say why in the commit):

    GOLDEN_PRINT=1 PYTHONPATH=$PWD .venv/bin/python -m pytest tests/learner/test_grpo_golden.py -s

prints the new ``GOLDEN`` (the test still compares, and fails, in the same run); paste it.
"""

from __future__ import annotations

import os

import pytest
import torch

from node.learner.config import TrainerConfig
from node.learner.grpo import GrpoTrainer, TrainingGroup

GROUPS = [
    TrainingGroup(prompt="dcba=", completions=("abcd\n", "abdc\n", "dcba\n", "abcd", "x\n"),
                  rewards=(1.0, 0.0, 0.0, 1.0, 0.0)),
    TrainingGroup(prompt="zyx=", completions=("xyz\n", "xzy\n", "xyz", "zzz\n"),
                  rewards=(1.0, 0.2, 1.0, 0.0), source="external"),
    TrainingGroup(prompt="bab=", completions=("abb\n", "abb\n"), rewards=(1.0, 1.0)),  # flat
]
CONFIG = TrainerConfig(epochs=2, max_completion_tokens=8,  # the default lr, clip range, grad clip
                       external_correction="off")  # the paper's update (test_offpolicy.py: the rest)
ROUNDS = 3
KEYS = ("loss", "pg_loss", "approx_kl", "clipfrac", "grad_norm")

GOLDEN = {
    "rounds": [
        {"loss": 0.0720778044554944, "pg_loss": 0.0720778044554944,
         "approx_kl": 0.3278773817869834, "clipfrac": 0.6857143861906893,
         "grad_norm": 5.844411849975586},
        {"loss": -0.018770471590217278, "pg_loss": -0.018770471590217278,
         "approx_kl": 0.05386660517652021, "clipfrac": 0.4857142848627839,
         "grad_norm": 3.09226131439209},
        {"loss": -0.03134608269883144, "pg_loss": -0.03134608269883144,
         "approx_kl": 0.0741436793379391, "clipfrac": 0.4380952344054202,
         "grad_norm": 3.9516847133636475},
    ],
    "param_sum": 1075.5695740380174,
    "param_abs_sum": 21525.94611459568,
}
"""Measured with torch 2.13.0 (CPU) and transformers 5.23.0, on 2026-11-27."""


def run_rounds(base) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread: reductions in one order
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        trainer = GrpoTrainer(CONFIG, model, tokenizer, temperature=1.0)
        rounds = []
        for _ in range(ROUNDS):
            stats = trainer.step(GROUPS)
            assert stats["skipped_zero_variance"] == 1 and stats["optimizer_steps"] == 2
            rounds.append({k: stats[k] for k in KEYS})
        with torch.no_grad():
            params = [p.double() for p in model.parameters()]
            return {"rounds": rounds, "param_sum": float(sum(p.sum() for p in params)),
                    "param_abs_sum": float(sum(p.abs().sum() for p in params))}
    finally:
        torch.set_num_threads(threads)


def test_three_grpo_rounds_on_the_embedded_model_match_the_golden_numbers(embedded_base):
    got = run_rounds(embedded_base)
    if os.environ.get("GOLDEN_PRINT"):
        print(f"\nGOLDEN = {got!r}")
    assert len(got["rounds"]) == len(GOLDEN["rounds"]), got
    for i, (g, want) in enumerate(zip(got["rounds"], GOLDEN["rounds"])):
        for k in KEYS:
            assert g[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), (i, k, g, want)
    for k in ("param_sum", "param_abs_sum"):
        assert got[k] == pytest.approx(GOLDEN[k], rel=1e-7), (k, got[k], GOLDEN[k])
