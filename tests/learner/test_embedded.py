"""The embedded base model starts in the SAPO paper's regime on the node's default task.

(The shipped weights, pinned, the same in every data dir: test_tiny_model.py.)"""

from __future__ import annotations

import random
from pathlib import Path

from node.learner.config import EngineConfig, PolicyConfig, TaskConfig
from node.learner.engine import make_engine
from node.learner.policy import load_policy
from node.learner.prompting import RawFormat, resolve_engine
from node.learner.tasks import build_task, get_family


def test_base_model_starts_in_the_sparse_regime(data_dir: Path):
    """Low but non-zero sampled accuracy on the default family, most groups all-wrong."""
    policy = load_policy(PolicyConfig(device="cpu"), data_dir)
    config = resolve_engine(EngineConfig(), model=policy.model, embedded=True, prompt_format=RawFormat())
    engine = make_engine(config, policy.model, policy.tokenizer)
    (family,) = TaskConfig().families
    rng = random.Random(0)
    tasks = [build_task(get_family(family).sample_spec(rng, {})) for _ in range(64)]
    groups = engine.generate([t.prompt for t in tasks], n=8, seed=0)
    rewards = [[t.score(c.text) for c in g] for t, g in zip(tasks, groups)]
    accuracy = sum(map(sum, rewards)) / (64 * 8)
    flat = sum(len(set(r)) == 1 for r in rewards) / 64
    assert 0.02 < accuracy < 0.3, accuracy
    assert flat > 0.3, flat  # zero-advantage groups are common: room for shared ones
