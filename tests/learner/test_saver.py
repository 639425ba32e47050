"""Checkpoint cadence by round and by time, written off the training path (node/learner/saver.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from node.learner.checkpoint import load_checkpoint, snapshot, write_snapshot
from node.learner.saver import CheckpointSaver


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(4, 4)


def _model_opt():
    torch.manual_seed(0)
    m = _Model()
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m.w.weight.sum().backward()
    opt.step()  # optimizer state exists
    return m, opt


def test_snapshot_is_isolated_from_later_training(tmp_path):
    m, opt = _model_opt()
    snap = snapshot(m, opt)
    before = m.w.weight.detach().clone()
    exp_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    with torch.no_grad():
        m.w.weight.add_(1.0)  # training goes on in place while the writer runs
    m.w.weight.sum().backward()
    opt.step()
    write_snapshot(tmp_path, snap, round=3, fingerprint="fp")
    m2, opt2 = _model_opt()
    ck = load_checkpoint(tmp_path, model=m2, optimizer=opt2, fingerprint="fp")
    assert ck is not None and ck.round == 3
    assert torch.equal(m2.w.weight, before)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], exp_avg)


def _saver(tmp_path, m, opt, *, write, every_rounds=0, every_s=0.0, saved_round=None):
    return CheckpointSaver(data_dir=tmp_path, model=m, optimizer=opt, fingerprint="fp",
                           every_rounds=every_rounds, every_s=every_s, keep=2,
                           saved_round=saved_round, write=write)


def test_background_write_does_not_block_and_one_write_at_a_time(tmp_path):
    m, opt = _model_opt()
    release = threading.Event()
    written: list[int] = []

    def slow_write(data_dir, snap, *, round, fingerprint, keep):  # noqa: A002
        release.wait(10)
        written.append(round)
        return write_snapshot(data_dir, snap, round=round, fingerprint=fingerprint, keep=keep)

    saver = _saver(tmp_path, m, opt, write=slow_write, every_rounds=1)
    t = time.monotonic()
    assert saver.after_round(1) is True          # started, returns while the disk is "slow"
    assert time.monotonic() - t < 2 and saver.busy and written == []
    assert saver.after_round(2) is False         # due, but the previous write is in flight
    release.set()
    saver.final(3)                               # waits for round 1, then saves 3 itself
    assert written == [1, 3]
    assert load_checkpoint(tmp_path, model=m, optimizer=opt, fingerprint="fp").round == 3


def test_time_cadence_and_round_cadence(tmp_path, monkeypatch):
    m, opt = _model_opt()
    clock = [1000.0]
    monkeypatch.setattr("node.learner.saver.time.monotonic", lambda: clock[0])
    saver = _saver(tmp_path, m, opt, write=lambda *a, **k: Path(), every_rounds=10, every_s=120)
    assert not saver.due(1)
    clock[0] += 119
    assert not saver.due(2)
    clock[0] += 2
    assert saver.due(3)                          # 121 s since the last save
    assert saver.after_round(3) and (saver.wait() is None)
    assert not saver.due(4)                      # the clock restarted at that save
    assert saver.due(10)                         # round cadence still applies
    assert not saver.due(3)                      # never the same round twice


def test_a_failed_background_write_is_raised_in_the_training_thread(tmp_path):
    m, opt = _model_opt()

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    saver = _saver(tmp_path, m, opt, write=full_disk, every_rounds=1)
    assert saver.after_round(1)
    saver.wait()
    with pytest.raises(OSError, match="No space"):
        saver.after_round(2)


_KILL_CHILD = """
import json, sys, time
from node.bridge import LoopbackHub
from node.learner import LearnerConfig, PolicyConfig, run_learner
from protocol import Identity
cfg = LearnerConfig(data_dir=sys.argv[1], policy=PolicyConfig(device="cpu", threads=1),
                    checkpoint_every=0, checkpoint_every_s=float(sys.argv[2]))
bridge = LoopbackHub().bridge(Identity.generate())
import threading
said = threading.Lock()  # on_ckpt runs on the saver's thread: one whole line at a time
def say(obj):
    with said:
        sys.stdout.write(json.dumps(obj) + "\\n")
        sys.stdout.flush()
def on_round(rec):
    say({"round": rec.round, "t": time.time()})
def on_ckpt(r, path, secs):
    say({"checkpoint": r, "t": time.time()})
run_learner(cfg, bridge, stop=threading.Event(), on_round=on_round, on_checkpoint=on_ckpt)
"""


@pytest.mark.slow
def test_kill_9_loses_at_most_the_work_since_the_last_timed_checkpoint(data_dir):
    """Round cadence off; checkpoints by time only. After kill -9 the newest checkpoint on disk
    holds every round finished more than (every_s + one round + one write) before the kill."""
    every_s = 2.0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(data_dir), str(every_s)],
                         stdout=subprocess.PIPE, stderr=None, env=env, text=True)
    rounds: dict[int, float] = {}
    ckpts: list[int] = []
    try:
        assert p.stdout is not None
        for line in p.stdout:
            ev = json.loads(line)
            if "round" in ev:
                rounds[ev["round"]] = ev["t"]
            else:
                ckpts.append(ev["checkpoint"])
            if len(ckpts) >= 2 and time.time() - min(rounds.values()) > 3 * every_s:
                break
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        p.stdout.close()  # type: ignore[union-attr]
    killed_at = time.time()
    assert len(ckpts) >= 2, "the child ended before two checkpoints (its stderr is above)"
    m_dir = Path(data_dir) / "checkpoints"
    newest = max(int(json.loads((d / "meta.json").read_text())["round"])
                 for d in m_dir.iterdir() if d.name.startswith("round-"))
    assert newest >= ckpts[-1]  # what was reported written is on disk
    # checkpoint k holds rounds 0..k-1: what finished after rounds[k-1] is the lost work
    lost_s = killed_at - rounds[newest - 1]
    times = sorted(rounds.values())
    longest_round = max(b - a for a, b in zip(times, times[1:]))
    print(f"rounds {len(rounds)}, checkpoints {ckpts}, lost {lost_s:.1f} s of work "
          f"(every_s {every_s}, longest round {longest_round:.1f} s)")
    assert lost_s <= every_s + 2 * longest_round + 5.0, (rounds, ckpts)


def test_final_saves_the_round_again_when_the_outer_state_moved_after_it(tmp_path):
    """The run's last outer steps come after its last round (OuterHook.finish): a node that
    adopted the swarm's last version there kept the state of the round before (fresh-clone
    run L: node-1's final checkpoint at version 0, the swarm ended at version 2)."""
    from collectives.state import OuterState

    m, opt = _model_opt()
    states = [OuterState(theta=torch.zeros(4), momentum=torch.zeros(4), applied=0)]
    saver = CheckpointSaver(data_dir=tmp_path, model=m, optimizer=opt, fingerprint="fp",
                            every_rounds=1, every_s=0.0, keep=2, saved_round=None,
                            outer_state=lambda: states[-1].clone())
    assert saver.after_round(8)
    saver.wait()
    written = tmp_path / "checkpoints" / "round-00000008"
    inode = written.stat().st_ino
    saver.final(8)  # nothing moved: not written again (a rewrite replaces the directory)
    assert written.stat().st_ino == inode
    assert json.loads((written / "meta.json").read_text())["outer"]["version"] == 0
    states.append(OuterState(theta=torch.ones(4), momentum=torch.zeros(4), applied=2))
    with torch.no_grad():
        m.w.weight.add_(1.0)  # the adopted version moved the weights too
    saver.final(8)
    meta = json.loads((tmp_path / "checkpoints" / "round-00000008" / "meta.json").read_text())
    assert (meta["round"], meta["outer"]["version"]) == (8, 2), meta
    assert meta["outer"]["state_hash"] == states[-1].hash()
    m2, opt2 = _model_opt()
    load_checkpoint(tmp_path, model=m2, optimizer=opt2, fingerprint="fp")
    assert torch.equal(m2.w.weight, m.w.weight)
