"""Does the embedded default learn on a CPU from a cold start?

Runs ``run_learner`` (the real entry point, one node on a LoopbackHub, J = 0) from a fresh
data dir for ``--rounds`` rounds or ``--minutes``, whichever ends first, and writes
``bench/results/learner_curve.json`` and ``learner_curve.png`` (reward and accuracy per round,
moving average). Prints the mean reward of the first and last 10% of rounds.

    PYTHONPATH=$PWD python bench/learner_curve.py [--rounds 1500] [--minutes 10]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
from pathlib import Path

from node.bridge import LoopbackHub
from node.learner import (EngineConfig, LearnerConfig, PolicyConfig, SapoConfig, TaskConfig,
                          TrainerConfig, run_learner)
from node.report import moving_average
from protocol import Identity
from protocol.records import RoundRecord

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="override TrainerConfig.lr")
    ap.add_argument("--entropy", type=float, default=None, help="override TrainerConfig.entropy_coef")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--family", default=TaskConfig().families[0], help="task family (default: the node's)")
    ap.add_argument("--max-operand", type=int, default=None, help="tiny_add max_operand")
    ap.add_argument("--closeness", type=float, default=None, help="tiny_add closeness weight")
    ap.add_argument("--length", type=int, default=None, help="letter_sort length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="learner_curve")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    trainer = TrainerConfig(**{k: v for k, v in (("lr", args.lr), ("entropy_coef", args.entropy))
                               if v is not None})
    engine = EngineConfig(temperature=args.temperature) if args.temperature else EngineConfig()
    family_config = {k: v for k, v in (("max_operand", args.max_operand), ("closeness", args.closeness),
                                       ("length", args.length)) if v is not None}
    tasks = TaskConfig(families=(args.family,), family_config={args.family: family_config})
    data_dir = tempfile.mkdtemp(prefix="learner-curve-")
    config = LearnerConfig(data_dir=data_dir, seed=args.seed, checkpoint_every=0,
                           policy=PolicyConfig(device="cpu", threads=args.threads),
                           trainer=trainer, engine=engine, tasks=tasks,
                           sapo=SapoConfig(external=0))
    stop = threading.Event()
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60

    def on_round(rec: RoundRecord) -> None:
        if rec.round % 100 == 0:
            print(f"round {rec.round:5d} reward {rec.mean_reward:.3f} acc {rec.accuracy:.3f} "
                  f"t={time.monotonic() - t0:.0f}s", flush=True)
        if time.monotonic() > deadline:
            stop.set()

    identity = Identity.from_seed(bytes([args.seed % 256]) * 32)  # peer id seeds the node's RNG
    report = run_learner(config, LoopbackHub().bridge(identity), rounds=args.rounds,
                         stop=stop, on_round=on_round)
    seconds = time.monotonic() - t0
    rewards = [r["mean_reward"] for r in report["rounds"]]
    acc = [r["accuracy"] for r in report["rounds"]]
    k = max(1, len(rewards) // 10)
    result = {
        "rounds": len(rewards), "seconds": seconds, "config": config.to_dict(),
        "first_reward": sum(rewards[:k]) / k, "last_reward": sum(rewards[-k:]) / k,
        "first_accuracy": sum(acc[:k]) / k, "last_accuracy": sum(acc[-k:]) / k,
        "window_rounds": k, "first10_reward": sum(rewards[:10]) / max(1, len(rewards[:10])), "skipped_zero_variance": sum(r["skipped_zero_variance"] for r in report["rounds"]),
        "reward": rewards, "accuracy": acc,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    plot(rewards, acc, RESULTS / f"{args.name}.png", title=f"embedded {args.family}, {len(rewards)} rounds, {seconds:.0f}s")
    print(json.dumps({k: v for k, v in result.items() if k not in ("reward", "accuracy", "config")}, indent=1))


def plot(rewards: list[float], acc: list[float], path: Path, *, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = max(1, len(rewards) // 50)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(rewards, alpha=0.25, color="C0")
    ax.plot(moving_average(rewards, w), color="C0", label=f"mean reward (MA {w})")
    ax.plot(moving_average(acc, w), color="C1", label=f"accuracy (MA {w})")
    ax.set_xlabel("round")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
