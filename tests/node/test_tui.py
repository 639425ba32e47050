"""The terminal view (node/tui.py): one table, never taller than the terminal, logs off-screen."""

from __future__ import annotations

import io
import logging
import time

import pytest
from rich.console import Console

from node.status import StatusBoard
from node.tui import TerminalView, render, sparkline
from protocol.events import Checkpoint, Phase
from protocol.records import RoundRecord, Status, StepRecord


def _state(tmp_path):
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.set(phase="training", peer_id="12D3KooW" + "x" * 44, model="f" * 64,
              children={"swarm": {"alive": True, "restarts": 0},
                        "learner": {"alive": True, "restarts": 1}})
    for r in range(5):
        board.on_round(RoundRecord.from_dict({"round": r, "mean_reward": r / 10, "accuracy": 0.1, "rollouts_published": 8,
                        "rollouts_received": 3, "external_used": 2, "rejected": 1,
                        "rejected_by_reason": {"prompt_mismatch": 1}, "peers": 2,
                        "gossip_rejected": {"bad_signature": 4}}))
    board.on_phase(Phase(phase="generate", done=3, total=6))
    board.on_outer(StepRecord(step=1, status=Status.OK, version=2, peers=3, bytes_sent=1_200_000,
                              seconds=4.1, param_hash="ab" * 32), 2)
    board.on_checkpoint(Checkpoint(round=5, path="ckpt", seconds=0.1))
    board.flush()
    return board.state


def _draw(state, w, h, logs=()):
    console = Console(width=w, height=h, record=True, file=io.StringIO(), color_system=None)
    console.print(render(state, width=w, height=h, log_lines=list(logs), log_path="/d/node.log"))
    return console.export_text().rstrip("\n").splitlines()


def test_a_tiny_terminal_still_gets_one_table_that_fits(tmp_path):
    lines = _draw(_state(tmp_path), 30, 6)
    assert len(lines) <= 6 and "\n".join(lines).count("╭") == 1
    assert "round" in "\n".join(lines)                # the rows that matter most come first


@pytest.mark.parametrize("w,h", [(80, 24), (160, 40), (100, 16), (50, 12)])
def test_one_table_that_fits_the_terminal(tmp_path, w, h):
    lines = _draw(_state(tmp_path), w, h, logs=[f"log line {i}" for i in range(100)])
    text = "\n".join(lines)
    assert len(lines) <= h and all(len(line) <= w for line in lines)
    assert text.count("╭") == 1 and text.count("╰") == 1 and text.count("swarm-node ·") == 1
    assert "│ round      │ 4 · " in text
    assert "generate" in text and "3/6" in text
    assert "reachability unknown" in text
    assert "prompt_mismatch 5" in text


def test_full_layout_shows_rows_and_newest_logs_compact_drops_them(tmp_path):
    state = _state(tmp_path)
    full = "\n".join(_draw(state, 160, 40, logs=[f"2026-01-01 10:00:0{i},123 INFO x: line {i}"
                                                 for i in range(10)]))
    assert "10:00:09 INFO x: line 9" in full and "2026-01-01" not in full
    assert "after round 4" in full and "2 steps · last #1 ok: 3 peers, 1.2 MB, 4.1 s" in full
    assert "bad_signature 4" in full
    assert "out 40 · in 15 · used 10" in full
    compact = "\n".join(_draw(state, 60, 14, logs=["line"]))
    assert "checkpoint" not in compact and "line" not in compact.split("╰")[0].split("outer")[-1]


def test_sparkline_scales_to_its_range():
    assert sparkline([0.0, 0.5, 1.0], 10) == "▁▄█"
    assert sparkline([0.3, 0.3], 10) == "▁▁"
    assert sparkline(list(range(100)), 5) == "▁▂▄▆█"
    assert sparkline([], 5) == ""


def test_the_view_routes_logs_to_the_file_and_restores_handlers(tmp_path):
    root = logging.getLogger()
    before = list(root.handlers)
    screen = io.StringIO()
    view = TerminalView(tmp_path / "node.log", console=Console(file=screen, width=80,
                                                                height=24, force_terminal=True))
    view.start()
    try:
        logging.getLogger("node.test").warning("supervisor says hi")
        view.child_line("learner", "2026-01-01 10:00:00,000 ERROR learner x: child broke")
        view.update({"phase": "training", "round": 3, "started": time.time()})
    finally:
        view.close()
    assert root.handlers == before
    logged = (tmp_path / "node.log").read_text()
    assert "supervisor says hi" in logged and "child broke" in logged
    out = screen.getvalue()
    assert "\x1b[?1049h" in out and "\x1b[?1049l" in out  # the alternate screen, given back
    after = out.split("\x1b[?1049l")[-1]                  # the exit summary, on the normal screen
    assert "child broke" in after and "supervisor says hi" in after
    assert str(tmp_path / "node.log") in after.replace("\n", "")
    assert "round 3" in out


def test_the_outer_step_shows_its_stage(tmp_path):
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.set(phase="training", peer_id="12D3KooW" + "x" * 44, model="f" * 64, children={})
    board.on_phase(Phase(phase="outer", stage="rendezvous"))
    since = board.state["round_phase"]["since"]
    board.on_phase(Phase(phase="outer", stage="exchange\x1b[2J"))
    assert board.state["round_phase"]["since"] == since  # one phase: elapsed counts on
    text = "\n".join(_draw(board.state, 120, 30))
    assert "outer step (DiLoCo) · exchange[2J" in text and "\x1b" not in text


def test_the_reward_row_shows_the_newest_heldout_score(tmp_path):
    state = _state(tmp_path)
    assert "held-out" not in "\n".join(_draw(state, 160, 40))
    state["heldout"] = {"after_rounds": 10, "greedy_accuracy": 0.625, "sampled_accuracy": 0.5}
    assert "accuracy 0.10 · held-out 0.62/0.50@10" in "\n".join(_draw(state, 160, 40))


def test_the_feeds_row_shows_sources_by_kind_and_warns_of_idle_slots(tmp_path):
    state = _state(tmp_path)
    assert "│ feeds" not in "\n".join(_draw(state, 160, 40))  # flood mode: no row
    state["feeds"] = {"proven": 2, "live": 1, "trial": 1, "idle": 0, "dropped_idle": 4,
                      "dropped_no_signal": 0, "idle_slot_rounds": 9}
    text = "\n".join(_draw(state, 200, 40))
    assert "│ feeds      │ 2 proven · 1 live · 1 on trial · 0 idle now · dropped 4 idle" in text
    state["feeds"] = {**state["feeds"], "proven": 0, "live": 1, "trial": 3, "idle": 3}
    assert "│ feeds      │ most feed slots are held by sources that deliver nothing" in \
        "\n".join(_draw(state, 200, 40))
    small = _draw(state, 80, 24)
    assert len(small) <= 24 and "│ checkpoint" in "\n".join(small)  # the full layout still fits


def test_the_outer_row_says_which_peers_were_held_off(tmp_path):
    """Issue 32: an attack on the outer step is visible (collectives/leader.py's blames)."""
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.set(phase="training", peer_id="12D3KooW" + "x" * 44, model="f" * 64, children={})
    rec = StepRecord(step=4, status=Status.OK, version=5, param_hash="ab" * 32, peers=3,
                     observed={"blames_total": {"leader_stalled": 1, "no_show": 2}})
    board.on_outer(rec, 5)
    text = "\n".join(_draw(board.state, 200, 40))
    assert "held off: 1 stalled leader · 2 no-shows" in text
    board.on_outer(StepRecord(step=5, status=Status.OK, version=6, param_hash="cd" * 32), 6)
    assert "held off" not in "\n".join(_draw(board.state, 200, 40))


def test_the_peers_row_counts_direct_and_relayed_links_and_names_the_relayed(tmp_path):
    """Issue 33: a volunteer behind NAT sees which peers it reaches only through a relay."""
    state = _state(tmp_path)
    assert "direct" not in "\n".join(_draw(state, 200, 40))  # not reported yet: not shown
    relayed = "12D3KooWrelayed" + "x" * 37
    state["links"] = {"direct": 2, "relayed": 1,
                      "peers": {relayed: "relayed", "a": "direct", "b": "direct"}}
    text = "\n".join(_draw(state, 200, 40))
    assert "│ peers      │ 2 · 2 direct · 1 relayed (12D3KooWrela…) · reachability unknown" \
        in text, text
    assert "│ 2 · 2 direct · 1 relayed · reachability" in "\n".join(_draw(state, 200, 16))  # compact


def test_the_compute_row_shows_busy_fractions_and_staleness(tmp_path):
    state = _state(tmp_path)
    assert "│ compute    │ -" in "\n".join(_draw(state, 160, 40))   # no round measured it yet
    state["compute"] = {"generator_busy": 0.9, "trainer_busy": 0.75, "staleness": 1,
                        "dropped_stale_total": 3}
    text = "\n".join(_draw(state, 160, 40))
    assert "│ compute    │ generator 90% busy · trainer 75% busy · staleness 1 · dropped stale 3" in text
    small = _draw(state, 80, 24)
    assert len(small) <= 24 and "│ checkpoint" in "\n".join(small)
