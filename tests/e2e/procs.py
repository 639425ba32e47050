"""Start real `swarm-node` processes on 127.0.0.1 for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "node", *args]


class Bootstrap:
    def __init__(self, data_dir: Path, swarm_id: str) -> None:
        self.log = open(data_dir.parent / "bootstrap.log", "wb")
        self.proc = subprocess.Popen(
            cli("bootstrap", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(data_dir),
                "--swarm-id", swarm_id),
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode().strip()  # type: ignore[union-attr]
        assert line.startswith("/ip4/127.0.0.1/") and "/p2p/12D3KooW" in line, line
        self.addr = line

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.proc.stdout.close()  # type: ignore[union-attr]
        self.log.close()


def join(data_dir: Path, bootstrap: str, swarm_id: str, *args: str,
         env: dict[str, str] | None = None, new_session: bool = False) -> subprocess.Popen[bytes]:
    """``new_session``: the node leads its own process group (a test may killpg it)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "SWARM_NODE_DEVICE": "cpu", **(env or {})}
    with open(data_dir / "node.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            cli("join", "--bootstrap", bootstrap, "--listen", "/ip4/127.0.0.1/tcp/0",
                "--data-dir", str(data_dir), "--swarm-id", swarm_id, "--plain", *args),
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=full_env,
            start_new_session=new_session)


def status(data_dir: Path) -> dict:
    try:
        return json.loads((data_dir / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def wait_for(cond, *, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def log_tail(data_dir: Path, n: int = 40) -> str:
    try:
        return "\n".join((data_dir / "node.log").read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
