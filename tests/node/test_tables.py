"""Configs checked at the door: every table of a node's config (and the flags that feed one)
is checked before `swarm-node join` or `swarm-node local` starts anything (node/tables.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.cli import CHECK_BOOTSTRAP, check_join
from node.config import ConfigError, NodeConfig

BOOT = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
DOOR_S = 2.0
"""A bad config ends the command within this long (no child, no torch: an interpreter's
start and the config modules' imports)."""

BAD_KEYS = [  # (config file, the one line expected on stderr)
    ('modle = "x"\n', "modle: unknown key (did you mean model?)"),
    ('[gossip]\nrollout_mod = "flood"\n',
     "[gossip] rollout_mod: unknown key (did you mean rollout_mode?)"),
    ("[gossip.feeds]\nsorces = 3\n", "[gossip.feeds] sorces: unknown key (did you mean sources?)"),
    ("[learner]\nchekpoint_every = 2\n",
     "[learner] chekpoint_every: unknown key (did you mean checkpoint_every?)"),
    ('[learner.policy]\ndtyp = "float32"\n',
     "[learner.policy] dtyp: unknown key (did you mean dtype?)"),
    ("[learner.engine]\ntemprature = 0.7\n",
     "[learner.engine] temprature: unknown key (did you mean temperature?)"),
    ('[learner.tasks]\nfamlies = ["tiny_add"]\n',
     "[learner.tasks] famlies: unknown key (did you mean families?)"),
    ("[learner.trainer]\nweight_decy = 0.1\n",
     "[learner.trainer] weight_decy: unknown key (did you mean weight_decay?)"),
    ("[learner.sapo]\nextrnal = 2\n", "[learner.sapo] extrnal: unknown key (did you mean external?)"),
    ("[learner.verify]\ncpu = 10\n", "[learner.verify] cpu: unknown key (did you mean cpu_s?)"),
    ("[outer]\nevry_rounds = 2\n", "[outer] evry_rounds: unknown key (did you mean every_rounds?)"),
]
BAD_VALUES = [
    ('max_restarts = "5"\n', "max_restarts: expected an integer, got str '5'"),
    ("stop_timeout_s = -1\n", "stop_timeout_s: must be > 0, got -1"),
    ('[gossip]\nrollout_mode = "gossip"\n',
     "[gossip] rollout_mode: must be one of ['feeds', 'flood'], got 'gossip'"),
    ("[gossip.feeds]\nsources = 0\n", "[gossip.feeds] sources: must be positive, got 0"),
    ("[gossip.peers]\nttl_s = 2.0\n",
     "[gossip.peers] ttl_s: must exceed announcements.interval_s"),
    ("[learner]\ncheckpoint_every = -1\n", "[learner] checkpoint_every: must be >= 0, got -1"),
    ("[learner]\neval_every = -1\n", "[learner] eval_every: must be >= 0, got -1"),
    ('[learner]\neval_every = "often"\n',
     "[learner] eval_every: expected an integer, got str 'often'"),
    ('[learner.policy]\ndtype = "int4"\n',
     "[learner.policy] dtype: must be auto/float32/bfloat16/float16, got 'int4'"),
    ("[learner.engine]\ntop_p = 1.5\n", "[learner.engine] top_p: must be in (0, 1], got 1.5"),
    ('[learner.engine]\nstaleness = 1\nbackend = "vllm"\n',
     "[learner.engine] staleness: the asynchronous generator runs the transformers backend "
     "only; set staleness = 0 with backend 'vllm'"),
    ('[learner.tasks]\nfamilies = "tiny_add"\n',
     "[learner.tasks] families: expected a list of strings, got str 'tiny_add'"),
    ('[learner.trainer]\nlr = "fast"\n', "[learner.trainer] lr: expected a number, got str 'fast'"),
    ("[learner.sapo]\ncompletions_per_question = 1\n",
     "[learner.sapo] completions_per_question: must be >= 2 (group advantages)"),
    ("[learner.verify]\nmemory_mb = 100\n",
     "[learner.verify] memory_mb: must be 0 or >= 256, got 100"),
    ("[outer]\nevery_rounds = 0\n", "[outer] every_rounds: must be >= 1"),
    ("[outer]\nevery_rounds = true\n", "[outer] every_rounds: expected an integer, got true"),
    ('[outer]\ncompression = "zip"\n',
     "[outer] compression: must be one of ['none', 'fp16', 'int8', 'sparse'], got 'zip'"),
]
BAD_FLAGS = [  # flags that feed a child's table, checked by the child's config
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
    (["--swarm-id", "a/b"], "--swarm-id: must be 1..64 characters without '/'"),
]


def _join(tmp_path: Path, toml: str | None, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    args = [sys.executable, "-m", "node", "join", "--bootstrap", BOOT,
            "--data-dir", str(tmp_path / "data"), *flags]
    if toml is not None:
        (tmp_path / "node.toml").write_text(toml)
        args += ["--config", str(tmp_path / "node.toml")]
    t0 = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - t0


@pytest.mark.parametrize("toml, line", BAD_KEYS + BAD_VALUES,
                         ids=[line.split(":")[0] for _, line in BAD_KEYS + BAD_VALUES])
def test_join_refuses_a_bad_table_in_one_line_before_starting_anything(tmp_path, toml, line):
    done, seconds = _join(tmp_path, toml)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"config error: {line}\n", "")
    assert seconds < DOOR_S
    assert not (tmp_path / "data").exists()  # no identity, no lock, no child, no status


@pytest.mark.parametrize("flags, line", BAD_FLAGS, ids=[f[0] for f, _ in BAD_FLAGS])
def test_join_refuses_a_bad_flag_for_a_child_table_before_starting_anything(tmp_path, flags, line):
    done, seconds = _join(tmp_path, None, *flags)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"config error: {line}\n", "")
    assert seconds < DOOR_S
    assert not (tmp_path / "data").exists()


def test_local_refuses_a_bad_table_before_starting_its_bootstrap_peer(tmp_path):
    (tmp_path / "node.toml").write_text("[outer]\nevry_rounds = 2\n")
    done = subprocess.run([sys.executable, "-m", "node", "local", "--config",
                           str(tmp_path / "node.toml"), "--data-dir", str(tmp_path / "swarm"),
                           "--report", str(tmp_path / "report.json")],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == \
        "config error: [outer] evry_rounds: unknown key (did you mean every_rounds?)"
    assert not (tmp_path / "swarm").exists() and not (tmp_path / "report.json").exists()


def test_the_local_swarm_defaults_pass_the_door(tmp_path):
    from node.local import LOCAL_DEFAULTS, LocalSwarm

    (tmp_path / "local.toml").write_text(LOCAL_DEFAULTS)
    swarm = LocalSwarm(nodes=1, rounds=2, report=tmp_path / "r.json",
                       config_file=str(tmp_path / "local.toml"))
    config = check_join(swarm.join_args(tmp_path / "node-0", CHECK_BOOTSTRAP))
    assert config.outer["every_rounds"] == 2
    assert config.learner == {"checkpoint_every": 2, "eval_every": 10}


def test_the_local_swarm_pins_its_other_nodes_as_trusted(tmp_path):
    """Each node of ``swarm-node local`` adopts the versions its siblings signed (a node
    that starts late is not left at its own state: e2e test_local_swarm)."""
    from node.local import LocalSwarm
    from node.tables import learner_table

    swarm = LocalSwarm(nodes=3, rounds=2, report=tmp_path / "r.json",
                       peer_ids={f"node-{i}": f"12D3KooW{i + 1}" + "x" * 44 for i in range(3)})
    config = check_join(swarm.join_args(tmp_path / "node-1", CHECK_BOOTSTRAP))
    assert config.trusted_peers == (swarm.peer_ids["node-0"], swarm.peer_ids["node-2"])
    outer = learner_table(config, ipc_path="/s", rounds=2)["outer"]
    assert outer["catchup"] == {"trusted_peers": list(config.trusted_peers)}


def test_a_valid_config_gives_the_children_the_tables_they_had(tmp_path):
    """The door only checks: the tables handed on are the config's, untouched."""
    from node.tables import gossip_table, learner_table

    cfg = NodeConfig(data_dir=tmp_path, listen=("/ip4/0.0.0.0/tcp/4001",), model="m",
                     gossip={"peers": {"target": 4}}, outer={"every_rounds": 2},
                     learner={"sapo": {"external": 2}, "tasks": {"families": ["tiny_add"]}})
    payload = learner_table(cfg, ipc_path="/s", rounds=3)
    assert payload["learner"] == {"sapo": {"external": 2},
                                  "tasks": {"families": ["tiny_add"]}, "data_dir": str(tmp_path),
                                  "policy": {"model": "m", "device": "auto"}}
    assert payload["outer"] == {"swarm_id": "swarm-node-main", "every_rounds": 2,
                                "transport": {"host_maddrs": ["/ip4/0.0.0.0/tcp/4002"],
                                              "announce_maddrs": []}}
    assert gossip_table(cfg, ipc_path="/s", bootstrap_only=False)["peers"] == {"target": 4}


def test_a_node_config_with_a_bad_table_is_never_built():
    """The Supervisor takes a NodeConfig: one with a bad table cannot exist."""
    with pytest.raises(ConfigError, match=r"^\[outer\] evry_rounds: unknown key"):
        NodeConfig(outer={"evry_rounds": 2})
    with pytest.raises(ConfigError, match=r"^\[learner.sapo\] external: must be <= questions"):
        NodeConfig(learner={"sapo": {"external": 9}})
    with pytest.raises(ConfigError, match=r"^\[outer\] swarm_id: "):  # [outer]'s own wins
        NodeConfig(outer={"swarm_id": ""})
    with pytest.raises(ConfigError, match=r"^\[gossip.feeds\] sorces: unknown key \(did you "
                                          r"mean sources\?\)$"):
        NodeConfig(gossip={"feeds": {"sorces": 3}})
    with pytest.raises(ConfigError, match=r"^\[gossip\] feed_sources: given twice: as "
                                          r"feed_sources and as \[feeds\] sources$"):
        NodeConfig(gossip={"feed_sources": 3, "feeds": {"sources": 3}})
    with pytest.raises(ConfigError, match=r"^\[outer.transport\] host_maddrs: must not"):
        NodeConfig(outer={"transport": {"host_maddrs": []}})
    with pytest.raises(ConfigError, match=r"^\[outer\] host_maddrs: given twice"):
        NodeConfig(outer={"host_maddrs": [], "transport": {"host_maddrs": ["/ip4/1.2.3.4"]}})
    with pytest.raises(ConfigError, match=r"^\[outer.schedule\] deadline_s: must be > 0"):
        NodeConfig(outer={"deadline_s": 0})  # an old flat key, checked at its new place


def test_an_old_flat_gossip_key_still_works_and_the_child_gets_it(tmp_path, caplog):
    from node.tables import gossip_table
    from swarm.config import GossipConfig

    with caplog.at_level(logging.WARNING, logger="protocol.tables"):
        cfg = NodeConfig(data_dir=tmp_path, gossip={"feed_sources": 3, "peers": {"target": 5}})
    assert "key feed_sources is now sources in [feeds]" in caplog.text
    got = GossipConfig.from_json(json.dumps(gossip_table(cfg, ipc_path=None,
                                                         bootstrap_only=True)))
    assert (got.feeds.sources, got.peers.target, got.bootstrap_only) == (3, 5, True)


def test_the_outer_tables_own_addresses_win_in_either_form():
    from collectives.config import OuterConfig
    from node.tables import learner_table

    for outer in ({"host_maddrs": ["/ip4/10.0.0.1/tcp/7"]},
                  {"transport": {"host_maddrs": ["/ip4/10.0.0.1/tcp/7"]}}):
        cfg = NodeConfig(outer=outer)
        got = OuterConfig.from_dict(learner_table(cfg, ipc_path="/s", rounds=1)["outer"])
        assert got.transport.host_maddrs == ("/ip4/10.0.0.1/tcp/7",)
        assert got.transport.announce_maddrs == ()


CONFIG_MODULES = ["protocol.tables", "swarm.config", "collectives.config", "node.learner.config",
                  "node.config", "node.tables", "node.cli"]
HEAVY = ("torch", "hivemind", "trio", "libp2p")


def _heavy_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\n"
                          f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("module", CONFIG_MODULES)
def test_config_modules_import_without_torch_hivemind_trio_or_libp2p(module):
    assert _heavy_after(f"import {module}") == []


def test_checking_every_table_imports_no_torch_hivemind_trio_or_libp2p():
    assert _heavy_after("from node.config import NodeConfig\n"
                        "NodeConfig(outer={'compression': 'int8'}, "
                        "gossip={'peers': {'target': 4}}, "
                        "learner={'tasks': {'families': ['tiny_add']}})") == []
