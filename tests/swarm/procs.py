"""Start real swarm processes (``python -m swarm``) on loopback for tests and benchmarks."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.config import GossipConfig

__all__ = ["SwarmProc", "short_tmpdir", "wait_until"]


def short_tmpdir() -> Path:
    """A short directory (Unix socket paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="sn-", dir="/tmp"))


def wait_until(predicate: Any, *, timeout_s: float, interval_s: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what or predicate}")
        time.sleep(interval_s)


@dataclass
class SwarmProc:
    """One swarm process; ``start()`` returns once its ready line arrived."""

    config: GossipConfig
    name: str = "swarm"
    proc: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] = field(default_factory=dict)
    log_path: Path | None = None
    python_args: tuple[str, ...] = ()
    """Interpreter arguments before ``-m swarm`` (e.g. ``("-m", "cProfile", "-o", path)``)."""
    cwd: str | None = None
    """Working directory; ``-m swarm`` imports the ``swarm`` package found there first."""

    def start(self, *, timeout_s: float = 60.0, expect_ready: bool = True) -> SwarmProc:
        self.log_path = Path(self.config.data_dir + f".{self.name}.log")
        Path(self.config.data_dir).parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, *self.python_args, "-m", "swarm", "--config-json", self.config.to_json(),
             *[f"--log={x}" for x in os.environ.get("SN_SWARM_LOG", "").split(",") if x]],
            stdout=subprocess.PIPE, stderr=log, env=os.environ.copy(), cwd=self.cwd)
        log.close()
        if expect_ready:
            self.wait_ready(timeout_s=timeout_s)
        return self

    def wait_ready(self, *, timeout_s: float = 60.0) -> SwarmProc:
        line = self._readline(timeout_s)
        self.ready = json.loads(line)
        if self.ready.get("event") != "ready":
            raise RuntimeError(f"{self.name}: unexpected first line {line!r}")
        return self

    def _readline(self, timeout_s: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        buf = b""
        fd = self.proc.stdout.fileno()
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no ready line in {timeout_s} s; log:\n{self.log()}")
            r, _, _ = select.select([fd], [], [], min(left, 0.5))
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(f"{self.name} exited ({self.proc.wait()}) before ready; "
                                       f"log:\n{self.log()}")
                buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    @property
    def addr(self) -> str:
        return self.ready["addrs"][0]

    @property
    def peer_id(self) -> str:
        return self.ready["peer_id"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path else ""

    def stop(self, *, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not leave in time. Returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
