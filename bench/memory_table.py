"""The README's "memory to expect" table: a training step's memory per Qwen2.5 size, computed.

Parameter counts come from instantiating each model's config on the meta device (no weights,
no download); the step's bytes from ``node.learner.memory.estimate_step_memory`` at the
default ``TrainerConfig`` (bfloat16, gradient checkpointing above its threshold, rows of
``PROMPT_ALLOWANCE`` + ``max_completion_tokens`` tokens). The KV column is the transformers
engine sampling 8 questions x 8 completions of that length in bfloat16. Nothing is measured.

    PYTHONPATH=$PWD python bench/memory_table.py
"""

from __future__ import annotations

import json

import torch

from node.learner.config import TrainerConfig
from node.learner.memory import PROMPT_ALLOWANCE, estimate_step_memory

SHAPES = {  # the models' published config.json values
    "Qwen2.5-0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "Qwen2.5-3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                       tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False),
}


def main() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    trainer = TrainerConfig()
    seq = PROMPT_ALLOWANCE + trainer.max_completion_tokens
    gib = 2**30
    rows = {}
    for name, shape in SHAPES.items():
        config = Qwen2Config(**shape)
        with torch.device("meta"):
            n = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
        est = estimate_step_memory(config, n, trainer, param_bytes=2, seq_len=seq,
                                   grad_checkpointing=n >= trainer.grad_checkpoint_min_params)
        head_dim = shape["hidden_size"] // shape["num_attention_heads"]
        kv_per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * 2
        rows[name] = {"params": n, "weights_gib": est.weights / gib, "gradients_gib": est.gradients / gib,
                      "adam_gib": est.optimizer / gib,
                      "activations_and_logits_gib": (est.activations + est.logits) / gib,
                      "step_total_gib": est.total / gib,
                      "sampling_kv_gib": 64 * seq * kv_per_token / gib}
    print(json.dumps({"row_tokens": seq, "microbatch_tokens": trainer.microbatch_tokens,
                      "logits_chunk_mb": trainer.logits_chunk_mb, "models": rows}, indent=1))


if __name__ == "__main__":
    main()
