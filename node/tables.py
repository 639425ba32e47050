"""The config tables a node hands its children, and their check before any child starts.

    NodeConfig ─┬─ gossip_table()   → swarm child    swarm.config.GossipConfig.from_dict
                └─ learner_table()  → learner child  node.learner.config.LearnerConfig.from_dict
                                                     collectives.config.OuterConfig.from_dict

Each child builds its typed config from its table with ``protocol.tables.build_table``. A
``NodeConfig`` builds the same configs from the same tables on construction
(``check_tables``), so a typo or a value out of range in any table of the config file, or in
a flag that feeds one, ends ``swarm-node join`` with one line before a child starts. Imports
neither torch, hivemind, trio nor libp2p (the config modules it builds do not either).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.tables import TableError, build_table

if TYPE_CHECKING:
    from node.config import NodeConfig

__all__ = ["check_tables", "collective_addr", "gossip_table", "ipc_path_for", "learner_table"]

_FROM_OPTIONS = {
    "gossip": {"data_dir": "--data-dir", "listen": "--listen", "announce": "--announce",
               "bootstrap": "--bootstrap", "swarm_id": "--swarm-id"},
    "learner": {"data_dir": "--data-dir", "policy.model": "--model", "policy.device": "--device"},
    "outer": {"swarm_id": "--swarm-id", "catchup.trusted_peers": "--trust-peer",
              "transport.host_maddrs": "--listen",
              "transport.announce_maddrs": "--announce"},
}
"""Keys of each child's table that the node fills from its own settings (a flag, its
SWARM_NODE_* variable or the config file's top level), overriding the table's own ones; the
``[outer]`` table's own ones win over the node's."""


def ipc_path_for(data_dir: Path) -> Path:
    """data_dir/swarm.sock, or a short path in /tmp when that is too long for AF_UNIX."""
    path = Path(data_dir).resolve() / "swarm.sock"
    if len(str(path)) <= 100:
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"swarm-node-{digest}.sock"


def gossip_table(config: NodeConfig, *, ipc_path: str | None,
                 bootstrap_only: bool) -> dict[str, Any]:
    """The swarm child's ``GossipConfig`` table: ``[gossip]`` and the node's addresses."""
    return {**config.gossip, "data_dir": str(config.data_dir), "listen": list(config.listen),
            "announce": list(config.announce), "bootstrap": list(config.bootstrap),
            "swarm_id": config.swarm_id, "bootstrap_only": bootstrap_only, "ipc_path": ipc_path}


def learner_table(config: NodeConfig, *, ipc_path: str, rounds: int | None) -> dict[str, Any]:
    """The learner child's payload: ``[learner]`` (with the node's model and device) as a
    ``LearnerConfig`` table, ``[outer]`` (over the node's swarm id and addresses) as an
    ``OuterConfig`` table."""
    learner = dict(config.learner)
    learner["data_dir"] = str(config.data_dir)
    policy = learner.get("policy", {})
    if isinstance(policy, dict):  # else LearnerConfig says it is not a table
        learner["policy"] = {**policy, "model": config.model, "device": config.device}
    outer = _under(config.outer, {
        "swarm_id": config.swarm_id,
        "transport.host_maddrs": [collective_addr(a) for a in config.listen],
        "transport.announce_maddrs": [collective_addr(a) for a in config.announce],
        **({"catchup.trusted_peers": list(config.trusted_peers)}
           if config.trusted_peers else {})})
    return {"ipc_path": ipc_path, "rounds": rounds, "data_dir": str(config.data_dir),
            "learner": learner, "outer": outer}


def _under(table: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``table`` with each dotted key of ``defaults`` set where the table sets it neither
    at that place nor under its old flat name (``OuterConfig.MOVED_KEYS``)."""
    from collectives.config import OuterConfig

    out = dict(table)
    for dotted, value in defaults.items():
        *path, key = dotted.split(".")
        if key in out and OuterConfig.MOVED_KEYS.get(key) == dotted:
            continue  # the old flat name: the table's own value wins
        sub = out
        for part in path:
            nested = sub.get(part, {})
            if not isinstance(nested, dict):
                break  # not a table: OuterConfig says so
            sub[part] = sub = dict(nested)
        else:
            sub.setdefault(key, value)
    return out


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


def check_tables(config: NodeConfig) -> None:
    """Build every child's typed config from the table it would get; ``ConfigError`` with
    one line, ``[table] key: reason`` (``--option: reason`` for a key the node fills from
    its settings), for the first key at fault."""
    from collectives.config import OuterConfig
    from node.config import ConfigError
    from node.learner.config import LearnerConfig
    from swarm.config import GossipConfig

    ipc = str(ipc_path_for(config.data_dir))
    payload = learner_table(config, ipc_path=ipc, rounds=config.rounds)
    for table, cls, data in (
            ("gossip", GossipConfig, gossip_table(config, ipc_path=ipc, bootstrap_only=False)),
            ("learner", LearnerConfig, payload["learner"]),
            ("outer", OuterConfig, payload["outer"])):
        try:
            build_table(cls, data)
        except TableError as e:
            raise ConfigError(_where(config, table, e)) from None


def _where(config: NodeConfig, table: str, error: TableError) -> str:
    option = _FROM_OPTIONS[table].get(error.key)
    if option and not (table == "outer" and _sets(config.outer, error.key)):
        return f"{option}: {error.reason}"
    where, _, key = error.within(table).key.rpartition(".")
    return f"[{where}] {key}: {error.reason}" if where else f"[{key}]: {error.reason}"


def _sets(table: dict[str, Any], dotted: str) -> bool:
    """The table sets the dotted key itself (at its place or under its old flat name)."""
    from collectives.config import OuterConfig

    *path, key = dotted.split(".")
    if key in table and OuterConfig.MOVED_KEYS.get(key) == dotted:
        return True
    for part in path:
        table = table.get(part, {})
        if not isinstance(table, dict):
            return False
    return key in table
