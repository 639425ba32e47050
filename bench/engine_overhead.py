"""Generation throughput of the learner's engine vs bare ``model.generate`` (same model, prompts, seed).

The bare side gets pre-tokenised inputs and only calls ``model.generate``; the engine side
does everything a round does (tokenise, generate, cut at eos/stop, decode). Both sample the
same tokens (same seed and kwargs), so tokens/s are directly comparable. Repeats alternate
and the median is reported.

    PYTHONPATH=$PWD python bench/engine_overhead.py [--model embedded] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from node.learner.config import EngineConfig, PolicyConfig
from node.learner.engine import make_engine
from node.learner.policy import load_policy

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
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
              "overhead_pairs_median": pair_ratio - 1, "seconds_all": times}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_overhead.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "seconds_all"}, indent=1))


if __name__ == "__main__":
    main()
