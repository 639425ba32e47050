"""Run what a container of deploy/Dockerfile would run, as plain processes on this machine.

The image config comes from the parsed Dockerfile (and a compose service, if given); only
container paths are swapped for host ones (``/data`` → a tmp dir, ``/opt/venv`` → the venv
running the tests) and the listen address for a free port on 127.0.0.1. Nothing is copied
by hand, so a change to the Dockerfile changes what these tests run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.deploy.dockerfile import Image

__all__ = ["Container", "free_port", "host_paths", "wait_until"]

VENV = "/opt/venv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_paths(value: str, paths: dict[str, str]) -> str:
    """Replace container paths that start a value or follow ':' / '=' / whitespace."""
    for container, host in paths.items():
        value = re.sub(rf"(?:(?<=^)|(?<=[:=\s])){re.escape(container)}(?=[/:\s]|$)", host, value)
    return value


def wait_until(check: Callable[[], bool], *, timeout: float, what: str,
               alive: Callable[[], str | None] = lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        dead = alive()
        if dead:
            raise AssertionError(f"{what}: {dead}")
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


class Container:
    """One 'container': the image's env and entrypoint, run on the host with mapped paths."""

    def __init__(self, image: Image, tmp: Path, *, env: dict[str, str] | None = None,
                 entrypoint: list[str] | None = None, paths: dict[str, str] | None = None):
        self.paths = {VENV: sys.prefix, **(paths or {})}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_NODE_")}
        self.env["PYTHONFAULTHANDLER"] = "1"  # diagnostics only: stacks if a stop hangs
        for key, value in {**image.env, **(env or {})}.items():
            value = host_paths(value, self.paths)
            self.env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
        self.workdir = Path(host_paths(image.workdir or "/", self.paths))
        self.workdir.mkdir(parents=True, exist_ok=True)  # the image creates it (the volume)
        self.argv = [host_paths(a, self.paths) for a in
                     (entrypoint if entrypoint is not None else image.entrypoint or [])
                     + (image.cmd or [] if entrypoint is None else [])]
        self.healthcheck = [host_paths(a, self.paths) for a in image.healthcheck["cmd"]] \
            if image.healthcheck and image.healthcheck["cmd"] else None
        self.log = tmp / f"container-{id(self)}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The entrypoint; `tini --` dropped only where this machine has no tini."""
        argv = list(self.argv)
        if argv[:2] == ["tini", "--"] and not shutil.which("tini", path=self.env["PATH"]):
            argv = argv[2:]
        exe = shutil.which(argv[0], path=self.env["PATH"])
        assert exe, f"{argv[0]} not on the image PATH {self.env['PATH']}"
        return [exe, *argv[1:]]

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), env=self.env, cwd=self.workdir,
                                         stdout=log, stderr=subprocess.STDOUT)

    def died(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"exited with {self.proc.returncode}; log tail:\n{self.tail()}"
        return None

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no output)"

    def health(self) -> subprocess.CompletedProcess[str]:
        assert self.healthcheck, "the image has no HEALTHCHECK"
        exe = shutil.which(self.healthcheck[0], path=self.env["PATH"])
        return subprocess.run([exe, *self.healthcheck[1:]], env=self.env, capture_output=True,
                              text=True, timeout=60, cwd=self.workdir)

    def stop(self, timeout: float) -> int:
        """SIGTERM, as `docker stop` sends; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._dump_stacks()
            self.kill()
            raise AssertionError(f"no exit {timeout:.0f} s after SIGTERM; log:\n"
                                 f"{self.tail(250)}") from None

    def _dump_stacks(self) -> None:
        """SIGABRT every Python process of the tree: with PYTHONFAULTHANDLER=1 (set by the
        tests) each prints its threads' stacks into the log, which says where it hung."""
        assert self.proc is not None
        for pid in _descendants(self.proc.pid) + [self.proc.pid]:
            try:
                if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                    os.kill(pid, signal.SIGABRT)
            except (OSError, ProcessLookupError):
                pass
        time.sleep(5)

    def kill(self) -> None:
        """SIGKILL to every process of the 'container' (as `docker kill`/teardown does):
        the entrypoint and all its descendants, whatever process group they made."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)


def _descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (Linux /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def read_line_with(proc: subprocess.Popen[str], needle: str, *, timeout: float) -> str:
    """The first stdout line of ``proc`` containing ``needle``; stdout keeps draining until
    the process closes it (then the pipe is closed), so the process never blocks on it."""
    found: list[str] = []
    event = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                if needle in line and not found:
                    found.append(line.strip())
                    event.set()
        event.set()

    threading.Thread(target=drain, daemon=True).start()
    event.wait(timeout)
    if not found:
        raise AssertionError(f"no line with {needle!r} from {proc.args} in {timeout:.0f} s "
                             f"(exit code {proc.poll()})")
    return found[0]
