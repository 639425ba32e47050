"""node_report's derived fields."""

from __future__ import annotations

from node.report import discarded_rounds, node_report


def test_discarded_rounds_sums_the_running_totals_of_each_learner_run() -> None:
    steps = [{"discarded_rounds": 0}, {"discarded_rounds": 3}, {"discarded_rounds": 5},
             {"discarded_rounds": 1}, {}, {"discarded_rounds": 2}]  # restarted after 5
    assert discarded_rounds(steps) == 7
    assert discarded_rounds([]) == 0


def test_node_report_takes_the_last_rounds_utilisation() -> None:
    rounds = [{"round": 0, "compute_utilisation": 0.5}, {"round": 1, "compute_utilisation": 0.8},
              {"round": 2}]
    rep = node_report(peer_id="p", model="m", rounds=rounds, outer_steps=[])
    assert rep["compute_utilisation"] == 0.8 and rep["discarded_rounds"] == 0
    assert node_report(peer_id="p", model="m", rounds=[], outer_steps=[])[
        "compute_utilisation"] is None


def _png_width(path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # IHDR width


def test_the_report_lists_heldout_scores_and_the_png_plots_them_beside_training(tmp_path) -> None:
    from node.report import heldout_points, plot_rewards

    score = {"after_rounds": 2, "greedy_accuracy": 0.5, "sampled_accuracy": 0.25}
    rounds = [{"round": 0, "mean_reward": 0.1, "accuracy": 0.1},
              {"round": 1, "mean_reward": 0.2, "accuracy": 0.2, "heldout": score}]
    rep = node_report(peer_id="p", model="m", rounds=rounds, outer_steps=[])
    assert rep["heldout"] == [score] and heldout_points(rounds) == [(2, 0.5, 0.25)]
    plain, both = tmp_path / "plain.png", tmp_path / "both.png"
    plot_rewards([{"peer_id": "p", "rounds": rounds[:1]}], plain)
    plot_rewards([{"peer_id": "p", "rounds": rounds}], both)
    assert _png_width(plain) == 700 and _png_width(both) == 1200  # a second, accuracy panel


def test_learning_compares_the_first_and_last_tenth_and_the_heldout_ends() -> None:
    from node.local import _learned
    from node.report import learning, moving_average, smoothing_window

    rounds = [{"round": r, "accuracy": 0.0 if r < 10 else 0.5 if r < 90 else 1.0} for r in range(100)]
    rounds[9]["heldout"] = {"after_rounds": 10, "greedy_accuracy": 0.125}
    rounds[99]["heldout"] = {"after_rounds": 100, "greedy_accuracy": 0.375}
    summary = learning(rounds)
    assert summary == {"window": 10, "first": 0.0, "last": 1.0,
                       "heldout_first": {"after_rounds": 10, "greedy": 0.125},
                       "heldout_last": {"after_rounds": 100, "greedy": 0.375}}
    assert _learned(summary) == ("training accuracy 0.00 over its first 10 rounds -> 1.00 over its "
                                 "last 10; held-out greedy 0.12 after 10 rounds -> 0.38 after 100")
    assert learning([{"round": 0, "accuracy": 0.25}])["window"] == 1
    assert learning([{"round": 0}]) is None and _learned(None) == "no round scored"
    assert moving_average([0, 2, 4, 6], 2) == [0, 1, 3, 5]
    assert smoothing_window(19) == 1 and smoothing_window(150) == 10
