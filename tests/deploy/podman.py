"""Build and run deploy/Dockerfile for real with podman (root): helpers of test_image_build.py.

No image registry is needed: the base image is Debian bookworm made by `debootstrap` and
`podman import` (with Debian's python3, cached per day), Python packages come from a
wheelhouse made on this machine by deploy/wheelhouse.sh (cached per dependency set), and
the build context is a temp dir holding what deploy/Dockerfile.dockerignore allows.
podman's settings live in a containers.conf of the caller's (CONTAINERS_CONF), never /etc.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["CONTAINERS_CONF", "IMAGE_BUILD", "ImageBuild", "Podman", "Unavailable",
           "base_image", "build_context", "ensure_tools", "prepare_image", "wheelhouse"]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CACHE = Path(os.environ.get("SWARM_NODE_IMAGE_CACHE", "/var/tmp/swarm-node-image-test"))
BASE_REPO = "localhost/swarm-node-test-base"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}  # binary: package
# crun (Debian's default) fails here on rlimits and hybrid cgroups; no systemd for cgroups.
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


def ensure_tools() -> str | None:
    """Install podman, runc and debootstrap with apt-get where missing; None when all are
    there, else why they are not (the test skips with it)."""
    if os.geteuid() != 0:
        return "needs root (podman, debootstrap and the image's uid 10001 on a volume)"
    missing = [pkg for exe, pkg in TOOLS.items() if shutil.which(exe) is None]
    if not missing:
        return None
    if shutil.which("apt-get") is None:
        return f"{', '.join(missing)} missing and no apt-get to install them"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"],
                ["apt-get", "install", "-y", "--no-install-recommends", *missing]):
        out = subprocess.run(["nice", "-n", "10", *cmd], env=env, capture_output=True,
                             text=True, timeout=600)
        if out.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {(out.stdout + out.stderr)[-500:]}"
    gone = [exe for exe in TOOLS if shutil.which(exe) is None]
    return f"{gone} still missing after apt-get install" if gone else None


class Podman:
    """podman with the caller's containers.conf; every call raises with its output on failure."""

    def __init__(self, conf: Path):
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(self, *args: str, timeout: float = 120, check: bool = True, nice: bool = False,
            stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [*(["nice", "-n", "10"] if nice else []), "podman", *args]
        out = subprocess.run(cmd, env=self.env, capture_output=True, timeout=timeout,
                             input=stdin, text=stdin is None)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[:6])}... exited {out.returncode}:\n"
                                 f"{_text(out.stdout)[-3000:]}\n{_text(out.stderr)[-3000:]}")
        return out

    def inspect(self, name: str, fmt: str) -> str:
        return self.run("inspect", "--format", fmt, name).stdout.strip()

    def exists(self, kind: str, name: str) -> bool:
        return self.run(kind, "exists", name, check=False).returncode == 0


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def base_image(podman: Podman, tmp: Path) -> str:
    """Debian bookworm (minbase) with python3 and venv, as a local image; one per day, the
    older ones removed. Stands in for python:3.11-slim-bookworm, which no registry serves here."""
    tag = f"{BASE_REPO}:bookworm-{datetime.date.today():%Y%m%d}"
    if podman.exists("image", tag):
        return tag
    rootfs = tmp / "rootfs"
    boot = subprocess.run(["nice", "-n", "10", "debootstrap", "--variant=minbase",
                           "--include=python3,python3-venv", "bookworm", str(rootfs),
                           DEBIAN_MIRROR], capture_output=True, text=True, timeout=900)
    assert boot.returncode == 0, f"debootstrap failed:\n{(boot.stdout + boot.stderr)[-3000:]}"
    for cache in ("var/cache/apt", "var/lib/apt/lists"):  # the Dockerfile runs apt-get update
        for entry in (rootfs / cache).glob("*"):
            if entry.is_file():
                entry.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        out = subprocess.run(["nice", "-n", "10", "podman", "import", "-", tag], env=podman.env,
                             stdin=tar.stdout, capture_output=True, timeout=600)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait(60)
    assert out.returncode == 0, _text(out.stderr)
    shutil.rmtree(rootfs)
    for old in podman.run("images", "--format", "{{.Repository}}:{{.Tag}}",
                          BASE_REPO).stdout.split():
        if old != tag:
            podman.run("rmi", old, check=False)
    return tag


def _pytorch_index_reachable() -> bool:
    try:
        socket.create_connection(("download.pytorch.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


def wheelhouse() -> tuple[Path, float]:
    """deploy/wheelhouse.sh's output for the current pins (cached); its path and the seconds
    the script took (0 when cached). torch comes from the PyTorch CPU index where it can be
    reached, else from pip's own configuration (here: a CPU wheel on disk)."""
    torch_version = _arg("build-cpu", "TORCH_VERSION")
    key = hashlib.sha256(f"{sys.version} torch=={torch_version}".encode())
    for name in ("deploy/constraints.txt", "pyproject.toml", "deploy/wheelhouse.sh"):
        key.update((ROOT / name).read_bytes())
    out = CACHE / f"wheelhouse-{key.hexdigest()[:16]}"
    if out.is_dir():
        return out, 0.0
    partial = out.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    env = {**os.environ, "PYTHON": sys.executable, "WHEELHOUSE": str(partial),
           "TORCH_VERSION": torch_version}
    if not _pytorch_index_reachable():
        env["TORCH_INDEX_URL"] = ""
    start = time.monotonic()
    done = subprocess.run(["nice", "-n", "10", str(DEPLOY / "wheelhouse.sh")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    seconds = time.monotonic() - start
    for old in CACHE.glob("wheelhouse-*"):
        if old != partial:
            shutil.rmtree(old, ignore_errors=True)
    partial.rename(out)
    return out, seconds


def _arg(stage: str, name: str) -> str:
    from tests.deploy.dockerfile import parse_dockerfile

    return parse_dockerfile(DEPLOY / "Dockerfile")[stage].args[name]


def build_context(dest: Path, wheels: Path) -> Path:
    """A build context with only what Dockerfile.dockerignore allows (as docker would send),
    the wheelhouse hard-linked in."""
    allowed = [line[1:].rstrip("/") for line in
               (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for rel in allowed:
        src, dst = ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel == "deploy/wheelhouse":
            shutil.copytree(wheels, dst, copy_function=os.link)
        elif src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    return dest


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children: on a shared machine
    a fairer measure of a phase's cost than its wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Unavailable(Exception):
    """The image cannot be built here (not root, no Python 3.11, tools missing): skip."""


def prepare_image(work: Path, measured: dict[str, float]) -> tuple[Podman, str]:
    """Tools, base image, wheelhouse and `podman build --target cpu`: the image test's slow,
    mostly I/O-bound part. Returns podman (with its containers.conf under ``work``) and the
    image tag; the caller removes the tag. Phase times go into ``measured``."""
    if sys.version_info[:2] != (3, 11):
        raise Unavailable("the wheelhouse must be made by Python 3.11, the Debian bookworm "
                          "base's")
    start = time.monotonic()
    reason = ensure_tools()
    if reason:
        raise Unavailable(reason)
    conf = work / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    podman = Podman(conf)
    measured["tools_s"] = round(time.monotonic() - start, 1)
    start, cpu = time.monotonic(), children_cpu_s()
    base = base_image(podman, work)
    measured["base_image_s"] = round(time.monotonic() - start, 1)
    measured["base_image_cpu_s"] = round(children_cpu_s() - cpu, 1)
    cpu = children_cpu_s()
    wheels, wheel_s = wheelhouse()
    measured["wheelhouse_s"] = round(wheel_s, 1)
    measured["wheelhouse_cpu_s"] = round(children_cpu_s() - cpu, 1)
    context = build_context(work / "context", wheels)
    measured["context_mb"] = round(dir_mb(context), 1)
    tag = f"localhost/swarm-node-test:{os.urandom(6).hex()}"
    start, cpu = time.monotonic(), children_cpu_s()
    podman.run("build", "--format", "docker", "--layers=false", "--network", "host",
               "--target", "cpu", "-f", str(DEPLOY / "Dockerfile"),
               "--ignorefile", str(DEPLOY / "Dockerfile.dockerignore"),
               "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", "WHEELHOUSE=1",
               "-t", tag, str(context), timeout=1200, nice=True)
    measured["build_s"] = round(time.monotonic() - start, 1)
    measured["build_cpu_s"] = round(children_cpu_s() - cpu, 1)
    measured["image_mb"] = round(int(podman.run(
        "image", "inspect", "--format", "{{.Size}}", tag).stdout) / 1e6)
    shutil.rmtree(context, ignore_errors=True)
    return podman, tag


class ImageBuild:
    """``prepare_image`` on a thread of its own, started when the session collects the image
    test (tests/conftest.py), so its downloads and niced build overlap the tests that run
    before it instead of adding to the suite's time; the test's fixture waits for it.
    ``children_cpu_s`` then counts the other tests' children too: the *_cpu_s figures are
    upper bounds."""

    def __init__(self) -> None:
        self.measured: dict[str, float] = {}
        self.work: Path | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._result: tuple[Podman, str] | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self.work = Path(tempfile.mkdtemp(prefix="swarm-node-image-"))
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="image-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            assert self.work is not None
            self._result = prepare_image(self.work, self.measured)
        except BaseException as e:  # noqa: BLE001 - handed to the test that waits for it
            self._error = e
        finally:
            self.measured["prepare_s"] = round(time.monotonic() - self._started, 1)
            self._done.set()

    def result(self, timeout: float) -> tuple[Podman, str]:
        """Wait for the build (starting it if nobody did); raises what it raised."""
        self.start()
        waited = time.monotonic()
        if not self._done.wait(timeout):
            raise AssertionError(f"the image build did not finish within {timeout:.0f} s")
        self.measured["waited_for_build_s"] = round(time.monotonic() - waited, 1)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cleanup(self) -> None:
        if self._done.is_set() and self._result is not None:
            podman, tag = self._result
            podman.run("rmi", "-f", tag, check=False)
        if self._done.is_set() and self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)


IMAGE_BUILD = ImageBuild()
"""The session's one image build (started by tests/conftest.py, awaited by the test)."""
