"""The learner: policy, inference engine, tasks and rewards, SAPO/GRPO trainer, checkpoints.

Layers, bottom up (imports point one way; nothing here imports libp2p or trio)::

    config, errors         – LearnerConfig and its parts; the LearnerError tree
    tiny_model, policy     – the embedded model (shipped weights); loading any HF causal LM;
                             fingerprint
    warm_start             – how the shipped weights were made: ``python -m`` remakes them
    local_qwen             – a Qwen2-architecture model + BPE tokenizer built locally (tests, benches)
    prompting              – a task's wire prompt rendered for this model (raw / chat
                             template + system prompt); engine defaults sized for the model
    engine, vllm_engine    – batched sampling behind a backend registry (transformers, vLLM)
    tasks/                 – task families (tiny, ReasoningGYM), presets, answer extraction
                             and TaskSpec regeneration
    logprobs, memory       – chunked log-probs at the sampling temperature; step memory estimate,
                             token-budgeted micro-batches, out-of-memory detection
    shape, fit             – a model's config.json shape read without torch; ``--model
                             auto``'s table; a model's step estimate checked against the
                             device's memory before any weights load (``python -m
                             node.learner.fit``: the check alone, before a node starts)
    grpo                   – advantages (local: GRPO; external: anchored), clipped loss, GrpoTrainer
    baseline, reputation   – our own per-family reward baseline; per-sender records and trust
    verifier_worker        – sandboxed child process that rebuilds tasks and scores text
    verifier, rescore      – its client (rlimits, budgets, restart); checks + re-scoring of
                             received rollouts against the receiver's own tasks
    sapo                   – the fresh per-sender-bounded pool, zero-advantage filter, I/J split
    checkpoint             – atomic save / verified resume
    report, loop           – per-round records, node report, run_learner
"""

from __future__ import annotations

from typing import Any

from node.learner.config import (
    EngineConfig,
    LearnerConfig,
    PolicyConfig,
    SapoConfig,
    TaskConfig,
    TrainerConfig,
    VerifyConfig,
)
from node.learner.errors import (CheckpointError, EngineError, LearnerError, ModelDoesNotFit,
                                 PolicyError, TaskError)

__all__ = [
    "CheckpointError",
    "EngineConfig",
    "EngineError",
    "LearnerConfig",
    "LearnerError",
    "ModelDoesNotFit",
    "PolicyConfig",
    "PolicyError",
    "SapoConfig",
    "TaskConfig",
    "TaskError",
    "TrainerConfig",
    "VerifyConfig",
    "run_learner",
]


def __getattr__(name: str) -> Any:
    # run_learner imports torch: loaded on first use so that the verifier worker
    # (node.learner.verifier_worker, which imports only tasks) starts without torch.
    if name == "run_learner":
        from node.learner.loop import run_learner

        return run_learner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
