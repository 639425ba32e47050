"""Each hostile peer of issue 11 alone against two honest nodes, next to no-attack baselines.

Same swarm as tests/adversary (a bootstrap and two honest `join` nodes on 127.0.0.1 with
fixed identities and seeds, tests/adversary/harness.py), more rounds. Two baseline runs
measure the run-to-run noise of the honest mean reward; then one run per attack.

    PYTHONPATH=$PWD python bench/adversary.py [--rounds 30] [--attacks steering sybil ...]
        [--set cpu_bomb.specs=16 ...]

Writes bench/results/adversary.json: per run the honest nodes' mean reward (and its
difference to the mean of the baselines), mean reward of the last 5 rounds, whether a code
marker appeared, learner peak RSS, slowest round, swarm/learner CPU seconds, outer steps,
rejections by reason (learner per round, summed; swarm running totals), what the attacker
sent and, for the steering attacks, the fraction of honest completions that said "9999" in
the second half of the run (as a silent observing peer saw them on gossip).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from protocol import atomic_write_bytes
from tests.adversary.attacks import Attack
from tests.adversary.expect import (
    gossip_rejections,
    learner_rejections,
    max_round_seconds,
    mean_reward,
    rejected_commits,
    steered_fraction,
)
from tests.adversary.harness import Plan, run_swarm

RESULTS = Path(__file__).resolve().parent / "results"
STEERING = (Attack.STEERING, Attack.SYBIL)
"""Attacks whose runs get a silent observer (the hijack measure)."""
log = logging.getLogger("bench.adversary")


def summarize(run: dict[str, Any], label: str, baseline_reward: float | None) -> dict[str, Any]:
    """The numbers of one run, per honest node and overall."""
    reward = mean_reward(run)
    nodes = {}
    for name, node in run["nodes"].items():
        rounds = node["report"]["rounds"]
        last = rounds[-5:]
        nodes[name] = {
            "rounds": len(rounds),
            "mean_reward": sum(r["mean_reward"] for r in rounds) / max(1, len(rounds)),
            "mean_reward_last5": sum(r["mean_reward"] for r in last) / max(1, len(last)),
            "learner_peak_rss_mb": round(node["learner_peak_rss_mb"], 1),
            "swarm_cpu_s": round(node["swarm_cpu_s"], 2),
            "learner_cpu_s": round(node["learner_cpu_s"], 2),
            "max_round_s": round(max_round_seconds(run, name), 2),
            "rejected_by_reason": dict(learner_rejections(run, name)),
            "gossip_rejected": dict(gossip_rejections(run, name)),
            "rejected_commits": rejected_commits(run, name),
            "outer_steps": [(o["step"], o["status"], o["peers"], o["param_hash"][:12])
                            for o in node["report"]["outer_steps"]],
            "exit_code": node["exit_code"],
        }
    out = {"label": label, "attacks": run["plan"]["attacks"], "seconds": run["seconds"],
           "timed_out": run["timed_out"], "honest_mean_reward": round(reward, 4),
           "marker_present": bool(run["markers"]), "markers": len(run["markers"]),
           "nodes": nodes,
           "attackers": {k: {"sent": v.get("sent"), "event": v.get("event"),
                             "state_hash": v.get("state_hash")}
                         for k, v in run["attackers"].items()}}
    if baseline_reward is not None:
        out["reward_vs_baseline"] = round(reward - baseline_reward, 4)
    if Attack.OBSERVE.value in run["attackers"]:
        out["steered_fraction_last_half"] = round(
            steered_fraction(run, Attack.OBSERVE.value, last=run["plan"]["rounds"] // 2), 4)
    return out


def _overrides(pairs: list[str]) -> dict[Attack, dict[str, Any]]:
    out: dict[Attack, dict[str, Any]] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        attack, _, field = key.partition(".")
        out.setdefault(Attack(attack), {})[field] = json.loads(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--every-rounds", type=int, default=10)
    ap.add_argument("--baselines", type=int, default=2)
    attacks = [a.value for a in Attack if a is not Attack.OBSERVE]
    ap.add_argument("--attacks", nargs="*", default=attacks, choices=attacks)
    ap.add_argument("--set", nargs="*", default=[], metavar="ATTACK.FIELD=JSON",
                    help="override an attack's parameter, e.g. cpu_bomb.specs=16")
    ap.add_argument("--timeout-s", type=float, default=420.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "adversary.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    overrides = _overrides(args.set)

    def plan(attacks: tuple[tuple[Attack, dict[str, Any]], ...]) -> Plan:
        return Plan(rounds=args.rounds, every_rounds=args.every_rounds,
                    timeout_s=args.timeout_s, attacks=attacks)

    runs: list[dict[str, Any]] = []
    baselines = []
    for i in range(args.baselines):
        run = run_swarm(plan(()))
        baselines.append(mean_reward(run))
        runs.append(summarize(run, f"baseline-{i}", None))
        log.info("baseline %d: honest mean reward %.4f", i, baselines[-1])
    base = sum(baselines) / len(baselines) if baselines else None
    for name in args.attacks:
        attack = Attack(name)
        started = time.monotonic()
        observe = ((Attack.OBSERVE, {}),) if attack in STEERING else ()
        run = run_swarm(plan(((attack, overrides.get(attack, {})), *observe)))
        runs.append(summarize(run, name, base))
        log.info("%s: reward %.4f (baseline %s), markers %d, %.0f s", name, mean_reward(run),
                 f"{base:.4f}" if base is not None else "-", len(run["markers"]),
                 time.monotonic() - started)
    result = {"rounds": args.rounds, "every_rounds": args.every_rounds,
              "baseline_rewards": baselines,
              "baseline_gap": (max(baselines) - min(baselines)) if baselines else None,
              "overrides": {a.value: v for a, v in overrides.items()}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, json.dumps(result, indent=1).encode())
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
