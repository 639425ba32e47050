"""Cost of re-scoring received rollouts: hostile count_primes specs, normal rounds, worker overhead.

    PYTHONPATH=$PWD python bench/rescore_cost.py [--families tiny_add,basic_arithmetic] [--repeat 5]

Prints one JSON line per scenario: wall seconds of ``Rescorer.rescore``, the learner process's
RSS before/after (MB) and the worker's RSS. ``inprocess`` scores the same rollouts with
``build_task`` + ``task.score`` in this process (what main did) for the overhead comparison.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from node.bridge import Received
from node.learner.config import SapoConfig, TaskConfig
from node.learner.rescore import Rescorer
from node.learner.tasks import build_task, get_family
from protocol import Rollout, RolloutBatch, TaskSpec


def _rss_mb(pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _batch(rollouts: list[Rollout], sender: str) -> Received:
    return Received(sender=sender, received_ms=0,
                    message=RolloutBatch(model="m", round=0, rollouts=tuple(rollouts)))


def _honest(families: list[str], n: int, g: int, seed: int) -> list[Rollout]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        fam = families[i % len(families)]
        spec = get_family(fam).sample_spec(rng, {})
        task = build_task(spec)
        comps = tuple((task.answer if k % 2 else f"wrong {k}") + "\n" for k in range(g))
        out.append(Rollout(task=spec, prompt=task.prompt, completions=comps))
    return out


def _time(fn):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="tiny_add,basic_arithmetic")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    families = args.families.split(",")
    g = 8
    own = TaskConfig(families=tuple(families + ["count_primes"]))
    rescorer = Rescorer(own, SapoConfig(completions_per_question=g), max_completion_tokens=256,
                        count_tokens=len)
    # (a) 2 messages x 16 count_primes specs with max_n 2e7 and wrong prompts
    evil = [Rollout(task=TaskSpec(family="count_primes", config={"max_n": 20_000_000}, seed=s, index=0),
                    prompt="wrong", completions=("1",) * g) for s in range(16)]
    rss0 = _rss_mb()
    dt, res = _time(lambda: rescorer.rescore([_batch(evil, "a"), _batch(evil, "b")]))
    print(json.dumps({"scenario": "count_primes_2x16_max_n_2e7", "seconds": round(dt, 4),
                      "rss_before_mb": round(rss0, 1), "rss_after_mb": round(_rss_mb(), 1),
                      "rejected": dict(res.rejected), "worker_started": rescorer.verifier.starts}))
    # (b) a normal round: 3 peers x 1 batch of 4 rollouts x 8 completions
    received = [_batch(_honest(families, 4, g, seed=p), f"peer{p}") for p in range(3)]
    dt, res = _time(lambda: rescorer.rescore(received))  # includes the worker's start
    print(json.dumps({"scenario": "first_round_incl_worker_start", "seconds": round(dt, 4),
                      "groups": len(res.groups), "rejected": dict(res.rejected),
                      "worker_rss_mb": round(_rss_mb(str(rescorer.verifier.pid)), 1)}))
    for n_rollouts in (12, 64):
        batches = [_batch(_honest(families, n_rollouts // 3, g, seed=100 + p), f"peer{p}")
                   for p in range(3)]
        rollouts = [r for b in batches for r in b.message.rollouts]
        worker = min(_time(lambda: rescorer.rescore(batches))[0] for _ in range(args.repeat))

        def inprocess(rs: list[Rollout] = rollouts) -> None:
            for r in rs:
                task = build_task(r.task, prompt=r.prompt)
                [task.score(c) for c in r.completions]

        local = min(_time(inprocess)[0] for _ in range(args.repeat))
        print(json.dumps({"scenario": f"round_{len(rollouts)}_rollouts", "families": families,
                          "worker_s": round(worker, 4), "inprocess_s": round(local, 4),
                          "overhead_per_rollout_ms": round(1000 * (worker - local) / len(rollouts), 3),
                          "learner_rss_mb": round(_rss_mb(), 1),
                          "worker_rss_mb": round(_rss_mb(str(rescorer.verifier.pid)), 1)}))
    rescorer.close()


if __name__ == "__main__":
    main()
