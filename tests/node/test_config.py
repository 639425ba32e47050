"""Settings precedence (config file < env < flags) and validation of `swarm-node join`."""

from __future__ import annotations


import click
import pytest

from node.cli import join, join_config
from node.config import ConfigError, NodeConfig, load_config_file

BOOT = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
BOOT2 = "/ip4/10.0.0.9/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


def parse(args: list[str]) -> NodeConfig:
    ctx = join.make_context("join", args)
    params = {k: v for k, v in ctx.params.items() if k not in ("verbose", "plain")}
    return join_config(ctx, params)


def test_precedence_file_env_flag(tmp_path, monkeypatch):
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'bootstrap = ["{BOOT}"]\nmodel = "from-file"\nswarm_id = "file-swarm"\n'
                   f'device = "cpu"\n[learner]\nseed = 7\n')
    monkeypatch.setenv("SWARM_NODE_MODEL", "from-env")
    monkeypatch.setenv("SWARM_NODE_SWARM_ID", "env-swarm")
    c = parse(["--config", str(cfg), "--swarm-id", "flag-swarm"])
    assert c.bootstrap == (BOOT,)          # file only
    assert c.device == "cpu"               # file only
    assert c.model == "from-env"           # env beats file
    assert c.swarm_id == "flag-swarm"      # flag beats env
    assert c.learner == {"seed": 7}        # advanced table passed through


def test_env_lists_are_space_separated(monkeypatch, tmp_path):
    monkeypatch.setenv("SWARM_NODE_BOOTSTRAP", f"{BOOT} {BOOT2}")
    monkeypatch.setenv("SWARM_NODE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SWARM_NODE_METRICS_PORT", "9100")
    c = parse([])
    assert c.bootstrap == (BOOT, BOOT2)
    assert c.data_dir == tmp_path
    assert c.metrics_port == 9100


def test_bootstrap_is_required():
    with pytest.raises(click.UsageError, match="--bootstrap is required"):
        parse([])


@pytest.mark.parametrize("bad, match", [
    ({"bootstrap": ("/ip4/1.2.3.4/tcp/1",)}, "must end in /p2p/"),
    ({"bootstrap": ("1.2.3.4:4001",)}, "not a multiaddr"),
    ({"rounds": -1}, "rounds"),
    ({"metrics_port": 70000}, "metrics_port"),
    ({"listen": ()}, "listen"),
])
def test_invalid_values_name_the_problem(bad, match):
    with pytest.raises(ConfigError, match=match):
        NodeConfig(**bad)


def test_unknown_config_keys_are_reported(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('modle = "typo"\n')
    with pytest.raises(ConfigError, match=r"modle: unknown key \(did you mean model\?\)"):
        load_config_file(cfg)
    cfg.write_text("model = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config_file(cfg)


@pytest.mark.parametrize("swarm, collective", [
    ("/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/tcp/4002"),
    ("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/0"),
    ("/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWabc", "/ip4/1.2.3.4/tcp/4002"),
])
def test_collective_port_is_swarm_port_plus_one(swarm, collective):
    """The Docker files publish 4001 and 4002 on this rule."""
    from node.launch import collective_addr

    assert collective_addr(swarm) == collective
