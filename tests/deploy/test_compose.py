"""The compose files parse and point only at things that exist and are documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from node.cli import bootstrap, join
from tests.deploy.conftest import DEPLOY, ROOT
from tests.deploy.dockerfile import compose_vars, interpolate

COMPOSE_FILES = ("compose.yaml", "compose.gpu.yaml", "compose.local.yaml")
REQUIRED = {"SWARM_NODE_BOOTSTRAP": "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWExample"}


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Run a community node")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def services(name: str):
    return interpolate(load(name), dict(REQUIRED))["services"].items()


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_builds_point_at_real_contexts_dockerfiles_and_targets(stages, name):
    for svc_name, svc in services(name):
        build = svc.get("build")
        if build is None:
            continue
        context = (DEPLOY / build["context"]).resolve()
        assert (context / "pyproject.toml").is_file(), f"{svc_name}: context {context}"
        dockerfile = context / build["dockerfile"]
        assert dockerfile == DEPLOY / "Dockerfile", svc_name
        assert build["target"] in stages and stages[build["target"]].name, svc_name
        assert svc["image"].endswith(":" + build["target"]), "tag must say which target"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_mounts_networks_and_dependencies_exist(name):
    doc = interpolate(load(name), dict(REQUIRED))
    volumes, networks = set(doc.get("volumes") or {}), set(doc.get("networks") or {})
    for svc_name, svc in doc["services"].items():
        for mount in svc.get("volumes", []):
            source, target = mount.split(":")[:2]
            if source.startswith("."):
                assert (DEPLOY / source).is_file(), f"{svc_name}: {source}"
            else:
                assert source in volumes, f"{svc_name}: volume {source} not declared"
            assert target.startswith("/")
        for net in svc.get("networks", []):
            assert net in networks, f"{svc_name}: network {net}"
        for dep in svc.get("depends_on", []):
            assert dep in doc["services"], f"{svc_name}: depends on unknown {dep}"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_variable_is_documented_in_the_readme(name):
    section = readme_section()
    for var in compose_vars(load(name)):
        assert f"`{var}`" in section, f"{name} uses {var}, undocumented in README"
    for var in re.findall(r"`(SWARM_NODE_[A-Z_]+)`", section):
        known = {p.envvar for p in join.params} | {"SWARM_NODE_PORT",
                                                     "SWARM_NODE_METRICS_HOST_PORT"}
        assert var in known, f"README documents {var}, which nothing reads"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_node_env_vars_are_real_options(name):
    options = {p.envvar for cmd in (join, bootstrap) for p in cmd.params}
    for svc_name, svc in services(name):
        for key in svc.get("environment", {}) or {}:
            if key.startswith("SWARM_NODE_"):
                assert key in options, f"{svc_name}: {key} is no option of join"


def test_community_node_needs_a_bootstrap_and_keeps_its_data(stages):
    with pytest.raises(KeyError, match="SWARM_NODE_BOOTSTRAP"):
        interpolate(load("compose.yaml"), {})
    node = dict(services("compose.yaml"))["node"]
    assert node["environment"]["SWARM_NODE_BOOTSTRAP"] == REQUIRED["SWARM_NODE_BOOTSTRAP"]
    data_dir = stages["cpu"].image.env["SWARM_NODE_DATA_DIR"]
    assert any(m.endswith(":" + data_dir) for m in node["volumes"])
    assert {"4001:4001/tcp", "4002:4002/tcp"} <= set(node["ports"])
    metrics_port = node["environment"]["SWARM_NODE_METRICS_PORT"]
    assert f"127.0.0.1:9400:{metrics_port}/tcp" in node["ports"], "metrics only on loopback"


def test_gpu_override_selects_the_cuda_target_and_a_gpu():
    node = dict(services("compose.gpu.yaml"))["node"]
    assert node["build"]["target"] == "cuda"
    devices = node["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_local_swarm_wires_nodes_to_the_bootstrap_through_the_script(stages):
    svcs = dict(services("compose.local.yaml"))
    script = Path("/opt/swarm-node/local-swarm.sh")
    for name, mode in (("bootstrap", "bootstrap"), ("node", "join")):
        svc = svcs[name]
        assert svc["entrypoint"] == ["tini", "--", "sh", str(script), mode]
        assert f"./local-swarm.sh:{script}:ro" in svc["volumes"]
    share = "/run/swarm-node"  # the script's default share dir, owned by the node user
    assert f"bootstrap-share:{share}" in svcs["bootstrap"]["volumes"]
    assert f"bootstrap-share:{share}:ro" in svcs["node"]["volumes"]
    assert share in " ".join(a for k, a in stages["runtime"].instructions if k == "RUN")
    assert svcs["node"]["environment"]["BOOTSTRAP_HOST"] == "bootstrap"
    assert svcs["node"]["deploy"]["replicas"] >= 2
    assert "volumes" not in svcs["node"] or not any(
        m.split(":")[1] == "/data" for m in svcs["node"]["volumes"]), \
        "replicas must not share one /data (one identity)"


def test_local_bootstrap_probe_and_start_order():
    svcs = dict(services("compose.local.yaml"))
    probe = svcs["bootstrap"]["healthcheck"]["test"]
    assert probe[:3] == ["CMD", "python", "-c"] and "4001" in probe[3]
    assert svcs["node"]["depends_on"]["bootstrap"]["condition"] == "service_healthy"
