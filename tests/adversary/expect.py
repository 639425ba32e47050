"""What the adversary tests read from a run, in one place: counter names and bounds.

Report fields used (node report, DESIGN.md contract plus): per round ``mean_reward``,
``seconds`` (phase -> s), ``rejected_by_reason`` (learner, this round) and
``gossip_rejected`` (swarm process, running totals); per outer step ``step``,
``param_hash`` and the rejected-commit counter read by ``rejected_commits``. If a defence
names a counter differently, change it here only.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

__all__ = ["FAMILY_REASONS", "GROUP_SIZE_REASONS", "PUBSUB_SIGNATURE_REASONS",
           "UNKNOWN_KEY_REASONS", "gossip_rejections", "learner_rejections", "mean_reward",
           "reward_margin", "rejected_commits", "steered_fraction"]

FAMILY_REASONS = ("unvetted_family", "foreign_family", "foreign_config")
"""Learner reasons for a rollout of a family/config the receiver does not train on
(the code-exec families, count_primes with max_n 2e7)."""
GROUP_SIZE_REASONS = ("group_size",)
"""Learner reason for a group whose size is not the receiver's completions per question."""
UNKNOWN_KEY_REASONS = ("unknown_fields", "oversized")
"""Swarm reasons for a message carrying an unbounded unknown key."""
PUBSUB_SIGNATURE_REASONS = ("bad_pubsub_signature",)
"""Swarm reason for a pubsub message whose signature does not verify (py-libp2p drops it
before our validator; the defence must count it)."""
MIN_REWARD_MARGIN = 0.03
"""Floor of the reward margin (absolute reward units); see ``reward_margin``. Tuples of
names above: the names a defence may reasonably use; trim them once the names are fixed."""


def rounds(run: dict[str, Any], node: str) -> list[dict[str, Any]]:
    return list(run["nodes"][node]["report"]["rounds"])


def mean_reward(run: dict[str, Any]) -> float:
    """Mean of the honest nodes' per-round mean rewards (their own generations)."""
    values = [r["mean_reward"] for node in run["nodes"] for r in rounds(run, node)]
    return sum(values) / len(values) if values else 0.0


def reward_margin(baseline: dict[str, Any]) -> float:
    """How far below the baseline's mean reward an attacked run may land and still be
    "within noise": 3 standard errors of the difference of two run means.

    The per-round noise is estimated from the baseline's round-to-round differences
    (std / √2 removes the learning trend that a plain std would count as noise), the
    standard error of one run's mean is that over √(rounds × nodes), and the difference of
    two independent runs has √2 times it. Rounds are not independent (one policy learns),
    so this is floored at MIN_REWARD_MARGIN: 2.5x the gap between two baseline runs of 30
    rounds that bench/adversary.py measured (0.149 vs 0.161)."""
    diffs, n = [], 0
    for node in baseline["nodes"]:
        values = [r["mean_reward"] for r in rounds(baseline, node)]
        diffs += [b - a for a, b in zip(values, values[1:])]
        n += len(values)
    if len(diffs) < 2 or n == 0:
        return MIN_REWARD_MARGIN
    sigma = statistics.pstdev(diffs) / math.sqrt(2)
    return max(MIN_REWARD_MARGIN, 3 * math.sqrt(2) * sigma / math.sqrt(n))


def learner_rejections(run: dict[str, Any], node: str) -> Counter[str]:
    """Rollouts the node's learner rejected over the run, by reason."""
    total: Counter[str] = Counter()
    for r in rounds(run, node):
        total.update(r.get("rejected_by_reason") or {})
    return total


def gossip_rejections(run: dict[str, Any], node: str) -> Counter[str]:
    """Messages the node's swarm process rejected (running totals at its last round)."""
    last: dict[str, int] = {}
    for r in rounds(run, node):
        last = r.get("gossip_rejected") or last
    return Counter(last)


def rejected_commits(run: dict[str, Any], node: str) -> int:
    """Outer-step commits the node refused (e.g. not extending its lineage), as its outer
    step records count them (``rejected_commits_total``: running totals by reason)."""
    return max((sum((o.get("rejected_commits_total") or {}).values()) for o in
                run["nodes"][node]["report"]["outer_steps"]), default=0)


def max_round_seconds(run: dict[str, Any], node: str) -> float:
    return max((sum(r["seconds"].values()) for r in rounds(run, node)), default=0.0)


def steered_fraction(run: dict[str, Any], attack: str, *, last: int) -> float:
    """Fraction of the honest nodes' completions in their ``last`` rounds that were the
    steered answer, as the attacker's observing host saw them on gossip."""
    observed = run["attackers"][attack].get("observed", {})
    honest = {node["peer_id"] for node in run["nodes"].values()} & set(observed)
    total = steered = 0
    for sender in honest:
        by_round = sorted(observed[sender].items(), key=lambda kv: int(kv[0]))[-last:]
        total += sum(c[0] for _, c in by_round)
        steered += sum(c[1] for _, c in by_round)
    return steered / total if total else 0.0
