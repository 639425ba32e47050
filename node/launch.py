"""From a NodeConfig to running processes: `join` (supervisor) and `bootstrap`.

The supervisor process imports neither libp2p nor torch/hivemind: each child gets its
config as a JSON table (node/tables.py) and builds its typed config (GossipConfig,
LearnerConfig, OuterConfig) from it; the NodeConfig built those same configs from the same
tables already, so a child refuses one only if this node's code is wrong.
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
from node.supervisor import Supervisor
from node.tables import collective_addr, gossip_table, ipc_path_for, learner_table
from protocol import IdentityError, load_or_create_identity
from protocol.events import Exit, Ready

__all__ = ["collective_addr", "run_bootstrap", "run_node"]

log = logging.getLogger(__name__)


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
                               json.dumps(gossip_table(config, ipc_path=ipc, bootstrap_only=False)))

    def learner_argv(rounds: int | None) -> list[str]:
        payload = learner_table(config, ipc_path=ipc, rounds=rounds)
        return python_module("node.learner_process", "--config-json", json.dumps(payload))

    return Supervisor(config, swarm_argv, learner_argv, live=live).run()


def run_bootstrap(config: NodeConfig, *, on_ready: Callable[[list[str]], Any]) -> int:
    """Run the swarm process in bootstrap-only mode until SIGINT/SIGTERM or it exits."""
    peer_id = _check_identity(config)
    if peer_id is None:
        return 1
    events: queue.Queue[Event] = queue.Queue()
    argv = python_module("swarm", "--config-json",
                         json.dumps(gossip_table(config, ipc_path=None, bootstrap_only=True)))
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
            event = events.get().event
            if isinstance(event, Ready):
                on_ready(list(event.addrs))
                log.info("bootstrap peer %s ready", peer_id)
            elif isinstance(event, Exit):
                code = event.code
                return 0 if stopping and code in (0, -signal.SIGTERM) else (code or 1)
    finally:
        if child.alive():
            child.stop(15.0)
        for s, h in old.items():
            signal.signal(s, h)
