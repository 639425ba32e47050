"""Assertions shared by the adversary tests (each names what it compares)."""

from __future__ import annotations

from typing import Any

from tests.adversary.expect import max_round_seconds, mean_reward, reward_margin

__all__ = ["assert_completed_in_bounded_time", "assert_reward_within_noise", "assert_rss_bounded"]

RSS_FACTOR = 1.5
"""A learner under attack may use at most this multiple of its baseline peak RSS."""


def assert_completed_in_bounded_time(run: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Every honest node ran all its rounds and exited 0; no round took more than
    max(3 x, +10 s) the slowest baseline round of that node (baseline rounds take 0.4-1.8 s
    on a loaded 2-core box; main took 40-120 s under the CPU bomb)."""
    assert not run["timed_out"], "the honest nodes did not finish in time"
    rounds = run["plan"]["rounds"]
    for name, node in run["nodes"].items():
        assert node["exit_code"] == 0, (name, node["report"].get("log"))
        assert len(node["report"]["rounds"]) == rounds, name
        base = max_round_seconds(baseline, name)
        got = max_round_seconds(run, name)
        assert got <= max(3 * base, base + 10.0), (name, f"slowest round {got:.1f} s, "
                                                        f"baseline {base:.1f} s")


def assert_rss_bounded(run: dict[str, Any], baseline: dict[str, Any]) -> None:
    for name, node in run["nodes"].items():
        base = baseline["nodes"][name]["learner_peak_rss_mb"]
        assert base > 0 and node["learner_peak_rss_mb"] > 0, "RSS was not sampled"
        assert node["learner_peak_rss_mb"] <= RSS_FACTOR * base, (
            name, f"learner peak RSS {node['learner_peak_rss_mb']:.0f} MiB, "
                  f"baseline {base:.0f} MiB")


def assert_reward_within_noise(run: dict[str, Any], baseline: dict[str, Any]) -> None:
    got, base, margin = mean_reward(run), mean_reward(baseline), reward_margin(baseline)
    assert got >= base - margin, (f"honest mean reward {got:.3f} under attack vs "
                                  f"{base:.3f} without (margin {margin:.3f})")
