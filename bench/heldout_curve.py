"""The held-out score: what it costs, and whether it rises where training accuracy does.

``cost``: one learner (``run_learner``, embedded model, LoopbackHub, alone) scoring the
held-out set after *every* round, so each round gives one (round seconds, eval seconds)
pair; the cost at ``eval_every`` N is eval seconds / (N x round seconds). Writes
``bench/results/heldout_cost.json``.

``curve``: ``swarm-node local --nodes K --rounds R`` (the CLI, default config: the
held-out score every ``eval_every`` = 10 rounds) and, per node and score, the held-out greedy
and sampled accuracy next to the training accuracy of the rounds since the previous score.
Writes ``bench/results/heldout_curve.json`` (and the local run's report and PNG beside it).

    PYTHONPATH=$PWD python bench/heldout_curve.py cost [--rounds 12]
    PYTHONPATH=$PWD python bench/heldout_curve.py curve [--nodes 2 --rounds 100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def cost(rounds: int, questions: int, samples: int) -> dict:
    from node.bridge import LoopbackHub
    from node.learner import LearnerConfig, PolicyConfig, run_learner
    from protocol import Identity

    with tempfile.TemporaryDirectory() as d:
        config = LearnerConfig(data_dir=d, policy=PolicyConfig(device="cpu"), checkpoint_every=0,
                               checkpoint_every_s=0, eval_every=1, eval_questions=questions,
                               eval_samples=samples)
        report = run_learner(config, LoopbackHub().bridge(Identity.generate()), rounds=rounds)
    recs = report["rounds"][1:]  # the first round pays for warm-up
    round_s = [sum(r["seconds"].values()) for r in recs]
    eval_s = [r["heldout"]["seconds"] for r in recs]
    mean_round, mean_eval = sum(round_s) / len(round_s), sum(eval_s) / len(eval_s)
    return {"rounds": rounds, "questions": questions, "samples": samples,
            "mean_round_s": round(mean_round, 4), "mean_eval_s": round(mean_eval, 4),
            "eval_over_round": round(mean_eval / mean_round, 4),
            "fraction_at_eval_every": {n: round(mean_eval / (n * mean_round), 4)
                                       for n in (1, 5, 10, 20)}}


def curve(nodes: int, rounds: int) -> dict:
    RESULTS.mkdir(exist_ok=True)
    report = RESULTS / "heldout_local.json"
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "node", "local", "--nodes", str(nodes), "--rounds",
                        str(rounds), "--report", str(report), "--data-dir", d], check=True)
    wall = time.monotonic() - t0
    out = []
    for node in json.loads(report.read_text())["nodes"]:
        recs, prev, points = node.get("rounds", []), 0, []
        for r in recs:
            h = r.get("heldout")
            if not h:
                continue
            window = [x["accuracy"] for x in recs if prev <= x["round"] < h["after_rounds"]]
            points.append({"after_rounds": h["after_rounds"],
                           "heldout_greedy": h["greedy_accuracy"],
                           "heldout_sampled": h["sampled_accuracy"],
                           "training_accuracy": round(sum(window) / len(window), 4),
                           "eval_s": h["seconds"]})
            prev = h["after_rounds"]
        round_s = [sum(x["seconds"].values()) for x in recs]
        out.append({"peer_id": node.get("peer_id"), "rounds": len(recs), "points": points,
                    "mean_round_s": round(sum(round_s) / max(1, len(round_s)), 4)})
    return {"nodes": nodes, "rounds": rounds, "wall_s": round(wall, 1), "per_node": out,
            "png": str(report.with_suffix(".png"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("cost", "curve"))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--samples", type=int, default=1)
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.mode == "cost":
        result = cost(args.rounds or 12, args.questions, args.samples)
    else:
        result = curve(args.nodes, args.rounds or 100)
    path = RESULTS / f"heldout_{args.mode}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
