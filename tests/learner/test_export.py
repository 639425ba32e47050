"""`swarm-node export`: a trained node's policy, exported, loads in a fresh interpreter with
plain transformers and completes greedily exactly as the node's policy does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from collectives.state import OuterState, flatten
from node.cli import cli
from node.learner.checkpoint import load_checkpoint
from node.learner.config import PolicyConfig, TrainerConfig
from node.learner.grpo import GrpoTrainer, TrainingGroup
from node.learner.heldout import HeldoutScore
from node.learner.policy import load_policy
from node.learner.saver import CheckpointSaver
from tests.lock_holder import held_lock

PROMPTS = [f"{a}+{b}=" for a, b in zip(range(3, 13), range(7, 17))] + \
          [f"sort the letters: {w}" for w in ("dcba", "hello", "swarm", "node", "qwen",
                                               "greedy", "export", "zebra", "apple", "torch")]
MAX_NEW_TOKENS = 8

GREEDY = '''
def greedy(model, tokenizer, prompts, max_new_tokens):
    # argmax decoding by cached forward passes: generate() costs ~10x more here
    import torch
    out = []
    for prompt in prompts:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                 tokenize=False, add_generation_prompt=True)
        else:
            text = prompt
        step, past, tokens = tokenizer(text, return_tensors="pt").input_ids, None, []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                res = model(step, past_key_values=past, use_cache=True, logits_to_keep=1)
                step, past = res.logits[:, -1].argmax(-1, keepdim=True), res.past_key_values
                tokens.append(int(step))
        out.append(tokens)
    return out
'''
FRESH = GREEDY + '''
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
out, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(out).eval()
tokenizer = AutoTokenizer.from_pretrained(out)
print(json.dumps({"completions": greedy(model, tokenizer, prompts, n),
                  "has_chat_template": bool(tokenizer.chat_template),
                  "eos_token_id": model.generation_config.eos_token_id}))
'''


def _greedy(model, tokenizer):  # the very code the fresh interpreter runs
    scope: dict = {}
    exec(GREEDY, scope)
    return scope["greedy"](model.eval(), tokenizer, PROMPTS, MAX_NEW_TOKENS)


def _train_and_checkpoint(data_dir: Path, model: str, outer_state=None, heldout=None, round_=1):
    """One GRPO step, then the checkpoint of ``round_`` written as the learner writes it
    (CheckpointSaver), with ``heldout`` as the newest held-out score."""
    p = load_policy(PolicyConfig(model=model, device="cpu"), data_dir)
    trainer = GrpoTrainer(TrainerConfig(lr=1e-2), p.model, p.tokenizer)
    trainer.step([TrainingGroup(prompt="1+1=", completions=("2\n", "7x"), rewards=(1.0, 0.0))])
    saver = CheckpointSaver(data_dir=data_dir, model=p.model, optimizer=trainer.optimizer,
                            fingerprint=p.fingerprint, every_rounds=0, every_s=0, keep=2,
                            saved_round=None, provenance={"model": model, "swarm_id": "test-swarm",
                                                          "task_families": ["letter_sort"]},
                            outer_state=outer_state, heldout=lambda: heldout)
    saver.final(round_)
    return p


def _export(data_dir: Path, out: Path, *args: str):
    return CliRunner().invoke(cli, ["export", "--data-dir", str(data_dir), str(out), *args])


def _load_fresh(out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # transformers only
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", FRESH, str(out), json.dumps(PROMPTS),
                           str(MAX_NEW_TOKENS)], capture_output=True, text=True, env=env,
                          cwd=out.parent, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def _node_state(policy) -> OuterState:
    """An outer state like the node's after three outer steps (θ moved off the base)."""
    theta = flatten(list(policy.model.parameters()))
    gen = torch.Generator().manual_seed(0)
    return OuterState(theta=theta + 1e-3 * torch.randn(theta.shape, generator=gen),
                      momentum=1e-4 * torch.randn(theta.shape, generator=gen), applied=3)


@pytest.mark.parametrize("which", ["embedded", "qwen"])
def test_export_loads_in_fresh_transformers_and_completes_as_the_node(which, data_dir, local_qwen,
                                                                        tmp_path):
    model = "embedded" if which == "embedded" else str(local_qwen)
    state: list[OuterState] = []
    base = load_policy(PolicyConfig(model=model, device="cpu"), data_dir)
    state.append(_node_state(base))
    policy = _train_and_checkpoint(data_dir, model, outer_state=lambda: state[0])
    out = tmp_path / "export"

    result = _export(data_dir, out)

    assert result.exit_code == 0, result.output
    assert "exported the local policy after 1 rounds, outer version 3" in result.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export")]
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md",
            "provenance.json", "tokenizer_config.json"} <= names
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["outer_state_hash"] == state[0].hash()  # the hash the node reports
    assert prov["base_fingerprint"] == policy.fingerprint
    assert (prov["swarm_id"], prov["rounds"], prov["task_families"], prov["outer_version"]) == \
        ("test-swarm", 1, ["letter_sort"], 3)
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and state[0].hash() in card
    assert prov["heldout"] is None
    assert "## Held-out score\n\nNot measured: the node had not scored its policy" in card
    fresh = _load_fresh(out)
    assert fresh["has_chat_template"] == (which == "qwen")
    assert fresh["completions"] == _greedy(policy.model, policy.tokenizer)
    assert fresh["eos_token_id"] == policy.model.generation_config.eos_token_id
    exported = load_file(str(out / "model.safetensors"))
    trained, untrained = policy.model.state_dict(), base.model.state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in exported)
    assert not all(torch.equal(exported[k], untrained[k]) for k in exported)


def test_export_outer_writes_theta_global_with_the_nodes_hash(data_dir, tmp_path):
    base = load_policy(PolicyConfig(device="cpu"), data_dir)
    state = _node_state(base)
    _train_and_checkpoint(data_dir, "embedded", outer_state=lambda: state)

    result = _export(data_dir, tmp_path / "outer", "--version", "outer")

    assert result.exit_code == 0, result.output
    prov = json.loads((tmp_path / "outer" / "provenance.json").read_text())
    assert (prov["exported_version"], prov["outer_state_hash"]) == ("outer", state.hash())
    weights = load_file(str(tmp_path / "outer" / "model.safetensors"))
    names = [n for n, _ in base.model.named_parameters()]
    exported = torch.cat([weights[n].reshape(-1).float() for n in names])
    assert torch.equal(exported, state.theta)


def test_export_outer_without_an_outer_step_is_a_one_line_error(data_dir, tmp_path):
    _train_and_checkpoint(data_dir, "embedded")
    result = _export(data_dir, tmp_path / "out", "--version", "outer")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {data_dir} holds no outer step (its newest checkpoint round-00000001 has "
        "none); export --version local"]


def test_refuses_to_overwrite_without_force_and_replaces_with_it(data_dir, tmp_path):
    _train_and_checkpoint(data_dir, "embedded")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")

    refused = _export(data_dir, out)
    assert refused.exit_code == 2
    assert refused.output == f"error: {out} exists; pass --force to replace it\n"
    assert (out / "mine.txt").read_text() == "keep me"

    forced = _export(data_dir, out, "--force")
    assert forced.exit_code == 0, forced.output
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", "node"])


def test_missing_checkpoint_is_a_one_line_error(data_dir, tmp_path):
    result = _export(data_dir, tmp_path / "out")
    assert result.exit_code == 2
    assert result.output == f"error: no checkpoint in {data_dir}: no node has trained with " \
                            "this data dir\n"
    load_policy(PolicyConfig(device="cpu"), data_dir)  # fingerprinted, never checkpointed
    result = _export(data_dir, tmp_path / "out")
    assert (result.exit_code, result.output) == (
        2, f"error: no checkpoint in {data_dir / 'checkpoints'}: run the node until it saves one\n")
    assert not (tmp_path / "out").exists()


def test_export_while_the_node_runs_reads_its_checkpoint_and_says_so(data_dir, tmp_path):
    _train_and_checkpoint(data_dir, "embedded")
    with held_lock(data_dir / "learner.lock") as pid:
        result = _export(data_dir, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert f"note: a node (pid {pid}) is running on {data_dir}" in result.output


def _score(after_rounds: int) -> dict:
    """A held-out record as the learner makes it (Learner.heldout)."""
    return HeldoutScore(greedy_accuracy=0.375, sampled_accuracy=0.25, greedy_reward=0.5,
                        sampled_reward=0.4, questions=8, samples=2, seconds=0.7,
                        by_family={"letter_sort": {"greedy_accuracy": 0.375,
                                                   "sampled_accuracy": 0.25, "questions": 8}}
                        ).to_record(after_rounds=after_rounds)


def test_model_card_records_the_heldout_score_the_checkpoint_carries(data_dir, tmp_path):
    """The checkpoint of round 3 carries the score measured after round 2: the card gives it
    with its round, says the weights are newer, and that the outer version was not scored."""
    base = load_policy(PolicyConfig(device="cpu"), data_dir)
    state = _node_state(base)
    _train_and_checkpoint(data_dir, "embedded", outer_state=lambda: state, heldout=_score(2),
                          round_=3)
    meta = json.loads((data_dir / "checkpoints" / "round-00000003" / "meta.json").read_text())
    assert meta["heldout"] == _score(2)

    assert _export(data_dir, tmp_path / "local").exit_code == 0
    assert _export(data_dir, tmp_path / "outer", "--version", "outer").exit_code == 0

    for version in ("local", "outer"):
        prov = json.loads((tmp_path / version / "provenance.json").read_text())
        assert prov["heldout"] == {"after_rounds": 2, "greedy_accuracy": 0.375,
                                   "sampled_accuracy": 0.25, "questions": 8, "samples": 2,
                                   "by_family": {"letter_sort": {"greedy_accuracy": 0.375,
                                                                 "sampled_accuracy": 0.25,
                                                                 "questions": 8}}}
        card = (tmp_path / version / "README.md").read_text()
        assert "Measured by the node after round 2 on its fixed held-out set" in card
        assert "greedy accuracy\n**0.375**, sampled accuracy **0.250**" in card
        assert "8 questions.\nThese weights are of round 3, 1 round(s) after the measurement." \
            in card
        assert "| letter_sort | 0.375 | 0.250 | 8 |" in card
        outer_note = "The node measured its local policy, not the outer version exported here."
        assert (outer_note in card) == (version == "outer")


def test_a_checkpoint_gives_back_the_heldout_score_it_carries(data_dir):
    """The score a checkpoint carries comes back on load (Checkpoint.heldout): a resumed
    learner's checkpoints record it until it measures a newer one (Learner.last_heldout)."""
    policy = _train_and_checkpoint(data_dir, "embedded", heldout=_score(1))
    trainer = GrpoTrainer(TrainerConfig(lr=1e-2), policy.model, policy.tokenizer)
    ckpt = load_checkpoint(data_dir, model=policy.model, optimizer=trainer.optimizer,
                           fingerprint=policy.fingerprint)
    assert ckpt is not None and ckpt.heldout == _score(1)
