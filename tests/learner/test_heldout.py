"""The held-out score: a fixed evaluation set that no training question can come from, scored
by the node's own engine and verifiers, every ``eval_every`` rounds and by `swarm-node eval`."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from node.bridge import LoopbackHub
from node.cli import cli
from node.export import HELDOUT_FIELDS
from node.learner import LearnerConfig, PolicyConfig, TaskConfig, run_learner
from node.learner.config import SapoConfig
from node.learner.engine import Completion
from node.learner.heldout import Evaluator, heldout_tasks
from node.learner.prompting import RawFormat
from node.learner.rescore import Rescorer
from node.learner.tasks import get_family
from node.learner.tasks.base import HELDOUT_SEED_BASE, TRAINING_SEEDS
from node.learner.tasks.rgym import MAX_INDEX
from protocol import Identity, Rollout
from protocol.tables import TableError

BUILT_IN = ("letter_sort", "tiny_add")
RGYM = ("basic_arithmetic", "base_conversion")


def test_the_set_is_fixed_dealt_over_families_and_the_same_each_time():
    tasks = TaskConfig(families=BUILT_IN)
    a = heldout_tasks(tasks, questions=7)
    b = heldout_tasks(TaskConfig(families=BUILT_IN), questions=7)
    assert [(t.spec, t.prompt, t.answer) for t in a] == [(t.spec, t.prompt, t.answer) for t in b]
    assert [t.spec.family for t in a] == ["letter_sort", "tiny_add"] * 3 + ["letter_sort"]
    # a larger set extends the smaller one family by family: scores at two sizes share questions
    bigger = heldout_tasks(tasks, questions=12)
    assert {t.prompt for t in a} <= {t.prompt for t in bigger}
    assert len({t.prompt for t in heldout_tasks(TaskConfig(), questions=32)}) == 32


@pytest.mark.parametrize("family", BUILT_IN + RGYM)
def test_heldout_seeds_are_disjoint_from_every_training_seed(family):
    fam, cfg = get_family(family), {}
    rng = random.Random(1)
    train = [fam.sample_spec(rng, cfg) for _ in range(2000)]
    held = [fam.heldout_spec(cfg, j) for j in range(64)]
    # what seeds a question: (seed, index) for ours, seed + index for ReasoningGYM's items
    effective = (lambda s: s.seed + s.index) if family in RGYM else (lambda s: s.seed)
    assert max(effective(s) for s in train) < TRAINING_SEEDS + MAX_INDEX + 1 <= HELDOUT_SEED_BASE
    assert min(effective(s) for s in held) >= HELDOUT_SEED_BASE
    assert all(s.seed < TRAINING_SEEDS for s in train)
    assert len({(s.seed, s.index) for s in held}) == 64


def test_a_received_rollout_on_a_heldout_seed_is_refused_before_scoring(tmp_path):
    tasks = TaskConfig(families=("letter_sort",))
    rescorer = Rescorer(tasks, SapoConfig(completions_per_question=2),
                        verify=LearnerConfig(data_dir=str(tmp_path)).verify,
                        max_completion_tokens=16, count_tokens=len, special_tokens=())
    held = heldout_tasks(tasks, questions=1)[0]
    rollout = Rollout(task=held.spec, prompt=held.prompt, completions=(held.answer, "x"))
    assert rescorer.check(rollout) == "heldout_seed"
    trained = get_family("letter_sort").sample_spec(random.Random(0), {})
    assert rescorer.check(Rollout(task=trained, prompt="", completions=("a", "b"))) is None
    rescorer.close()


class ScriptedEngine:
    """Answers right when greedy, wrong when sampled; records the calls."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.calls = answers, []

    def generate(self, prompts, *, n, seed, greedy=False):
        self.calls.append((len(prompts), n, seed, greedy))
        return [[Completion(text=(self.answers[p] + "\n") if greedy else "zz\n", token_count=2)] * n
                for p in prompts]


def test_evaluator_reports_greedy_and_sampled_accuracy_in_batches():
    tasks = TaskConfig(families=BUILT_IN)
    answers = {t.prompt: t.answer for t in heldout_tasks(tasks, questions=6)}
    engine = ScriptedEngine(answers)
    ev = Evaluator(tasks=tasks, engine=engine, prompts=RawFormat(), questions=6, samples=2,
                   max_batch=4)
    score = ev.run()
    assert (score.greedy_accuracy, score.sampled_accuracy, score.greedy_reward) == (1.0, 0.0, 1.0)
    assert score.by_family == {"letter_sort": {"greedy_accuracy": 1.0, "sampled_accuracy": 0.0,
                                               "questions": 3},
                               "tiny_add": {"greedy_accuracy": 1.0, "sampled_accuracy": 0.0,
                                            "questions": 3}}
    # greedy: 4 + 2 prompts; sampled (2 each): 2 + 2 + 2 prompts, never over max_batch sequences
    assert [(p, n, g) for p, n, _, g in engine.calls] == [
        (4, 1, True), (2, 1, True), (2, 2, False), (2, 2, False), (2, 2, False)]
    assert ev.run().to_record() | {"seconds": 0} == score.to_record() | {"seconds": 0}


def test_eval_keys_are_checked_at_the_door(tmp_path):
    for key, value, reason in (("eval_every", -1, "must be >= 0, got -1"),
                               ("eval_questions", 0, "must be positive, got 0"),
                               ("eval_samples", 65, "must be <= 64, got 65")):
        with pytest.raises(TableError) as e:
            LearnerConfig.from_dict({"data_dir": str(tmp_path), key: value})
        assert (e.value.key, e.value.reason) == (key, reason)
    assert LearnerConfig(data_dir=str(tmp_path)).eval_every == 25


def test_rounds_carry_the_heldout_score_every_eval_every_rounds(data_dir):
    hub = LoopbackHub()
    config = LearnerConfig(data_dir=str(data_dir), policy=PolicyConfig(device="cpu"),
                           checkpoint_every=0, eval_every=2, eval_questions=8, eval_samples=2,
                           sapo=SapoConfig(questions_per_round=2, completions_per_question=2,
                                           external=0))
    report = run_learner(config, hub.bridge(Identity.generate()), rounds=2)
    rounds = report["rounds"]
    assert ["heldout" in r for r in rounds] == [False, True]
    second = rounds[1]["heldout"]
    assert (second["after_rounds"], second["questions"], second["samples"]) == (2, 8, 2)
    assert all(0.0 <= second[k] <= 1.0 for k in ("greedy_accuracy", "sampled_accuracy"))
    assert report["heldout"] == [second]  # the node report's list
    assert "heldout" not in rounds[1]["seconds"]  # between rounds: not round time
    # the CLI scores the checkpoint the run left, with the families it recorded
    done = CliRunner().invoke(cli, ["eval", "--data-dir", str(data_dir), "--questions", "8",
                                    "--samples", "2", "--json"])
    assert done.exit_code == 0, done.output
    score = json.loads(done.output)
    assert (score["rounds"], score["families"], score["questions"]) == (2, ["letter_sort"], 8)
    # the same weights and set as the learner's last evaluation: the same greedy score
    assert score["greedy_accuracy"] == second["greedy_accuracy"]
    # and an export of it scores the same, from its own provenance.json
    out = data_dir.parent / "exported"
    assert CliRunner().invoke(cli, ["export", "--data-dir", str(data_dir), str(out)]).exit_code == 0
    # whose provenance and model card carry the score the node measured at round 2
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["heldout"] == {k: second[k] for k in HELDOUT_FIELDS}
    card = (out / "README.md").read_text()
    assert (f"Measured by the node after round 2 on its fixed held-out set" in card
            and f"greedy accuracy\n**{second['greedy_accuracy']:.3f}**, sampled accuracy "
                f"**{second['sampled_accuracy']:.3f}**\n(2 sampled completion(s) per question), "
                "8 questions." in card), card
    done = CliRunner().invoke(cli, ["eval", "--model", str(out), "--questions", "8",
                                    "--samples", "2"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith(f"held-out after 2 rounds: greedy accuracy "
                               f"{second['greedy_accuracy']:.3f}, sampled ")
    assert lines[1].startswith("  letter_sort: greedy ")


def test_eval_without_a_checkpoint_is_a_one_line_error(data_dir):
    done = CliRunner().invoke(cli, ["eval", "--data-dir", str(data_dir)])
    assert (done.exit_code, done.output) == (
        2, f"error: no checkpoint in {data_dir}: no node has trained with this data dir\n")
