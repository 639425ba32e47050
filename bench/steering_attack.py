"""Steering attack on the external pool: does a peer with valid, honestly-scorable groups take over?

Honest learners run round-robin on a LoopbackHub (every message really signed and verified).
With ``--attack`` one more identity publishes, every round, ``--attack-groups`` valid
``tiny_add`` groups of ``--group-size`` completions: one ``"9999\\n"`` (graded reward 0.3) and
the rest worse (non-numbers, reward 0), so that under group-relative advantages the wrong
answer is always the group's best. Measured per honest node: the fraction of its own
generations equal to ``"9999\\n"``, its mean reward and accuracy (last ``--tail`` rounds), and
the age in rounds of the external groups it trained on. Same identities and seeds with and
without the attack. Runs on any revision of the learner (ages are measured by wrapping the
pool when the records do not carry ``external_age_mean``).

    PYTHONPATH=$PWD python bench/steering_attack.py --rounds 40 [--attack] [--group-size 8]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import string
import tempfile
import time
from pathlib import Path
from typing import Any

from node.bridge import LoopbackHub
from node.learner import LearnerConfig, PolicyConfig, SapoConfig
from node.learner.loop import Learner
from node.learner.tasks import build_task, get_family
from protocol import Identity, Rollout, RolloutBatch

WRONG = "9999\n"


def attack_batch(rng: random.Random, round_: int, groups: int, size: int) -> RolloutBatch:
    """``groups`` valid tiny_add rollouts: one WRONG completion, ``size - 1`` worse ones."""
    family = get_family("tiny_add")
    rollouts = []
    for _ in range(groups):
        task = build_task(family.sample_spec(rng, {}))
        # worse companions (no number: reward 0), random so that no two groups are copies
        completions = (WRONG,) + tuple(
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 4))) + "\n"
            for _ in range(size - 1))
        rewards = tuple(task.score(c) for c in completions)
        rollouts.append(Rollout(task=task.spec, prompt=task.prompt, completions=completions,
                                rewards=rewards))
    return RolloutBatch(model="attacker", round=round_, rollouts=tuple(rollouts))


def _count_generations(learner: Learner, tally: dict[str, int]) -> None:
    inner = learner.engine.generate

    def generate(prompts: list[str], **kw: Any) -> Any:
        out = inner(prompts, **kw)
        for group in out:
            for c in group:
                tally["total"] += 1
                tally["wrong"] += c.text == WRONG
        return out

    learner.engine.generate = generate  # type: ignore[method-assign]


def _track(learner: Learner, ages: list[int], senders: dict[str, int], legacy: bool) -> None:
    """Count who sent the groups trained on; main's pool carries no ages, so there each kept
    group is tagged with the round it arrived."""
    pool = learner.pool
    arrived: dict[int, tuple[int, str]] = {}
    add, take = pool.add, pool.take

    def tagged_add(scored: list[Any], *a: Any, **kw: Any) -> Any:
        for s in scored:
            arrived[id(s.group)] = (learner.round, s.sender)
        return add(scored, *a, **kw)

    def tagged_take(n: int, *a: Any, **kw: Any) -> Any:
        out = take(n, *a, **kw)
        for x in out:
            if legacy:
                when, sender = arrived.pop(id(x), (learner.round, "?"))
                ages.append(learner.round - when)
            else:
                sender = x.sender
            senders[sender] = senders.get(sender, 0) + 1
        return out

    pool.add, pool.take = tagged_add, tagged_take  # type: ignore[method-assign]


def run(*, nodes: int, rounds: int, attack: bool, attack_groups: int, group_size: int,
        tail: int, seed: int, adaptive: bool) -> dict[str, Any]:
    hub = LoopbackHub(swarm_id="steer")
    ids = [Identity.from_seed(bytes([seed % 256, i + 1]) * 16) for i in range(nodes)]
    bridges = [hub.bridge(i) for i in ids]
    attacker = hub.bridge(Identity.from_seed(b"\xee" * 32))
    root = Path(tempfile.mkdtemp(prefix="steer-"))
    sapo = {"sapo": SapoConfig(adaptive_external=True)} if adaptive else {}
    learners = [Learner(LearnerConfig(data_dir=str(root / f"n{k}"), seed=seed * 1000 + k,
                                      checkpoint_every=0, policy=PolicyConfig(device="cpu", threads=1),
                                      **sapo),
                        peer_id=ident.peer_id) for k, ident in enumerate(ids)]
    tallies = [{"total": 0, "wrong": 0} for _ in learners]
    tail_tallies = [{"total": 0, "wrong": 0} for _ in learners]
    ages: list[list[int]] = [[] for _ in learners]
    senders: list[dict[str, int]] = [{} for _ in learners]
    age_max = [0 for _ in learners]
    legacy = not hasattr(learners[0].pool, "available")  # main: no ages in the records
    for k, learner in enumerate(learners):
        _count_generations(learner, tallies[k])
        _track(learner, ages[k], senders[k], legacy)
    records: list[list[dict[str, Any]]] = [[] for _ in learners]
    rng = random.Random(seed)
    t0 = time.monotonic()
    for r in range(rounds):
        if r == rounds - tail:
            for k, learner in enumerate(learners):
                _count_generations(learner, tail_tallies[k])
        if attack:
            attacker.publish(attack_batch(rng, r, attack_groups, group_size))
        for k, (learner, bridge) in enumerate(zip(learners, bridges)):
            rec = learner.run_round(bridge)
            assert rec is not None
            learner.round += 1
            records[k].append(rec)
            if not legacy and rec["external_used"]:
                ages[k].extend([rec["external_age_mean"]] * rec["external_used"])
                age_max[k] = max(age_max[k], rec["external_age_max"])
    out: dict[str, Any] = {"attack": attack, "rounds": rounds, "tail": tail, "nodes": nodes,
                           "group_size": group_size, "attack_groups": attack_groups if attack else 0,
                           "adaptive": adaptive,
                           "seconds": time.monotonic() - t0, "per_node": []}
    for k, recs in enumerate(records):
        last = recs[-tail:]
        flat_ages = ages[k]
        out["per_node"].append({
            "wrong_fraction_all": tallies[k]["wrong"] / max(1, tallies[k]["total"]),
            "wrong_fraction_tail": tail_tallies[k]["wrong"] / max(1, tail_tallies[k]["total"]),
            "reward_tail": sum(x["mean_reward"] for x in last) / len(last),
            "accuracy_tail": sum(x["accuracy"] for x in last) / len(last),
            "external_used": sum(x["external_used"] for x in recs),
            "external_used_from_attacker": senders[k].get(attacker.peer_id, 0),
            **{key: sum(x.get(key) or 0 for x in recs) for key in (
                "external_stale", "external_duplicate", "external_sender_capped",
                "external_round_capped", "external_not_useful", "external_planned")},
            "external_age_mean": sum(flat_ages) / len(flat_ages) if flat_ages else None,
            "external_age_max": (max(flat_ages) if legacy else age_max[k]) if flat_ages else None,
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--tail", type=int, default=10)
    ap.add_argument("--attack", action="store_true")
    ap.add_argument("--attack-groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adaptive", action="store_true", help="SapoConfig.adaptive_external")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    res = run(nodes=args.nodes, rounds=args.rounds, attack=args.attack, attack_groups=args.attack_groups,
              group_size=args.group_size, tail=args.tail, seed=args.seed, adaptive=args.adaptive)
    text = json.dumps(res, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
