"""Swarm processes (``python -m swarm``) started inside the hosts of a WAN bed.

The same helpers as tests/swarm (Procs, SwarmProc), except that each node runs in the bed
host of the same name and listens on that host's address. The learner-side IPC socket is a
path in /tmp, which every namespace shares, so a SocketBridge in the calling process works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.swarm.conftest import Procs
from tests.swarm.procs import SwarmProc

from .bed import WanBed


@dataclass
class NsSwarmProc(SwarmProc):
    """A SwarmProc whose command runs behind ``prefix`` (``ip netns exec NS``)."""

    prefix: tuple[str, ...] = ()

    def start(self, *, timeout_s: float = 60.0, expect_ready: bool = True) -> NsSwarmProc:
        self.log_path = Path(self.config.data_dir + f".{self.name}.log")
        Path(self.config.data_dir).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, *self.python_args, "-m", "swarm",
                 "--config-json", self.config.to_json()],
                stdout=subprocess.PIPE, stderr=log, env=os.environ.copy(), cwd=self.cwd)
        if expect_ready:
            self.wait_ready(timeout_s=timeout_s)
        return self


class WanProcs(Procs):
    """Procs whose node ``name`` runs in bed host ``name`` (the bed must have that host)."""

    def __init__(self, root: Path, bed: WanBed) -> None:
        super().__init__(root)
        self.bed = bed

    def nodes(self, names: list[str], *, learner: bool = True, **kw: object) -> list[SwarmProc]:
        started = []
        for name in names:
            extra = {"ipc_path": str(self.root / f"{name}.sock")} if learner else {}
            cfg = self.config(name, listen=(f"/ip4/{self.bed.addr(name)}/tcp/0",), **extra, **kw)
            p = NsSwarmProc(cfg, name, prefix=tuple(self.bed.prefix(name)))
            self.procs.append(p.start(expect_ready=False))
            started.append(p)
        return [p.wait_ready(timeout_s=120) for p in started]
