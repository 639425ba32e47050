"""The learner's engine: overhead vs bare ``model.generate``, and throughput on this device.

``--mode overhead`` (default): generation throughput of the engine vs bare ``model.generate``
(same model, prompts, seed). The bare side gets pre-tokenised inputs and only calls
``model.generate``; the engine side does everything a round does (tokenise, generate, cut at
eos/stop, decode). Both sample the same tokens (same seed and kwargs), so tokens/s are
directly comparable. Repeats alternate and the median is reported.

    PYTHONPATH=$PWD python bench/engine_overhead.py [--model embedded] [--repeats 7]

``--mode throughput``: for one model (``embedded``, a hub id, a local path, or
``local-qwen-tiny`` / ``local-qwen-0.5b``: Qwen2 models built locally with random weights,
``node.learner.local_qwen``) on the current device: tokens/s of generation with the
configured backend (chat-rendered ReasoningGYM prompts of the ``sapo_paper`` preset, as a
round samples them) and tokens/s of one GRPO training step (the trainer a round runs, on
``--groups`` x ``--n`` completions cut or padded to ``--completion-tokens`` tokens), the
step's peak memory (CUDA: ``max_memory_allocated``; CPU: the process's peak RSS so far).

    PYTHONPATH=$PWD python bench/engine_overhead.py --mode throughput --model local-qwen-tiny \\
        [--device auto] [--backend transformers|vllm] [--groups 8 --n 8 --completion-tokens 256]

Results go to ``bench/results/engine_overhead.json`` / ``engine_throughput_<model>.json``
(atomically), with the load average next to the numbers (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from node.learner.config import EngineConfig, PolicyConfig, TrainerConfig
from node.learner.engine import make_engine
from node.learner.policy import load_policy
from protocol import atomic_write_bytes

RESULTS = Path(__file__).resolve().parent / "results"
LOCAL_QWEN = {"local-qwen-tiny": "TINY", "local-qwen-0.5b": "QWEN25_05B"}
"""Model names this bench builds locally (``node.learner.local_qwen`` shapes)."""


def _write(name: str, result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(RESULTS / name, json.dumps(result, indent=1).encode())


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def overhead(args: argparse.Namespace) -> None:
    policy = load_policy(PolicyConfig(model=args.model, device=args.device),
                         tempfile.mkdtemp(prefix="engine-bench-"))
    model, tok = policy.model, policy.tokenizer
    prompts = [f"{a}+{b}=" for a, b in zip(range(10, 10 + args.prompts), range(50, 50 + args.prompts))]
    # no stop strings: both sides run to max_new_tokens unless eos is sampled (same seed -> same)
    engine = make_engine(EngineConfig(max_new_tokens=args.max_new_tokens, stop=()), model, tok)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens,
                  num_return_sequences=args.n, eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    model.eval()

    def bare(seed: int) -> int:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = model.generate(**batch, **kwargs)
        count = 0  # same rule as the engine: tokens up to and including the first eos
        for row in out[:, batch["input_ids"].shape[1]:].tolist():
            count += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        return count

    def ours(seed: int) -> int:
        return sum(c.token_count for g in engine.generate(prompts, n=args.n, seed=seed) for c in g)

    bare(0), ours(0)  # warm-up
    times: dict[str, list[float]] = {"bare": [], "engine": []}
    tokens: dict[str, int] = {}
    for r in range(args.repeats):
        for name, fn in (("bare", bare), ("engine", ours)) if r % 2 == 0 else (("engine", ours), ("bare", bare)):
            t = time.perf_counter()
            tokens[name] = fn(1000 + r)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    tps = {k: tokens[k] / med[k] for k in med}
    # per adjacent pair (bare, engine ran back to back): robust to slow drifts in machine load
    pair_ratio = statistics.median(e / b for b, e in zip(times["bare"], times["engine"]))
    result = {"model": args.model, "device": str(model.device), "prompts": args.prompts, "n": args.n,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "median_seconds": med, "best_seconds": best, "tokens_last_repeat": tokens, "tokens_per_second": tps,
              "overhead": 1 - tps["engine"] / tps["bare"],
              "overhead_best": best["engine"] / best["bare"] - 1,
              "overhead_pairs_median": pair_ratio - 1, "load_average": _load_average(),
              "seconds_all": times}
    _write("engine_overhead.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "seconds_all"}, indent=1))


def _model_source(name: str) -> str:
    if name in LOCAL_QWEN:
        from node.learner import local_qwen

        return str(local_qwen.ensure_local_qwen(getattr(local_qwen, LOCAL_QWEN[name])))
    return name


def _peak_memory(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {"cuda_max_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "cuda_max_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}
    return {"process_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def _training_groups(tok: Any, prompts: list[str], *, groups: int, n: int, tokens: int,
                     rng: random.Random) -> list[Any]:
    """``groups`` x ``n`` completions of exactly ``tokens`` tokens of the learned vocabulary
    (re-tokenising the decoded text can shift the count by a few), rewards with variance."""
    from node.learner.grpo import TrainingGroup

    learned = [i for i in range(min(len(tok), 50_000)) if i not in set(tok.all_special_ids)]
    out = []
    for g in range(groups):
        texts = tuple(tok.decode([rng.choice(learned) for _ in range(tokens)]) for _ in range(n))
        rewards = tuple(float(i % 2) for i in range(n))
        out.append(TrainingGroup(prompt=prompts[g % len(prompts)], completions=texts, rewards=rewards))
    return out


def throughput(args: argparse.Namespace) -> None:
    from node.learner.grpo import GrpoTrainer
    from node.learner.prompting import make_prompt_format, resolve_engine
    from node.learner.tasks import build_task, get_family
    from node.learner.tasks.presets import PRESETS

    source = _model_source(args.model)
    dtype = args.dtype or ("bfloat16" if args.device != "cpu" and torch.cuda.is_available() else "float32")
    t = time.perf_counter()
    policy = load_policy(PolicyConfig(model=source, device=args.device, dtype=dtype),
                         tempfile.mkdtemp(prefix="engine-bench-"))
    load_s = time.perf_counter() - t
    model, tok, device = policy.model, policy.tokenizer, policy.model.device
    fmt = make_prompt_format("auto", tok)
    engine_cfg = resolve_engine(EngineConfig(backend=args.backend, max_new_tokens=args.max_new_tokens),
                                model=model, embedded=args.model == "embedded", prompt_format=fmt)
    engine = make_engine(engine_cfg, model, tok, source=policy.source)
    rng = random.Random(0)
    families = PRESETS["sapo_paper"]
    tasks = [build_task(get_family(families[i % len(families)]).sample_spec(rng, {}))
             for i in range(args.groups)]
    prompts = [fmt.render(task.prompt) for task in tasks]

    engine.generate(prompts[:1], n=2, seed=0)  # warm-up (CUDA kernels, vLLM graphs)
    gen: list[tuple[float, int]] = []
    for r in range(args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        out = engine.generate(prompts, n=args.n, seed=1000 + r)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        gen.append((time.perf_counter() - t, sum(c.token_count for g in out for c in g)))

    trainer = GrpoTrainer(TrainerConfig(max_completion_tokens=args.completion_tokens), model, tok)
    groups = _training_groups(tok, prompts, groups=args.groups, n=args.n,
                              tokens=args.completion_tokens, rng=rng)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train: list[tuple[float, float]] = []
    for _ in range(args.train_repeats):
        t = time.perf_counter()
        stats = trainer.step(groups)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train.append((time.perf_counter() - t, float(stats.get("train_tokens", 0.0))))
    gen_s = statistics.median(s for s, _ in gen)
    gen_tokens = statistics.median(n for _, n in gen)
    train_s = statistics.median(s for s, _ in train)
    train_tokens = statistics.median(n for _, n in train)
    result = {
        "mode": "throughput", "model": args.model, "source": policy.source,
        "params": sum(p.numel() for p in model.parameters()), "dtype": dtype,
        "device": str(device), "backend": args.backend, "prompt_format": fmt.name,
        "torch_threads": torch.get_num_threads(), "load_seconds": load_s,
        "generation": {"prompts": len(prompts), "n": args.n,
                       "max_new_tokens": engine_cfg.max_new_tokens, "repeats": args.repeats,
                       "median_seconds": gen_s, "median_tokens": gen_tokens,
                       "tokens_per_second": gen_tokens / gen_s, "all": gen},
        "train_step": {"groups": args.groups, "n": args.n,
                       "completion_tokens": args.completion_tokens, "repeats": args.train_repeats,
                       "median_seconds": train_s, "train_tokens": train_tokens,
                       "tokens_per_second": train_tokens / train_s, "all": train,
                       "peak_memory": _peak_memory(device)},
        "load_average": _load_average(),
    }
    _write(f"engine_throughput_{Path(args.model).name}.json", result)
    print(json.dumps({k: v for k, v in result.items()}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("overhead", "throughput"), default="overhead")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="throughput: default bfloat16 on CUDA, else float32")
    ap.add_argument("--backend", default="transformers", help="throughput: engine backend")
    ap.add_argument("--prompts", type=int, default=8, help="overhead: prompts per call")
    ap.add_argument("--groups", type=int, default=8, help="throughput: questions (groups)")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: 32 (overhead), the engine's default for the model (throughput)")
    ap.add_argument("--completion-tokens", type=int, default=256, help="throughput: tokens per trained completion")
    ap.add_argument("--repeats", type=int, default=None, help="default: 7 (overhead), 3 (throughput)")
    ap.add_argument("--train-repeats", type=int, default=2, help="throughput: training steps timed")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "overhead":
        args.max_new_tokens = args.max_new_tokens or 32
        args.repeats = args.repeats or 7
        overhead(args)
    else:
        args.repeats = args.repeats or 3
        throughput(args)


if __name__ == "__main__":
    main()
