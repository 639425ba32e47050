from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import Rollout, RolloutBatch, TaskSpec
from swarm.config import GossipConfig
from tests.swarm.procs import SwarmProc, short_tmpdir

LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)
FAST: dict[str, Any] = {
    "listen": LOOPBACK, "log_every_s": 0.1, "announcements": {"interval_s": 1.0},
    "peers": {"ttl_s": 6.0, "maintain_interval_s": 0.5, "bootstrap_timeout_s": 30.0}}
"""Every test process's settings, under its own: announcements and maintenance fast enough
for a test's seconds."""


def batch(model: str, round_: int, n: int = 2, text: str = "x") -> RolloutBatch:
    task = TaskSpec(family="arith", config={"digits": 2}, seed=round_, index=0)
    ro = Rollout(task=task, prompt=f"{model}/{round_}", completions=(text, "b"), rewards=(1.0, 0.0))
    return RolloutBatch(model=model, round=round_, rollouts=(ro,) * n)


class Procs:
    """Starts swarm processes in one short temp dir; stops them all at the end of a test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[SwarmProc] = []

    def config(self, name: str, **kw: Any) -> GossipConfig:
        """``FAST`` with ``kw`` over it, a sub-table key by key (``peers={"target": 4}``
        keeps FAST's other ``peers`` settings)."""
        values = {**FAST, "data_dir": str(self.root / name)}
        for key, value in kw.items():
            below = values.get(key)
            values[key] = {**below, **value} if isinstance(below, dict) else value
        return GossipConfig.from_dict(values)

    def node(self, name: str, *, learner: bool = True, **kw: object) -> SwarmProc:
        return self.nodes([name], learner=learner, **kw)[0]

    def nodes(self, names: list[str], *, learner: bool = True, **kw: object) -> list[SwarmProc]:
        """Start processes in parallel (imports take seconds each) and wait for all."""
        started = []
        for name in names:
            extra = {"ipc_path": str(self.root / f"{name}.sock")} if learner else {}
            p = SwarmProc(self.config(name, **extra, **kw), name).start(expect_ready=False)
            self.procs.append(p)
            started.append(p)
        return [p.wait_ready(timeout_s=90) for p in started]

    def stop_all(self) -> None:
        for p in self.procs:  # signal all first: they leave in parallel
            if p.proc is not None and p.proc.poll() is None:
                p.proc.terminate()
        for p in self.procs:
            p.stop()


@pytest.fixture
def procs() -> Iterator[Procs]:
    root = short_tmpdir()
    ps = Procs(root)
    try:
        yield ps
    finally:
        ps.stop_all()
        shutil.rmtree(root, ignore_errors=True)
