"""A farm of fresh identities against three honest nodes' feeds (issue 32), next to a
no-attack run.

Same swarm as tests/adversary (tests/adversary/harness.py: a bootstrap and fixed honest
``join`` nodes on 127.0.0.1), with three honest nodes in feeds mode (the default), and one
hostile process holding ``--identities`` keys announced like honest peers
(tests/adversary/feeds.py) that serve feeds: idle, with valid all-wrong groups, as a slow
trickle, or idle while minting a fresh key every ``--mint-s`` seconds.

    PYTHONPATH=$PWD python bench/feed_eclipse.py [--rounds 60] [--identities 20]
        [--variants none idle wrong trickle mint]

Writes bench/results/feed_eclipse.json: per run and honest node, external groups used per
round (only honest peers' groups can be used: the farm's carry no signal), rollouts received
per round from honest peers, and in the last round the open feeds by kind (``proven``: the
source delivered groups that passed our re-scoring; ``trial``: not yet) and feeds closed for
delivering nothing; the ratio of each variant's honest external groups to the no-attack
run's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from protocol import atomic_write_bytes
from tests.adversary.attacks import Attack
from tests.adversary.harness import Plan, honest_identity, run_swarm

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "idle": {"mode": "idle"},
    "wrong": {"mode": "wrong"},
    "trickle": {"mode": "trickle"},
    "mint": {"mode": "idle", "mint_every_s": 8.0},
}
log = logging.getLogger("bench.feed_eclipse")


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Per honest node: what it got from honest peers, and its feeds at the end."""
    honest = {honest_identity(n).peer_id for n in run["nodes"]}
    nodes = {}
    for name, node in run["nodes"].items():
        rounds = node["report"]["rounds"]
        n = max(1, len(rounds))
        last = rounds[-1] if rounds else {}
        nodes[name] = {
            "rounds": len(rounds),
            "external_used_per_round": round(sum(r["external_used"] for r in rounds) / n, 3),
            "honest_senders_per_round": round(sum(
                len(set(r.get("rollouts_from", ())) & honest) for r in rounds) / n, 3),
            "rollouts_received_per_round": round(sum(
                r["rollouts_received"] for r in rounds) / n, 3),
            "feeds_at_end": last.get("feeds", {}),
            "mean_reward": round(sum(r["mean_reward"] for r in rounds) / n, 4),
        }
    used = [v["external_used_per_round"] for v in nodes.values()]
    return {"nodes": nodes, "external_used_per_round": round(sum(used) / max(1, len(used)), 3),
            "attacker": {k: v for k, v in run["attackers"].get("feed_sybil", {}).items()
                         if k in ("identities", "sent", "event")},
            "seconds": run["seconds"], "timed_out": run["timed_out"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--identities", type=int, default=20)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "feed_eclipse.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    runs: dict[str, Any] = {}
    for variant in args.variants:
        extra = VARIANTS[variant]
        attacks = () if extra is None else (
            (Attack.FEED_SYBIL, {**extra, "identities": args.identities}),)
        plan = Plan(rounds=args.rounds, attacks=attacks, honest=3, rollout_mode="feeds",
                    every_rounds=10**6, timeout_s=args.timeout_s)
        t = time.monotonic()
        runs[variant] = summarize(run_swarm(plan))
        log.info("%s: %.0f s, external used/round %.2f", variant, time.monotonic() - t,
                 runs[variant]["external_used_per_round"])
    base = runs.get("none", {}).get("external_used_per_round")
    for r in runs.values():
        r["ratio_to_none"] = round(r["external_used_per_round"] / base, 3) if base else None
    out = {"rounds": args.rounds, "identities": args.identities, "runs": runs,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "load_at_end": os.getloadavg()[0]}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, (json.dumps(out, indent=1) + "\n").encode())
    print(json.dumps({k: {"ratio": v["ratio_to_none"], "used": v["external_used_per_round"]}
                      for k, v in runs.items()}))


if __name__ == "__main__":
    main()
