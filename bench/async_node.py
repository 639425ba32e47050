"""Does overlapping generation and training make a node learn faster per second?

One node (the embedded model, the default task, no peers: every group is its own), the same
budget of rounds (8 local groups each), run synchronously (``engine.staleness = 0``, today's
default: generate, then train, torch on all cores) and asynchronously at eta = 1, 2, 4 (a
generator process on half the cores keeps producing while the trainer steps on the rest;
``node/learner/generator.py``), plus naive PPO (``trainer.stale_correction = "off"``) at the
largest eta as the control. Each arm and seed runs in a fresh interpreter, one at a time
(the arms are timed: run it on a quiet machine).

Measured per run: groups trained per second (after the first 5 rounds), the generator's and
the trainer's busy fractions, the staleness of trained groups, dropped-stale groups, and the
accuracy of the node's own samples per round. Reported over seeds:

``speedup_groups_per_s``      mean async groups/s over mean sync groups/s
``speedup_time_to_accuracy``  the sync run's final accuracy (mean of its last tenth of rounds,
                              seeds averaged): the seconds the sync curve takes to reach it
                              over the seconds the async curve takes (curves are the seeds'
                              mean of a moving average over a tenth of the rounds)
``accuracy_per_group_ratio``  async over sync cumulative accuracy per group trained, with the
                              per-seed spread of the sync arm next to it

    PYTHONPATH=$PWD python bench/async_node.py --quick      # ~10 min on 2 cores
    PYTHONPATH=$PWD python bench/async_node.py --rounds 1000 --seeds 0,1,2
    PYTHONPATH=$PWD python bench/async_node.py --quick --long-tail   # partial rollouts

``--long-tail``: APRIL's partial rollouts (``engine.partial_rollouts = 2``) against whole-batch
generation, both at eta 1, with ``max_new_tokens = 32`` so the embedded model's answers have
a long tail of lengths (most end within 8 tokens, ~7 % run to the cap). Measured: rollout
throughput (groups finished per second of generator time), groups trained/s, the share of
tokens that were resumed and the off-policy token share; writes ``async_node_long_tail_quick.json``.

writes ``bench/results/async_node{_quick}.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.report import moving_average  # noqa: E402 - after the path insert


def arms(etas: list[int]) -> list[tuple[str, int, str]]:
    """(name, staleness, stale_correction) per arm."""
    out = [("sync", 0, "decoupled")]
    out += [(f"async_eta{e}", e, "decoupled") for e in etas]
    out.append((f"naive_eta{max(etas)}", max(etas), "off"))
    return out


def run_one(staleness: int, correction: str, seed: int, rounds: int, base: Path, *,
            max_new_tokens: int | None = None, partial: float = 0.0) -> dict:
    """One node, ``rounds`` rounds; per-round times and measurements."""
    import shutil

    from node.bridge import LoopbackHub
    from node.learner import (EngineConfig, LearnerConfig, PolicyConfig, SapoConfig, TrainerConfig,
                              run_learner)
    from protocol import Identity

    data = Path(tempfile.mkdtemp(prefix="async-node-"))
    shutil.copytree(base, data / "base")
    config = LearnerConfig(data_dir=str(data), seed=seed, checkpoint_every=0,
                           policy=PolicyConfig(device="cpu"),
                           engine=EngineConfig(staleness=staleness, max_new_tokens=max_new_tokens,
                                               partial_rollouts=partial),
                           trainer=TrainerConfig(stale_correction=correction),
                           sapo=SapoConfig(external=0))
    times: list[float] = []
    report = run_learner(config, LoopbackHub().bridge(Identity.from_seed(bytes([seed % 256]) * 32)),
                         rounds=rounds, on_round=lambda rec: times.append(time.monotonic()))
    shutil.rmtree(data, ignore_errors=True)
    rs = report["rounds"]
    return {
        "t": [t - times[0] for t in times],
        "accuracy": [r["accuracy"] for r in rs],
        "groups": [r["local_used"] + r["external_used"] for r in rs],
        "dropped_stale": sum(r.get("dropped_stale", 0) for r in rs),
        "trainer_busy": [r.get("trainer_busy") for r in rs],
        "generator_busy": [r.get("generator_busy") for r in rs],
        "staleness": [r.get("local_staleness") for r in rs],
        "stale_masked": [r["train"].get("stale_masked") for r in rs],
        "stale_token_share": [r["train"].get("stale_token_share") for r in rs],
        "train_s": [r["seconds"].get("train", 0.0) for r in rs],
        "tokens": [r["tokens_generated"] for r in rs],
        "resumed_tokens": [r.get("resumed_tokens", 0) for r in rs],
        "generate_s": [r["seconds"].get("generate", r.get("generator_seconds") or 0.0) for r in rs],
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _first_time(t: list[float], curve: list[float], target: float) -> float | None:
    return next((ti for ti, c in zip(t, curve) if c >= target), None)


def summarize(runs: dict[str, list[dict]], rounds: int) -> dict:
    window = max(1, rounds // 10)
    per_arm: dict[str, dict] = {}
    for arm, rs in runs.items():
        gps = [(sum(r["groups"][5:]) / (r["t"][-1] - r["t"][4])) for r in rs]
        curves = [moving_average(r["accuracy"], window) for r in rs]
        mean_curve = [_mean([c[i] for c in curves]) for i in range(rounds)]
        mean_t = [_mean([r["t"][i] for r in rs]) for i in range(rounds)]
        busy = lambda key: _mean([_mean([x for x in r[key][5:] if x is not None]) for r in rs])  # noqa: E731
        per_arm[arm] = {
            "groups_per_s": gps, "mean_groups_per_s": _mean(gps),
            "groups_trained": [sum(r["groups"]) for r in rs],
            "cumulative_accuracy_per_group": [sum(r["accuracy"]) / max(1, sum(1 for g in r["groups"] if g))
                                              for r in rs],
            "final_accuracy": [_mean(r["accuracy"][-window:]) for r in rs],
            "trainer_busy": busy("trainer_busy"), "generator_busy": busy("generator_busy"),
            "trainer_idle": 1 - busy("trainer_busy"), "generator_idle": 1 - busy("generator_busy"),
            "staleness_mean": _mean([_mean([x for x in r["staleness"] if x is not None]) for r in rs]),
            "dropped_stale": [r["dropped_stale"] for r in rs],
            "stale_masked_mean": _mean([_mean([x for x in r["stale_masked"] if x is not None] or [0.0])
                                        for r in rs]),
            "offpolicy_token_share": _mean([_mean([x for x in r["stale_token_share"] if x is not None]
                                                  or [0.0]) for r in rs]),
            "curve_ma": mean_curve, "curve_t": mean_t, "wall_s": [r["t"][-1] for r in rs],
            # per round, after the first 5: the trainer's seconds, and the generator's (sync:
            # on all cores; async: on its own share of them, while the trainer ran)
            "train_s_mean": _mean([_mean(r["train_s"][5:]) for r in rs]),
            "generate_s_mean": _mean([_mean(r["generate_s"][5:]) for r in rs]),
        }
    sync = per_arm["sync"]
    target = _mean(sync["final_accuracy"])
    t_sync = _first_time(sync["curve_t"], sync["curve_ma"], target)
    for arm, a in per_arm.items():
        a["speedup_groups_per_s"] = a["mean_groups_per_s"] / sync["mean_groups_per_s"]
        t_arm = _first_time(a["curve_t"], a["curve_ma"], target)
        a["time_to_sync_final_accuracy_s"] = t_arm
        # the crossing of the final value is where the curves are flattest (noisiest): the
        # times to fractions of it say whether a speed-up holds along the whole curve
        a["time_to_fraction_of_target_s"] = {
            str(f): _first_time(a["curve_t"], a["curve_ma"], f * target) for f in (0.5, 0.75, 0.9, 1.0)}
        a["speedup_time_to_accuracy"] = (t_sync / t_arm) if t_arm and t_sync else None
        a["accuracy_per_group_ratio"] = (_mean(a["cumulative_accuracy_per_group"])
                                         / _mean(sync["cumulative_accuracy_per_group"]))
    return {"target_accuracy": target, "sync_time_to_target_s": t_sync, "per_arm": per_arm}


LONG_TAIL_MAX_NEW = 32
"""The embedded model's answers at this cap: most end within 8 tokens, ~7 % run to the cap."""


def long_tail(args: argparse.Namespace, seeds: list[int], base: Path, name: str, t0: float,
              load0: tuple[float, float, float]) -> None:
    """Partial rollouts (APRIL) against whole-batch generation, both at eta 1, on a long
    tail of completion lengths; the arms alternate per seed so load drifts hit both."""
    from bench.sapo_vs_isolated import provenance

    eta = args.long_tail_eta
    arms_lt = {"whole": 0.0, **{f"partial_{f:g}": f for f in args.partial}}
    runs: dict[str, list[dict]] = {}
    for seed in seeds:
        for arm, partial in arms_lt.items():
            out = Path(tempfile.mkstemp(suffix=".json")[1])
            subprocess.run([sys.executable, __file__, "--job", str(eta), "decoupled", str(seed), str(out),
                            str(LONG_TAIL_MAX_NEW), str(partial), "--base", str(base),
                            "--rounds", str(args.rounds)], check=True)
            runs.setdefault(arm, []).append(json.loads(out.read_text()))
            out.unlink()
            r = runs[arm][-1]
            print(f"{arm:12s} seed {seed}: {sum(r['groups'][5:]) / sum(r['generate_s'][5:]):6.1f} groups per "
                  f"generator-second, {sum(r['groups'][5:]) / (r['t'][-1] - r['t'][4]):6.1f} groups/s", flush=True)
    per_arm = {}
    for arm, rs in runs.items():
        per_arm[arm] = {
            "rollout_throughput": [sum(r["groups"][5:]) / sum(r["generate_s"][5:]) for r in rs],
            "groups_per_s": [sum(r["groups"][5:]) / (r["t"][-1] - r["t"][4]) for r in rs],
            "tokens_per_group": [sum(r["tokens"]) / max(1, sum(r["groups"])) for r in rs],
            "resumed_tokens_per_round": [_mean(r["resumed_tokens"]) for r in rs],
            "offpolicy_token_share": [_mean([x for x in r["stale_token_share"] if x is not None] or [0.0])
                                      for r in rs],
            "staleness_max": max(max((x for x in r["staleness"] if x is not None), default=0) for r in rs),
            "dropped_stale": [r["dropped_stale"] for r in rs],
            "accuracy_per_round": [_mean(r["accuracy"]) for r in rs],
        }
    whole = per_arm["whole"]
    for a in per_arm.values():
        a["rollout_throughput_gain_per_seed"] = [p / w for p, w in zip(a["rollout_throughput"],
                                                                      whole["rollout_throughput"])]
        a["groups_per_s_gain"] = _mean(a["groups_per_s"]) / _mean(whole["groups_per_s"])
    best = max(per_arm, key=lambda a: _mean(per_arm[a]["rollout_throughput_gain_per_seed"]))
    result = {
        "seeds": seeds, "rounds": args.rounds, "max_new_tokens": LONG_TAIL_MAX_NEW, "eta": eta,
        "partial_rollouts": arms_lt[best], "best_arm": best,
        "rollout_throughput_gain": _mean(per_arm[best]["rollout_throughput_gain_per_seed"]),
        "groups_per_s_gain": per_arm[best]["groups_per_s_gain"],
        "per_arm": per_arm, "wall_seconds": time.monotonic() - t0,
        "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()), **provenance(base),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_arm", "machine", "torch")}, indent=1))
    for arm, a in per_arm.items():
        print(arm, {k: (round(_mean(v), 4) if isinstance(v, list) else v) for k, v in a.items()})


def plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, (arm, a) in enumerate(summary["per_arm"].items()):
        groups = [8 * (i + 1) for i in range(len(a["curve_ma"]))]
        style = "--" if arm.startswith("naive") else "-"
        ax1.plot(groups, a["curve_ma"], style, color=f"C{k}", label=arm)
        ax2.plot(a["curve_t"], a["curve_ma"], style, color=f"C{k}",
                 label=f"{arm} ({a['mean_groups_per_s']:.0f} groups/s)")
    for ax in (ax1, ax2):
        ax.axhline(summary["target_accuracy"], color="grey", lw=0.5)
        ax.set_ylabel("accuracy of own samples (moving average, seeds' mean)")
        ax.legend(fontsize=8)
    ax1.set_xlabel("groups generated (rounds x 8)")
    ax2.set_xlabel("seconds")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 rounds, seeds 0,1,2, eta 1,2,4")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--etas", default="1,2,4")
    ap.add_argument("--name", default=None)
    ap.add_argument("--long-tail", action="store_true",
                    help="partial rollouts instead: eta 1 with max_new_tokens 32 (a long tail of "
                         "completion lengths), without and with partial_rollouts = 2")
    ap.add_argument("--long-tail-eta", type=int, default=2,
                    help="--long-tail: the staleness bound (a resumed group is at least 2 versions old)")
    ap.add_argument("--partial", type=lambda v: [float(x) for x in v.split(",")], default=[1.0, 2.0],
                    help="--long-tail: the partial_rollouts factors to compare with whole batches")
    ap.add_argument("--job", nargs=6, metavar=("STALENESS", "CORRECTION", "SEED", "OUT", "MAX_NEW", "PARTIAL"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        staleness, correction, seed, out, max_new, partial = args.job
        result = run_one(int(staleness), correction, int(seed), args.rounds, Path(args.base),
                         max_new_tokens=int(max_new) or None, partial=float(partial))
        Path(out).write_text(json.dumps(result))
        return
    if args.quick:
        args.rounds = 150 if args.long_tail else 300
    seeds = [int(s) for s in args.seeds.split(",")]
    etas = [int(e) for e in args.etas.split(",")]
    name = args.name or ("async_node_quick" if args.quick else "async_node")

    from bench.sapo_vs_isolated import provenance
    from node.learner.tiny_model import ensure_embedded

    base = ensure_embedded(Path(tempfile.mkdtemp(prefix="async-base-")) / "base")
    t0, load0 = time.monotonic(), os.getloadavg()
    runs: dict[str, list[dict]] = {}
    if args.long_tail:
        long_tail(args, seeds, base, name.replace("async_node", "async_node_long_tail"), t0, load0)
        return
    for arm, staleness, correction in arms(etas):
        for seed in seeds:
            out = Path(tempfile.mkstemp(suffix=".json")[1])
            t = time.monotonic()
            subprocess.run([sys.executable, __file__, "--job", str(staleness), correction, str(seed),
                            str(out), "0", "0", "--base", str(base), "--rounds", str(args.rounds)],
                           check=True)
            runs.setdefault(arm, []).append(json.loads(out.read_text()))
            out.unlink()
            r = runs[arm][-1]
            print(f"{arm:12s} seed {seed}: {sum(r['groups'][5:]) / (r['t'][-1] - r['t'][4]):6.1f} groups/s, "
                  f"final accuracy {_mean(r['accuracy'][-max(1, args.rounds // 10):]):.3f}, "
                  f"{time.monotonic() - t:.0f} s", flush=True)
    summary = summarize(runs, args.rounds)
    best = max((a for a in summary["per_arm"] if a.startswith("async")),
               key=lambda a: summary["per_arm"][a]["speedup_time_to_accuracy"] or 0)
    b = summary["per_arm"][best]
    result = {
        "eta": int(best.removeprefix("async_eta")), "seeds": seeds, "rounds": args.rounds,
        "speedup_groups_per_s": b["speedup_groups_per_s"],
        "speedup_time_to_accuracy": b["speedup_time_to_accuracy"],
        "accuracy_per_group_ratio": b["accuracy_per_group_ratio"],
        "sync_accuracy_per_group_spread": [min(summary["per_arm"]["sync"]["cumulative_accuracy_per_group"]),
                                           max(summary["per_arm"]["sync"]["cumulative_accuracy_per_group"])],
        **summary, "wall_seconds": time.monotonic() - t0,
        "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()),
        **provenance(base),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    plot(summary, RESULTS / f"{name}.png",
         f"one node, embedded model, letter_sort, {args.rounds} rounds, seeds {seeds}")
    for arm, a in summary["per_arm"].items():
        print(f"{arm:12s} groups/s x{a['speedup_groups_per_s']:.2f}  time-to-acc x"
              f"{a['speedup_time_to_accuracy'] or float('nan'):.2f}  acc/group x{a['accuracy_per_group_ratio']:.2f}"
              f"  trainer idle {a['trainer_idle']:.2f} generator idle {a['generator_idle']:.2f}"
              f"  staleness {a['staleness_mean']:.2f} dropped {sum(a['dropped_stale'])}")
    print(f"wrote {RESULTS / name}.json (load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
