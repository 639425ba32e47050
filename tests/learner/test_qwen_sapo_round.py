"""A full SAPO round with a Qwen2-architecture model (local: 151,936-row vocabulary, byte-level
BPE trained here, Qwen2.5's chat template; ``node.learner.local_qwen``), on CPU.

Node A generates (chat-rendered prompts), scores, publishes; node B receives the sealed batch
over the loopback hub, re-scores it in its sandboxed verifier from the task specs, and trains
on it next to its own group. The random model rarely answers right, so A's engine gets one
correct, tagged answer per group (the only thing faked: what a better model would write);
everything after generation is the production path.
"""

from __future__ import annotations

import pytest

import node.learner.loop as loop_module
from node.bridge import LoopbackHub
from node.learner import LearnerConfig, PolicyConfig, SapoConfig, TaskConfig
from node.learner.config import EngineConfig
from node.learner.engine import Completion
from node.learner.loop import Learner
from node.learner.prompting import SYSTEM_PROMPT
from node.learner.rescore import special_token_strings
from node.learner.tasks import build_task
from protocol import Identity, RolloutBatch


@pytest.fixture
def qwen_dir(local_qwen):
    return local_qwen


def _config(data_dir, qwen_dir, *, local: int, external: int) -> LearnerConfig:
    return LearnerConfig(
        data_dir=str(data_dir), checkpoint_every=0, checkpoint_every_s=0,
        policy=PolicyConfig(model=str(qwen_dir), device="cpu"),
        engine=EngineConfig(max_new_tokens=12),  # the default (256) is what a GPU runs; CPU test
        # three of the paper's families with one right answer each (binary_matrix: our scorer)
        tasks=TaskConfig(families=("basic_arithmetic", "base_conversion", "binary_matrix")),
        sapo=SapoConfig(questions_per_round=local + external, completions_per_question=4,
                        external=external))


def test_full_sapo_round_with_a_local_qwen2_chat_model(tmp_path, qwen_dir, monkeypatch):
    built: list = []

    def recording_build_task(spec, **kw):
        task = build_task(spec, **kw)
        built.append(task)
        return task

    monkeypatch.setattr(loop_module, "build_task", recording_build_task)
    hub = LoopbackHub()
    id_a, id_b = Identity.from_seed(b"a" * 32), Identity.from_seed(b"b" * 32)
    bridge_a, bridge_b = hub.bridge(id_a), hub.bridge(id_b)
    tap = hub.bridge(Identity.from_seed(b"t" * 32))  # sees what goes on the wire
    a = Learner(_config(tmp_path / "a", qwen_dir, local=2, external=0), peer_id=id_a.peer_id)
    b = Learner(_config(tmp_path / "b", qwen_dir, local=1, external=1), peer_id=id_b.peer_id)
    assert a.prompts.name == "chat" and a.engine_config.stop == ()  # chat defaults for Qwen

    rendered: list[str] = []
    real_generate = a.engine.generate

    def generate(prompts, *, n, seed):
        rendered.extend(prompts)
        groups = real_generate(prompts, n=n, seed=seed)
        tasks = built[-len(prompts):]
        return [[Completion(text=f"Thinking.\n<answer>{t.answer}</answer>", token_count=9), *g[1:]]
                for t, g in zip(tasks, groups)]

    a.engine.generate = generate  # type: ignore[method-assign]
    rec_a = a.run_round(bridge_a)
    assert rec_a is not None and rec_a["rollouts_published"] == 2
    # the model saw the chat template with the GenRL system prompt and the bare question
    assert all(p.startswith("<|im_start|>system\n" + SYSTEM_PROMPT) for p in rendered)
    assert all(p.endswith("<|im_start|>assistant\n") and "\nAnswer: " not in p for p in rendered)

    # on the wire: the plain task prompt (regenerable, no chat markup), claimed rewards
    (batch,) = [r.message for r in tap.receive("rollouts", max_items=8)]
    assert isinstance(batch, RolloutBatch)
    specials = special_token_strings(a.policy.tokenizer)
    assert "<|im_end|>" in specials
    for rollout in batch.rollouts:
        assert rollout.prompt == build_task(rollout.task).prompt
        assert not any(s in rollout.prompt or any(s in c for c in rollout.completions)
                       for s in specials)
        assert rollout.rewards[0] == 1.0  # the tagged answer, extracted and verified

    seen: dict = {}
    real_rescore, real_step = b.rescorer.rescore, b.trainer.step

    def rescore(received):
        seen["ingest"] = out = real_rescore(received)
        return out

    def step(groups, **kw):
        seen["trained"] = groups
        return real_step(groups, **kw)

    b.rescorer.rescore = rescore  # type: ignore[method-assign]
    b.trainer.step = step  # type: ignore[method-assign]
    before = {k: v.clone() for k, v in b.policy.model.state_dict().items()}
    rec_b = b.run_round(bridge_b)
    assert rec_b is not None
    assert rec_b["rollouts_received"] == 2 and rec_b["rejected"] == 0, rec_b["rejected_by_reason"]
    ingest = seen["ingest"]
    assert len(ingest.groups) == 2
    for g in ingest.groups:  # B's own verifier (sandboxed worker) agrees with A's claims
        assert g.group.rewards == g.claimed and g.group.rewards[0] == 1.0
    assert rec_b["external_used"] == 1 and rec_b["local_used"] == 1
    trained = seen["trained"]
    assert len(trained) == 2 and all(t.prompt.startswith("<|im_start|>system\n") for t in trained)
    assert rec_b["train"]["optimizer_steps"] == 1
    after = b.policy.model.state_dict()
    assert any(not before[k].equal(after[k]) for k in before)  # the step moved the weights
    a.rescorer.close()
    b.rescorer.close()


def test_family_answers_are_extracted_on_both_sides():
    """Scoring is one function of (spec, text): tags, raw answers and junk score the same on
    the sender (Task.score) and in the receiver's worker (verifier_worker.score_item)."""
    from node.learner.verifier_worker import score_item
    from protocol import TaskSpec

    spec = TaskSpec(family="basic_arithmetic", config={}, seed=5, index=3)
    task = build_task(spec)
    texts = [f"<think>easy</think>\n<answer> {task.answer} </answer>", f"{task.answer}\n",
             "<answer>0.5</answer> then <answer>nope</answer>", "no answer here",
             f"<answer>{task.answer}</answer><answer>wrong</answer>"]
    local = [task.score(t) for t in texts]
    remote = score_item({"family": spec.family, "config": {}, "seed": spec.seed,
                         "index": spec.index, "prompt": task.prompt, "completions": texts})
    assert remote == {"rewards": local}
    assert local[0] == 1.0 and local[1] == 1.0 and local[2] == 0.0 and local[4] == 0.0


def test_chat_prompt_for_every_preset_family_renders_the_bare_question(qwen_dir, tmp_path):
    import random

    from node.learner.policy import load_policy
    from node.learner.prompting import make_prompt_format
    from node.learner.tasks import get_family
    from node.learner.tasks.presets import PRESETS

    tok = load_policy(PolicyConfig(model=str(qwen_dir), device="cpu"), tmp_path).tokenizer
    chat = make_prompt_format("auto", tok)
    rng = random.Random(1)
    for family in PRESETS["sapo_paper"]:
        task = build_task(get_family(family).sample_spec(rng, {}))
        text = chat.render(task.prompt)
        question = task.prompt.removesuffix("\nAnswer: ")
        assert question != task.prompt  # every ReasoningGYM prompt ends with the raw cue
        assert text.endswith(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
