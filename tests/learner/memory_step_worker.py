"""Child process of test_memory: one GRPO step on the local Qwen2 model; prints JSON.

Usage: ``python -m tests.learner.memory_step_worker MODEL_DIR GROUPS COMPLETIONS TOKENS``.
The peak is the kernel's resident high-water mark (VmHWM), reset through
``/proc/self/clear_refs`` just before the step, so model loading and imports do not count.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.learner.config import TrainerConfig
    from bench.train_memory import status_kib, synthetic_groups
    from node.learner.grpo import GrpoTrainer

    model_dir, n_groups, n_comp, n_tokens = sys.argv[1], *map(int, sys.argv[2:5])
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = TrainerConfig(max_completion_tokens=n_tokens)
    trainer = GrpoTrainer(cfg, model, tok, temperature=0.7)
    groups = synthetic_groups(tok, n_groups, n_comp, n_tokens)
    longest = max(len(tok.encode(g.prompt, add_special_tokens=False)) for g in groups) + n_tokens
    Path("/proc/self/clear_refs").write_text("5")
    base_kib = status_kib("VmRSS")
    t = time.perf_counter()
    stats = trainer.step(groups)
    seconds = time.perf_counter() - t
    peak_kib = status_kib("VmHWM")
    est = trainer.estimate(longest)
    print(json.dumps({"step_peak_bytes": (peak_kib - base_kib) * 1024, "base_bytes": base_kib * 1024,
                      "estimate_step_extra": est.step_extra, "estimate_total": est.total,
                      "estimate": est.describe(), "longest_row": longest,
                      "train_tokens": stats["train_tokens"], "microbatches": stats["microbatches"],
                      "oom_retries": stats["oom_retries"], "seconds": seconds,
                      "vocab": model.config.vocab_size}))


if __name__ == "__main__":
    main()
