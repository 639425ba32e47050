"""SAPO (nodes share rollouts, I local + J external) vs the same nodes alone (J = 0).

Follows the paper's controlled protocol (notes/sapo.md): equal question-group budget per node
and round (I + J = questions_per_round), zero-advantage filter on external groups, cumulative
reward (sum over nodes and rounds of the mean reward of each node's own local rollouts) as the
figure of merit. Nodes run round-robin in one process on a LoopbackHub (every message really
signed and verified); both configurations use the same identities, seeds and base model.

    PYTHONPATH=$PWD python bench/sapo_vs_isolated.py [--nodes 4] [--rounds 150] [--local 4 --external 4]

Writes bench/results/sapo_vs_isolated.json and .png (cumulative reward and per-round reward).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import tempfile
import time
from pathlib import Path

from node.bridge import LoopbackHub
from node.learner import LearnerConfig, PolicyConfig, SapoConfig
from node.learner.loop import Learner
from protocol import Identity

RESULTS = Path(__file__).resolve().parent / "results"


def run_swarm(*, nodes: int, rounds: int, local: int, external: int, seed: int, threads: int,
              label: str) -> dict:
    """Run ``nodes`` learners round-robin for ``rounds``; shared hub iff external > 0."""
    ids = [Identity.from_seed(bytes([seed % 256, i + 1]) * 16) for i in range(nodes)]
    shared = LoopbackHub(swarm_id="bench")
    bridges = [(shared if external else LoopbackHub(swarm_id="bench")).bridge(i) for i in ids]
    root = Path(tempfile.mkdtemp(prefix=f"sapo-{label}-"))
    learners = []
    for k, ident in enumerate(ids):
        cfg = LearnerConfig(data_dir=str(root / f"n{k}"), seed=seed * 1000 + k, checkpoint_every=0,
                            policy=PolicyConfig(device="cpu", threads=threads),
                            sapo=SapoConfig(questions_per_round=local + external, local=local,
                                            external=external))
        learners.append(Learner(cfg, peer_id=ident.peer_id))
    per_node: list[list[dict]] = [[] for _ in range(nodes)]
    t0 = time.monotonic()
    for r in range(rounds):
        for k, (learner, bridge) in enumerate(zip(learners, bridges)):
            rec = learner.run_round(bridge)
            assert rec is not None
            learner.round += 1
            per_node[k].append(rec)
        if r % 25 == 0:
            mean = sum(n[-1]["mean_reward"] for n in per_node) / nodes
            print(f"[{label}] round {r:4d} mean reward {mean:.3f} t={time.monotonic() - t0:.0f}s", flush=True)
    reward = [[rec["mean_reward"] for rec in n] for n in per_node]
    return {
        "label": label, "nodes": nodes, "rounds": rounds, "local": local, "external": external,
        "seconds": time.monotonic() - t0,
        "cumulative_reward": sum(sum(n) for n in reward),
        "cumulative_accuracy": sum(rec["accuracy"] for n in per_node for rec in n),
        "external_used": sum(rec["external_used"] for n in per_node for rec in n),
        "rejected": sum(rec["rejected"] for n in per_node for rec in n),
        "reward": reward,
        "accuracy": [[rec["accuracy"] for rec in n] for n in per_node],
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, run in enumerate(runs):
        per_round = [sum(x) for x in zip(*run["reward"])]
        cum = list(itertools.accumulate(per_round))
        name = f"{run['label']} I={run['local']} J={run['external']}"
        a.plot(cum, color=f"C{i}", label=name)
        w = max(1, len(per_round) // 30)
        ma = [sum(per_round[max(0, j - w + 1):j + 1]) / min(j + 1, w) / run["nodes"] for j in range(len(per_round))]
        b.plot(ma, color=f"C{i}", label=name)
    a.set_title("cumulative reward (sum over nodes)")
    b.set_title("mean reward per node (moving average)")
    for ax in (a, b):
        ax.set_xlabel("round")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--local", type=int, default=4)
    ap.add_argument("--external", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="sapo_vs_isolated")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    budget = args.local + args.external
    RESULTS.mkdir(parents=True, exist_ok=True)
    sapo = run_swarm(nodes=args.nodes, rounds=args.rounds, local=args.local, external=args.external,
                     seed=args.seed, threads=args.threads, label="sapo")
    (RESULTS / f"{args.name}.partial.json").write_text(json.dumps({"runs": [sapo]}))
    alone = run_swarm(nodes=args.nodes, rounds=args.rounds, local=budget, external=0,
                      seed=args.seed, threads=args.threads, label="isolated")
    ratio = sapo["cumulative_reward"] / max(alone["cumulative_reward"], 1e-9)
    summary = {"ratio": ratio, "paper_ratio_4_4": 1093.31 / 561.79, "nodes": args.nodes,
               "rounds": args.rounds, "config": LearnerConfig(data_dir="-").to_dict(),
               **{f"{r['label']}_{k}": r[k] for r in (sapo, alone)
                  for k in ("cumulative_reward", "cumulative_accuracy", "external_used", "seconds")}}
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"summary": summary, "runs": [sapo, alone]}))
    plot([sapo, alone], RESULTS / f"{args.name}.png")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
