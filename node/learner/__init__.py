"""The learner: policy, inference engine, tasks and rewards, SAPO/GRPO trainer, checkpoints.

Layers, bottom up (imports point one way; nothing here imports libp2p or trio)::

    config, errors         – LearnerConfig and its parts; the LearnerError tree
    tiny_model, policy     – the embedded model; loading any HF causal LM; fingerprint
    engine                 – batched sampling behind a backend registry
    tasks/                 – task families (tiny, ReasoningGYM) and TaskSpec regeneration
    grpo                   – advantages (local: GRPO; external: anchored), clipped loss, GrpoTrainer
    baseline, reputation   – our own per-family reward baseline; per-sender records and trust
    rescore, sapo          – re-scoring received rollouts; the fresh per-sender-bounded pool, I/J split
    checkpoint             – atomic save / verified resume
    report, loop           – per-round records, node report, run_learner
"""

from __future__ import annotations

from node.learner.config import (
    EngineConfig,
    LearnerConfig,
    PolicyConfig,
    SapoConfig,
    TaskConfig,
    TrainerConfig,
)
from node.learner.errors import CheckpointError, EngineError, LearnerError, PolicyError, TaskError
from node.learner.loop import run_learner

__all__ = [
    "CheckpointError",
    "EngineConfig",
    "EngineError",
    "LearnerConfig",
    "LearnerError",
    "PolicyConfig",
    "PolicyError",
    "SapoConfig",
    "TaskConfig",
    "TaskError",
    "TrainerConfig",
    "run_learner",
]
