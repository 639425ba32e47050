"""From a NodeConfig to running processes: `join` (supervisor) and `bootstrap`.

The supervisor process imports neither libp2p nor torch/hivemind: each child gets its
config as JSON and validates it with its own typed config (GossipConfig, LearnerConfig,
OuterConfig), exiting with a clear message if a value is wrong.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
from collections.abc import Callable
from typing import Any

from node.child import Child, Event, python_module
from node.config import NodeConfig
from node.supervisor import Supervisor, ipc_path_for
from protocol import IdentityError, load_or_create_identity

log = logging.getLogger(__name__)


def gossip_dict(config: NodeConfig, *, ipc_path: str | None, bootstrap_only: bool) -> dict[str, Any]:
    return {**config.gossip, "data_dir": str(config.data_dir), "listen": list(config.listen),
            "announce": list(config.announce), "bootstrap": list(config.bootstrap),
            "swarm_id": config.swarm_id, "bootstrap_only": bootstrap_only, "ipc_path": ipc_path}


def learner_payload(config: NodeConfig, *, ipc_path: str, rounds: int | None) -> dict[str, Any]:
    learner = dict(config.learner)
    learner["data_dir"] = str(config.data_dir)
    policy = dict(learner.get("policy", {}))
    policy.update(model=config.model, device=config.device)
    learner["policy"] = policy
    outer = {"swarm_id": config.swarm_id,
             "host_maddrs": [collective_addr(a) for a in config.listen],
             "announce_maddrs": [collective_addr(a) for a in config.announce], **config.outer}
    return {"ipc_path": ipc_path, "rounds": rounds, "data_dir": str(config.data_dir),
            "learner": learner, "outer": outer}


def collective_addr(swarm_addr: str) -> str:
    """The collective (hivemind p2pd) listens next to the swarm: same IP, swarm port + 1
    (port 0 stays 0). So a node behind NAT forwards two ports: 4001 and 4002 by default."""
    parts = swarm_addr.split("/")
    if "tcp" in parts:
        i = parts.index("tcp") + 1
        if i < len(parts) and parts[i].isdigit() and parts[i] != "0":
            parts[i] = str(int(parts[i]) + 1)
        del parts[i + 1:]  # drop /p2p/... suffixes
    return "/".join(parts)


def _check_identity(config: NodeConfig) -> str | None:
    try:
        return load_or_create_identity(config.data_dir).peer_id
    except IdentityError as e:
        log.error("%s", e)
        return None


def run_node(config: NodeConfig, *, live: bool = False) -> int:
    if _check_identity(config) is None:
        return 1
    ipc = str(ipc_path_for(config.data_dir))
    swarm_argv = python_module("swarm", "--config-json",
                               json.dumps(gossip_dict(config, ipc_path=ipc, bootstrap_only=False)))

    def learner_argv(rounds: int | None) -> list[str]:
        payload = learner_payload(config, ipc_path=ipc, rounds=rounds)
        return python_module("node.learner_process", "--config-json", json.dumps(payload))

    return Supervisor(config, swarm_argv, learner_argv, live=live).run()


def run_bootstrap(config: NodeConfig, *, on_ready: Callable[[list[str]], Any]) -> int:
    """Run the swarm process in bootstrap-only mode until SIGINT/SIGTERM or it exits."""
    peer_id = _check_identity(config)
    if peer_id is None:
        return 1
    events: queue.Queue[Event] = queue.Queue()
    argv = python_module("swarm", "--config-json",
                         json.dumps(gossip_dict(config, ipc_path=None, bootstrap_only=True)))
    child = Child("swarm", argv, events)
    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        child.signal(signal.SIGTERM)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        child.start()
        while True:
            ev = events.get()
            if ev.data["event"] == "ready":
                on_ready(list(ev.data.get("addrs") or []))
                log.info("bootstrap peer %s ready", peer_id)
            elif ev.data["event"] == "exit":
                code = int(ev.data["code"])
                return 0 if stopping and code in (0, -signal.SIGTERM) else (code or 1)
    finally:
        if child.alive():
            child.stop(15.0)
        for s, h in old.items():
            signal.signal(s, h)
