"""SAPO (nodes share rollouts, I local + J external) vs the same nodes alone (8 local / 0).

The SAPO paper's controlled protocol (docs/notes/sapo.md) on the node's defaults (the embedded
warm-started model on ``letter_sort``, 0/1 correctness): N nodes, an equal budget of
``questions_per_round`` groups x 8 completions per node and round in every split, the
zero-advantage filter on external groups, splits ``I/J`` (and ``adaptive``: SapoConfig's
``adaptive_external`` picking J each round between a quarter and three quarters of the budget,
the paper's 6/2 to 2/6), several seeds. Figures of merit: cumulative accuracy and cumulative
reward (sum over nodes and rounds of the per-round mean over each node's own local rollouts),
each split over 8/0 with a 95% bootstrap interval over seeds (seeds resampled, paired).

The design is paired: a seed fixes the node identities, the learners' seeds and so the task
draws in every split, and the interval resamples seeds with both arms of a pair together; the
per-seed ratios are in the JSON too. The quick preset runs 4 seeds: with 2, the bootstrap has
3 distinct resamples and its "95% interval" is just the span of the two per-seed ratios.

Every run starts from the embedded model's shipped weights (``node.learner.tiny_model``), the
same bytes on every machine; the JSON records their hash (``model_hash``), the machine, the
torch build and the commit next to the numbers, so a rerun elsewhere can be compared.

Every (split, seed) runs in its own subprocess (``--jobs`` at a time, one torch thread each);
inside it the nodes run round-robin on a LoopbackHub (every message signed and verified), all
from the same base model, identities and seeds in every split.

    PYTHONPATH=$PWD python bench/sapo_vs_isolated.py --quick  # 4 nodes, 8/0 vs 4/4, 4 seeds, 1000 rounds
    PYTHONPATH=$PWD python bench/sapo_vs_isolated.py          # 8 nodes, 6 arms, 3 seeds, 400 rounds

Both presets run the node's default external correction (``weight`` at bound 0: arms
``4/4:weight@0.0``...); the full one adds the paper's uncorrected 4/4. The headline
(``ratio_accuracy``, ``ci_low``, ``ci_high``; ``headline_arm`` names it) is 4/4 with the
node's default over 8/0.

An arm is a split (trained as the paper does: no correction of external completions),
optionally with an external correction (``TrainerConfig``'s
``external_correction`` and ``external_surprise_bound``, node/learner/offpolicy.py) after a
colon: ``4/4:mask@1.0`` is 4/4 with external completions masked above 1 nat per token of excess
surprise; ``4/4:mask@1e6`` masks nothing but records the surprise diagnostics per round.
``--family`` trains every node on another task family (built-in or a vetted ReasoningGYM one;
default ``letter_sort``; the JSON records it as ``family``). ``--seed-list`` runs some seeds only
(split a long run into chunks); ``--reuse A.json,B.json`` takes the (arm, seed) runs those
files hold instead of running them again (cut to ``--rounds``; runs are deterministic per seed,
so a prefix of a longer run is the shorter run), so a last call can summarise chunks, or add an
arm to arms already measured.

    PYTHONPATH=$PWD python bench/sapo_vs_isolated.py --quick --rounds 1000 \
        --splits 8/0,4/4,4/4:mask@1.0 --reuse bench/results/sapo_vs_isolated_quick_1000.json

Writes bench/results/<name>.json and <name>.png (cumulative reward per arm over rounds, the
accuracy per node, and each arm's cumulative accuracy over the baseline's, over rounds).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}


DIAGNOSTICS = ("external_surprise", "external_surprise_pos", "local_surprise", "external_weight",
               "external_downweighted")
"""Per-round trainer diagnostics of the external correction (mean over the nodes that have it)."""


def parse_arm(arm: str) -> tuple[str, dict]:
    """``"4/4:mask@1.0"`` -> ("4/4", TrainerConfig overrides); ``"4/4"`` -> ("4/4", {}): no
    correction, the SAPO paper's update (``external_correction = "off"``), whatever the
    node's default."""
    split, _, correction = arm.partition(":")
    if not correction:
        return split, {"external_correction": "off"}
    mode, _, bound = correction.partition("@")
    extra: dict = {"external_correction": mode}
    if bound:
        extra["external_surprise_bound"] = float(bound)
    return split, extra


def default_arm_suffix() -> str:
    """The arm suffix of the node's default external correction (``":weight@0.0"``; ``""``
    when the default is the paper's uncorrected update)."""
    from node.learner import TrainerConfig

    cfg = TrainerConfig()
    if cfg.external_correction == "off":
        return ""
    return f":{cfg.external_correction}@{cfg.external_surprise_bound!r}"


def run_swarm(*, nodes: int, rounds: int, split: str, budget: int, seed: int, lr: float | None,
              base: Path, family: str = "letter_sort") -> dict:
    """One arm, one seed: ``nodes`` learners round-robin; one shared hub unless J = 0."""
    from node.bridge import LoopbackHub
    from node.learner import LearnerConfig, PolicyConfig, SapoConfig, TaskConfig, TrainerConfig
    from node.learner.loop import Learner
    from protocol import Identity

    arm = split
    split, correction = parse_arm(arm)
    adaptive = split == "adaptive"  # J each round in [budget/4, 3 budget/4]: 6/2 to 2/6 at 8
    local, external = (budget // 4, budget - budget // 4) if adaptive else map(int, split.split("/"))
    if local + external != budget:
        raise SystemExit(f"split {split}: I + J must equal the budget ({budget})")
    extra = {"adaptive_external": True, "min_external": budget // 4} if adaptive else {}
    sapo = SapoConfig(questions_per_round=budget, external=external, **extra)
    trainer = TrainerConfig(**({"lr": lr} if lr else {}), **correction)
    ids = [Identity.from_seed(bytes([seed % 256, i + 1]) * 16) for i in range(nodes)]
    shared = LoopbackHub(swarm_id="bench")
    bridges = [(shared if external else LoopbackHub(swarm_id="bench")).bridge(i) for i in ids]
    root = Path(tempfile.mkdtemp(prefix="sapo-bench-"))
    learners = []
    for k, ident in enumerate(ids):
        shutil.copytree(base, root / f"n{k}" / "base")
        cfg = LearnerConfig(data_dir=str(root / f"n{k}"), seed=seed * 1000 + k, checkpoint_every=0,
                            policy=PolicyConfig(device="cpu", threads=1), sapo=sapo, trainer=trainer,
                            tasks=TaskConfig(families=(family,)))
        learners.append(Learner(cfg, peer_id=ident.peer_id))
    recs: list[list[dict]] = [[] for _ in range(nodes)]
    t0 = time.monotonic()
    for r in range(rounds):
        for k, (learner, bridge) in enumerate(zip(learners, bridges)):
            rec = learner.run_round(bridge)
            assert rec is not None
            learner.round += 1
            recs[k].append(rec)
        if r % 25 == 0 or r == rounds - 1:
            acc = sum(n[-1]["accuracy"] for n in recs) / nodes
            print(f"[{arm} seed {seed}] round {r:4d} accuracy {acc:.3f} t={time.monotonic() - t0:.0f}s",
                  file=sys.stderr, flush=True)
    shutil.rmtree(root, ignore_errors=True)

    def per_round(key: str) -> list[float]:
        return [sum(n[r][key] or 0 for n in recs) for r in range(rounds)]  # summed over nodes

    def diagnostic(key: str) -> list[float | None]:
        out = []
        for r in range(rounds):
            xs = [n[r]["train"][key] for n in recs if key in n[r]["train"]]
            out.append(sum(xs) / len(xs) if xs else None)
        return out

    return {"split": arm, "seed": seed, "seconds": time.monotonic() - t0,
            **({"diagnostics": {k: diagnostic(k) for k in DIAGNOSTICS}}
               if correction["external_correction"] != "off" else {}),
            "accuracy": per_round("accuracy"), "reward": per_round("mean_reward"),
            "external_used": per_round("external_used"), "local_used": per_round("local_used"),
            "zero_variance_trained": per_round("skipped_zero_variance"),
            "external_zero_advantage": per_round("external_zero_advantage")}


def bootstrap_ratio(num: list[float], den: list[float], *, n: int = 10000, seed: int = 0
                    ) -> tuple[float, float]:
    """95% percentile interval of sum(num)/sum(den) with seeds resampled in pairs."""
    rng = random.Random(seed)
    k = len(num)
    ratios = []
    for _ in range(n):
        pick = [rng.randrange(k) for _ in range(k)]
        ratios.append(sum(num[i] for i in pick) / max(sum(den[i] for i in pick), 1e-9))
    ratios.sort()
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def summarize(runs: list[dict], splits: list[str], seeds: list[int], baseline: str) -> dict:
    by = {(r["split"], r["seed"]): r for r in runs}
    out: dict = {}
    for split in splits:
        acc = [sum(by[split, s]["accuracy"]) for s in seeds]
        rew = [sum(by[split, s]["reward"]) for s in seeds]
        out[split] = {"cumulative_accuracy": acc, "cumulative_reward": rew,
                      "mean_cumulative_accuracy": sum(acc) / len(acc),
                      "mean_cumulative_reward": sum(rew) / len(rew),
                      "external_used": sum(sum(by[split, s]["external_used"]) for s in seeds) / len(seeds),
                      "zero_variance_trained": sum(sum(by[split, s]["zero_variance_trained"])
                                                   for s in seeds) / len(seeds),
                      "accuracy_per_node_by_tenth": _tenths(by, split, seeds)}
        if split != baseline:
            base_acc, base_rew = out[baseline]["cumulative_accuracy"], out[baseline]["cumulative_reward"]
            out[split]["ratio_accuracy"] = sum(acc) / max(sum(base_acc), 1e-9)
            out[split]["ratio_reward"] = sum(rew) / max(sum(base_rew), 1e-9)
            out[split]["ci_accuracy"] = bootstrap_ratio(acc, base_acc)
            out[split]["ci_reward"] = bootstrap_ratio(rew, base_rew)
            out[split]["ratio_accuracy_per_seed"] = [a / max(b, 1e-9) for a, b in zip(acc, base_acc)]
    return out


def _tenths(by: dict, split: str, seeds: list[int]) -> list[float]:
    """Mean accuracy per node in each tenth of the rounds (mean over seeds): the curve's shape."""
    curves = [by[split, s]["accuracy"] for s in seeds]
    rounds, nodes = len(curves[0]), by[split, seeds[0]].get("nodes", 1)
    w = max(1, rounds // 10)
    return [round(sum(sum(c[i:i + w]) for c in curves) / (len(curves) * w * nodes), 4)
            for i in range(0, w * (rounds // w), w)]


def reuse(paths: list[Path], *, nodes: int, rounds: int, budget: int, lr: float | None,
          family: str = "letter_sort") -> dict:
    """(arm, seed) -> run from earlier results files with the same set-up, cut to ``rounds``."""
    out: dict = {}
    for path in paths:
        data = json.loads(path.read_text())
        if (data["nodes"], data["budget"], data["lr"]) != (nodes, budget, lr) or data["rounds"] < rounds:
            raise SystemExit(f"{path}: nodes/budget/lr/rounds {data['nodes']}/{data['budget']}/"
                             f"{data['lr']}/{data['rounds']} do not fit {nodes}/{budget}/{lr}/{rounds}")
        if data.get("family", "letter_sort") != family:
            raise SystemExit(f"{path}: family {data.get('family', 'letter_sort')} is not {family}")
        for run in data["runs"]:
            cut = {k: (v[:rounds] if isinstance(v, list) else v) for k, v in run.items()}
            if "diagnostics" in run:
                cut["diagnostics"] = {k: v[:rounds] for k, v in run["diagnostics"].items()}
            cut["reused_from"] = {"file": path.name, "commit": data.get("commit"),
                                  "model_hash": data.get("model_hash"), "rounds": data["rounds"]}
            out.setdefault((run["split"], run["seed"]), cut)
    return out


def plot(runs: list[dict], splits: list[str], seeds: list[int], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(18, 4.5))
    base_acc = [sum(x) for x in zip(*(r["accuracy"] for r in runs if r["split"] == splits[0]))]
    for i, split in enumerate(splits):
        mine = [r for r in runs if r["split"] == split]
        if i:
            acc = [sum(x) for x in zip(*(r["accuracy"] for r in mine))]
            ratio = [x / max(y, 1e-9) for x, y in zip(itertools.accumulate(acc),
                                                      itertools.accumulate(base_acc))]
            c.plot(ratio, color=f"C{i}", label=split)
        for key, ax in (("reward", a), ("accuracy", b)):
            curves = [r[key] for r in mine]
            mean = [sum(x) / len(x) for x in zip(*curves)]
            if ax is a:
                ax.plot(list(itertools.accumulate(mean)), color=f"C{i}", label=split)
            else:
                w = max(1, len(mean) // 20)
                nodes = mine[0]["nodes"]
                ma = [sum(mean[max(0, j - w + 1):j + 1]) / min(j + 1, w) / nodes for j in range(len(mean))]
                ax.plot(ma, color=f"C{i}", label=split)
    a.set_title("cumulative reward, summed over nodes (mean of seeds)")
    b.set_title("accuracy per node (moving average, mean of seeds)")
    c.set_title(f"cumulative accuracy over {splits[0]}'s (seeds summed)")
    c.axhline(1.0, color="grey", lw=0.8)
    for ax in (a, b, c):
        ax.set_xlabel("round")
        ax.legend(title="I/J")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def provenance(base: Path) -> dict:
    """What decides the numbers besides the code's arguments: the base model's weights (their
    sha256, the pinned ``EMBEDDED_SHA256`` after ``ensure_embedded``'s check), the torch build,
    the library versions, the commit and the machine."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    git = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always",
                          "--dirty", "--abbrev=40"], capture_output=True, text=True)
    return {
        "model_hash": hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest(),
        "machine": {"cpu_model": cpu, "cores": os.cpu_count(), "arch": platform.machine(),
                    "platform": platform.platform()},
        "torch": {"version": torch.__version__, "git_version": torch.version.git_version,
                  "cuda": torch.version.cuda, "debug": torch.version.debug},
        "transformers": transformers.__version__, "python": platform.python_version(),
        "commit": git.stdout.strip() if git.returncode == 0 else None,
    }


def _job(args: argparse.Namespace, split: str, seed: int, base: Path, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--job", split, str(seed), "--base", str(base), "--out", str(out),
           "--nodes", str(args.nodes), "--rounds", str(args.rounds), "--budget", str(args.budget),
           "--family", args.family]
    if args.lr:
        cmd += ["--lr", str(args.lr)]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = json.loads(out.read_text())
    result["nodes"] = args.nodes
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 nodes, 8/0 vs 4/4, 4 seeds, 1000 rounds")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=None, help="how many seeds (0, 1, ...)")
    ap.add_argument("--splits", default=None, help="comma-separated arms: I/J splits and/or "
                    "'adaptive', each optionally with ':MODE@BOUND' (external correction)")
    ap.add_argument("--seed-list", default=None, help="comma-separated seeds (instead of --seeds)")
    ap.add_argument("--reuse", default=None, help="comma-separated results JSON files whose "
                    "(arm, seed) runs are taken instead of rerun")
    ap.add_argument("--budget", type=int, default=8, help="question groups per node and round")
    ap.add_argument("--lr", type=float, default=None, help="override TrainerConfig.lr")
    ap.add_argument("--family", default="letter_sort", help="task family every node trains on "
                    "(built-in or a vetted ReasoningGYM family; default letter_sort)")
    ap.add_argument("--jobs", type=int, default=2, help="(split, seed) runs at a time")
    ap.add_argument("--name", default=None)
    ap.add_argument("--job", nargs=2, metavar=("SPLIT", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--base", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.job:
        result = run_swarm(nodes=args.nodes, rounds=args.rounds, split=args.job[0], budget=args.budget,
                           seed=int(args.job[1]), lr=args.lr, base=args.base, family=args.family)
        args.out.write_text(json.dumps(result))
        return

    quick = args.quick
    args.nodes = args.nodes or (4 if quick else 8)
    args.rounds = args.rounds or (1000 if quick else 400)
    seeds = ([int(x) for x in args.seed_list.split(",")] if args.seed_list
             else list(range(args.seeds or (4 if quick else 3))))
    default = default_arm_suffix()
    splits = (args.splits or (f"8/0,4/4{default}" if quick else
                              f"8/0,6/2{default},4/4{default},2/6{default},4/4,adaptive{default}")
              ).split(",")
    name = args.name or ("sapo_vs_isolated_quick" if quick else "sapo_vs_isolated")
    baseline = f"{args.budget}/0"
    if baseline not in splits:
        splits.insert(0, baseline)
    from node.learner import SapoConfig
    from node.learner.tiny_model import ensure_embedded

    reused = reuse([Path(p) for p in args.reuse.split(",")], nodes=args.nodes, rounds=args.rounds,
                   budget=args.budget, lr=args.lr, family=args.family) if args.reuse else {}
    t0 = time.monotonic()
    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="sapo-bench-"))
    base = ensure_embedded(tmp / "base")  # materialised once; every node copies it
    origin = provenance(base)
    jobs = [(split, seed) for seed in seeds for split in splits if (split, seed) not in reused]
    def one(job: tuple[str, int]) -> dict:
        split, seed = job
        return _job(args, split, seed, base, tmp / f"{split.replace('/', '-')}-{seed}.json")

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        fresh = dict(zip(jobs, pool.map(one, jobs)))
    runs = [fresh.get((split, seed)) or reused[split, seed] for seed in seeds for split in splits]
    shutil.rmtree(tmp, ignore_errors=True)
    per_split = summarize(runs, splits, seeds, baseline)
    half = f"{args.budget // 2}/{args.budget - args.budget // 2}"
    headline = next((a for a in (half + default, half) if a in per_split), half)
    head = per_split.get(headline, {})
    ci_low, ci_high = head.get("ci_accuracy", (None, None))
    summary = {
        "headline_arm": headline,
        "ratio_accuracy": head.get("ratio_accuracy"), "ratio_reward": head.get("ratio_reward"),
        "ci_low": ci_low, "ci_high": ci_high, "ci_reward": head.get("ci_reward"),
        "seeds": seeds, "splits": splits, "nodes": args.nodes, "rounds": args.rounds,
        "budget": args.budget, "completions_per_question": SapoConfig().completions_per_question,
        "lr": args.lr, "family": args.family, "per_split": per_split, "paper_cumulative_reward": PAPER,
        "paper_ratio_4_4": PAPER["4/4"] / PAPER["8/0"], "wall_seconds": time.monotonic() - t0,
        "loadavg_start": load0, "loadavg_end": os.getloadavg(), "jobs": args.jobs,
        "ran": [f"{split} seed {seed}" for split, seed in jobs], **origin,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({**summary, "runs": runs}))
    plot(runs, splits, seeds, RESULTS / f"{name}.png",
         title=f"{args.nodes} nodes, {args.rounds} rounds, {len(seeds)} seeds, {args.family}")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_split"}, indent=1))
    for split, s in per_split.items():
        print(split, {k: v for k, v in s.items() if k not in ("cumulative_accuracy", "cumulative_reward")})


if __name__ == "__main__":
    main()
