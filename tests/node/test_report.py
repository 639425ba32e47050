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
