"""deploy/constraints.txt is what every install gets: exact pins, equal to what runs the suite.

`make setup` installs with `-c deploy/constraints.txt`, so the venv running these tests holds
exactly the pinned versions by construction; a package installed by hand, a newer release
slipping past the pins, or a pin that nothing installs fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, ROOT

NOT_PINNED = {"torch", "swarm-node", "pip"}
"""torch is the user's choice (CPU or a CUDA build); pip comes with the venv (setuptools is pinned:
torch and grpcio-tools pull it in, and a newer release would otherwise slip in)."""
TORCH_COMPANIONS = re.compile(r"^(nvidia-.*|triton|cuda-.*)$")
"""Packages a CUDA build of torch pulls in: they follow the torch the user chose."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and ";" not in version, f"not an exact pin: {line!r}"
            out[_norm(name)] = version
    return out


def test_every_pin_is_exact_and_torch_is_left_to_the_user():
    p = pins()
    assert "torch" not in p and "swarm-node" not in p
    assert {"hivemind", "libp2p", "transformers", "trio", "numpy", "msgpack"} <= set(p)


def test_the_suites_venv_holds_exactly_the_pinned_versions():
    installed = {_norm(d.metadata["Name"]): d.version for d in distributions()}
    p = pins()
    unpinned = {n: v for n, v in installed.items()
                if n not in p and n not in NOT_PINNED and not TORCH_COMPANIONS.match(n)}
    assert not unpinned, f"installed but not pinned (run `make pins`): {unpinned}"
    wrong = {n: (v, installed.get(n)) for n, v in p.items() if installed.get(n) != v}
    assert not wrong, f"pinned version != installed version (pin, installed): {wrong}"


def test_pyproject_and_the_make_check_name_the_same_pythons():
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    sys.path.insert(0, str(DEPLOY))
    try:
        from python_check import TESTED
    finally:
        sys.path.remove(str(DEPLOY))
    for minor in TESTED:
        assert f">={minor}" in requires, (minor, requires)
    last = TESTED[-1].split(".")
    assert f"<{last[0]}.{int(last[1]) + 1}" in requires, requires


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_make_refuses_an_untested_python_with_a_message(version, tmp_path):
    # python_check reads only sys.version_info: a fake interpreter answering another version
    # is enough to show what a user on it sees, without installing anything
    fake = tmp_path / "python"
    major, minor = version.split(".")
    fake.write_text(f"#!{sys.executable}\nimport sys, runpy\n"
                    f"sys.version_info = ({major}, {minor}, 0, 'final', 0)\n"
                    "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    fake.chmod(0o755)
    out = subprocess.run(["make", "-s", "python-check", f"PY={fake}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert f"is Python {version}" in out.stderr and "tested on Python 3.11" in out.stderr


def test_make_accepts_the_tested_python():
    out = subprocess.run(["make", "-s", "python-check", f"PY={sys.executable}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_make_setup_installs_through_the_pins(tmp_path):
    # what `make setup` would run in a fresh venv (-n: print, run nothing; -B: as if new)
    out = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    installs = [line for line in out.stdout.splitlines() if "pip install" in line]
    project = [line for line in installs if '-e ".[test]"' in line]
    assert project and all("-c deploy/constraints.txt" in line for line in project), installs


def test_the_image_installs_through_the_same_pins():
    text = (DEPLOY / "Dockerfile").read_text()
    project = [line for line in text.splitlines() if "pip install" in line and "/src" in line]
    assert project and all("-c deploy/constraints.txt" in line for line in project), project
