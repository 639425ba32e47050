"""Phase and progress reports of the learner (node/learner/progress.py) for the status view."""

from __future__ import annotations

import torch

from node.bridge import LoopbackHub
from node.learner import LearnerConfig, PolicyConfig, TaskConfig, run_learner
from node.learner.loop import Learner
from node.learner.progress import PhaseReporter
from protocol import Identity


def test_forward_passes_count_as_progress_and_reports_are_throttled():
    calls: list[tuple[str, int, int]] = []
    model = torch.nn.Linear(2, 2)
    reporter = PhaseReporter(lambda *a: calls.append(a), min_interval_s=3600)
    with reporter.phase("train", total=4, model=model):
        for _ in range(6):
            model(torch.zeros(1, 2))
    assert calls == [("train", 0, 4)]            # the start always, then throttled
    calls.clear()
    fast = PhaseReporter(lambda *a: calls.append(a), min_interval_s=0)
    with fast.phase("train", total=4, model=model):
        for _ in range(6):
            model(torch.zeros(1, 2))
    assert calls[0] == ("train", 0, 4) and calls[-1] == ("train", 4, 4)   # capped at total
    assert [d for _, d, _ in calls] == [0, 1, 2, 3, 4, 4, 4]
    calls.clear()
    model(torch.zeros(1, 2))                    # the hook is gone after the phase
    assert calls == []


def test_a_failing_callback_never_stops_training():
    def boom(*_):
        raise RuntimeError("view is broken")

    reporter = PhaseReporter(boom, min_interval_s=0)
    model = torch.nn.Linear(2, 2)
    with reporter.phase("generate", total=2, model=model):
        model(torch.zeros(1, 2))
    reporter.report("score")                     # silently off after the first failure


def test_a_round_reports_its_phases_with_generation_and_training_progress(data_dir):
    seen: list[tuple[str, int, int]] = []
    # the sparse default task can leave every group of a round without variance (nothing to
    # train): format credit and a fixed identity make this round train
    cfg = LearnerConfig(data_dir=str(data_dir), policy=PolicyConfig(device="cpu"), checkpoint_every=0,
                        tasks=TaskConfig(family_config={"letter_sort": {"format_credit": 0.2}}))
    bridge = LoopbackHub().bridge(Identity.from_seed(bytes([7]) * 32))
    learner = Learner(cfg, peer_id=bridge.peer_id)
    learner.progress = PhaseReporter(lambda *a: seen.append(a), min_interval_s=0)
    assert learner.run_round(bridge) is not None
    names = [n for n, _, _ in seen]
    order = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert order == ["receive", "generate", "score", "publish", "train"]
    gen = [(d, t) for n, d, t in seen if n == "generate"]
    assert gen[0] == (0, learner.engine_config.max_new_tokens) and gen[-1][0] >= 1  # token steps
    train = [(d, t) for n, d, t in seen if n == "train"]
    # 8 groups in one micro-batch, 1 epoch: 1 pass (old log-probs come from that pass)
    assert train[0] == (0, 1) and train[-1] == (1, 1)


def test_run_learner_passes_on_phase_through_and_reports_the_final_checkpoint(data_dir):
    seen: list[str] = []
    cfg = LearnerConfig(data_dir=str(data_dir), policy=PolicyConfig(device="cpu"), checkpoint_every=0)
    run_learner(cfg, LoopbackHub().bridge(Identity.generate()), rounds=1,
                on_phase=lambda name, *_: seen.append(name))
    assert seen[0] == "receive" and "train" in seen and seen[-1] == "checkpoint"
