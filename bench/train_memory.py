"""Peak memory and speed of one GRPO training step against the estimate from the config.

Builds the local Qwen2-architecture model (``node.learner.local_qwen``: ``--shape tiny`` for
CPU, ``--shape 0.5b`` for Qwen2.5-0.5B's dimensions with random weights), makes
``--groups`` x ``--completions`` completions of ``--tokens`` tokens each, and runs
``GrpoTrainer.step`` once to warm up and once measured. Peak memory of the measured step:
on CUDA ``torch.cuda.max_memory_allocated`` minus what was allocated before it; on CPU the
resident high-water mark (VmHWM, reset through ``/proc/self/clear_refs``) minus the resident
size before it. The estimate is ``GrpoTrainer.estimate(longest row)``: its ``step_extra``
(what a step adds to the loaded weights) is what the measurement is compared with; after
the warm-up step the gradients and AdamW state already exist, so the measured number then
covers activations and logits (``--no-warmup`` measures the first step instead).

    PYTHONPATH=$PWD python bench/train_memory.py --shape tiny --device cpu --groups 8 \\
        --completions 8 --tokens 256 --no-warmup
    PYTHONPATH=$PWD python bench/train_memory.py --shape 0.5b --device cuda --tokens 512
    PYTHONPATH=$PWD python bench/train_memory.py --table   # estimates for Qwen2.5 0.5B-7B, no model

``--table`` prints the estimate (no measurement) for the Qwen2.5 sizes in bfloat16 with the
default ``TrainerConfig`` and rows of ``--tokens`` completion tokens plus a 512-token prompt
allowance; parameter counts come from instantiating each config on the ``meta`` device.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from pathlib import Path

import torch

from node.learner.config import PolicyConfig, TrainerConfig
from node.learner.grpo import GrpoTrainer, TrainingGroup
from node.learner.local_qwen import QWEN25_05B, TINY, ensure_local_qwen
from node.learner.policy import load_policy
from protocol import atomic_write_bytes

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"tiny": TINY, "0.5b": QWEN25_05B}
QWEN25 = {  # hidden, intermediate, layers, heads, kv heads, tied embeddings (Qwen2.5 config.json)
    "0.5B": (896, 4864, 24, 14, 2, True), "1.5B": (1536, 8960, 28, 12, 2, True),
    "3B": (2048, 11008, 36, 16, 2, True), "7B": (3584, 18944, 28, 28, 4, False)}


def table(tokens: int) -> list[dict[str, object]]:
    """Step estimates for the Qwen2.5 sizes in bfloat16 (no weights are materialised)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from node.learner.memory import PROMPT_ALLOWANCE, estimate_step_memory

    cfg = TrainerConfig(max_completion_tokens=tokens)
    rows = []
    for name, (h, inter, layers, heads, kv, tied) in QWEN25.items():
        config = Qwen2Config(vocab_size=151936, hidden_size=h, intermediate_size=inter,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv, tie_word_embeddings=tied)
        with torch.device("meta"):
            n_params = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
        est = estimate_step_memory(config, n_params, cfg, param_bytes=2, seq_len=tokens + PROMPT_ALLOWANCE,
                                   grad_checkpointing=n_params >= cfg.grad_checkpoint_min_params)
        rows.append({"model": f"Qwen2.5-{name}", "params": n_params, "total_gib": est.total / 2**30,
                     "estimate": est.describe()})
    return rows


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def synthetic_groups(tok, n_groups: int, n_comp: int, n_tokens: int) -> list[TrainingGroup]:  # type: ignore[no-untyped-def]
    """``n_groups`` chat prompts with ``n_comp`` random completions of >= ``n_tokens`` tokens
    each (ordinary token ids, decoded: long texts of them), rewards alternating 0/1."""
    rng = random.Random(0)
    learned = len(tok) - 3
    groups = []
    for g in range(n_groups):
        prompt = tok.apply_chat_template([{"role": "user", "content": f"Question {g}: what is {g} + {g}?"}],
                                         tokenize=False, add_generation_prompt=True)
        texts = tuple(tok.decode([rng.randrange(learned) for _ in range(n_tokens + 16)]) for _ in range(n_comp))
        groups.append(TrainingGroup(prompt=prompt, completions=texts,
                                    rewards=tuple(float(i % 2) for i in range(n_comp))))
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--completions", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--microbatch-tokens", type=int, default=TrainerConfig().microbatch_tokens)
    ap.add_argument("--chunk-mb", type=float, default=TrainerConfig().logits_chunk_mb)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    if args.table:
        for row in table(args.tokens):
            print(json.dumps(row))
        return
    logging.basicConfig(level=logging.INFO)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = ensure_local_qwen(SHAPES[args.shape])
    policy = load_policy(PolicyConfig(model=str(model_dir), device=args.device, dtype=args.dtype),
                         Path(os.environ.get("TMPDIR", "/tmp")) / f"train-memory-{args.shape}")
    cfg = TrainerConfig(max_completion_tokens=args.tokens, microbatch_tokens=args.microbatch_tokens,
                        logits_chunk_mb=args.chunk_mb)
    trainer = GrpoTrainer(cfg, policy.model, policy.tokenizer, temperature=0.7)
    groups = synthetic_groups(policy.tokenizer, args.groups, args.completions, args.tokens)
    longest = max(len(policy.tokenizer.encode(g.prompt, add_special_tokens=False)) for g in groups) + args.tokens
    if not args.no_warmup:
        trainer.step(groups)
    cuda = policy.model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")
        before = status_kib("VmRSS") * 1024
    t = time.perf_counter()
    stats = trainer.step(groups)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() if cuda else status_kib("VmHWM") * 1024) - before
    est = trainer.estimate(longest)
    result = {
        "shape": args.shape, "device": str(policy.model.device), "dtype": str(policy.model.dtype),
        "groups": args.groups, "completions": args.completions, "tokens": args.tokens,
        "warmup": not args.no_warmup, "train_tokens": stats["train_tokens"],
        "microbatches": stats["microbatches"], "grad_checkpointing": trainer.grad_checkpointing,
        "step_seconds": seconds, "train_tokens_per_s": stats["train_tokens"] / seconds,
        "measured_step_peak_mib": peak / 2**20, "estimate_step_extra_mib": est.step_extra / 2**20,
        "estimate": est.describe(), "full_vocab_logits_mib": stats["train_tokens"] * policy.model.config.vocab_size
        * 4 * 2 / 2**20, "loadavg": os.getloadavg(),
    }
    print(json.dumps(result, indent=1))
    RESULTS.mkdir(exist_ok=True)
    name = f"train_memory_{args.shape}_{policy.model.device.type}.json"
    atomic_write_bytes(RESULTS / name, (json.dumps(result, indent=1) + "\n").encode())


if __name__ == "__main__":
    main()
