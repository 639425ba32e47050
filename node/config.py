"""NodeConfig: everything one `swarm-node join` needs, from file < env < flags.

The CLI builds one NodeConfig; the supervisor derives each child's table from it
(node/tables.py; swarm: ``swarm.config.GossipConfig``, learner:
``node.learner.config.LearnerConfig``, outer steps: ``collectives.config.OuterConfig``).
Advanced, per-component settings live in the config file's ``[gossip]``, ``[learner]`` (and
its sub-tables) and ``[outer]`` tables. A NodeConfig builds every child's typed config from
its table on construction, so a bad key or value anywhere is a ``ConfigError`` before any
child starts. Imports neither torch, hivemind, trio nor libp2p.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.tables import check_tables
from protocol.tables import TableError, check_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_DATA_DIR = Path(os.environ.get("HOME", ".")) / ".swarm-node"
DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4001"
DEFAULT_SWARM_ID = "swarm-node-main"
FILE_ONLY_KEYS = ("gossip", "learner", "outer", "max_restarts", "restart_window_s",
                  "stop_timeout_s")
"""NodeConfig fields set only in the config file (the others are options of `join`, whose
values from the file click converts and checks)."""


class ConfigError(ValueError):
    """A configuration value a user must fix; the message says which and how."""


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    data_dir: Path = DEFAULT_DATA_DIR
    """Identity key, checkpoints, status and reports live here (keep it on a volume)."""
    bootstrap: tuple[str, ...] = ()
    """Multiaddrs of peers to join through, each ending in /p2p/<peer-id>."""
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    """Multiaddrs the swarm host listens on (port 0 = any free port)."""
    announce: tuple[str, ...] = ()
    """Multiaddrs to advertise instead of the listen ones (public address behind NAT)."""
    swarm_id: str = DEFAULT_SWARM_ID
    """Only peers with the same swarm id exchange messages."""
    trusted_peers: tuple[str, ...] = ()
    """Peer ids whose outer-step versions this node adopts when it joins behind them
    (``[outer.catchup] trusted_peers``; the table's own list wins)."""
    model: str = "embedded"
    """Hugging Face model id or local path; "embedded" = the tiny built-in default."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    rounds: int | None = None
    """Stop after this many rounds (None = run until stopped)."""
    report: Path | None = None
    """Write the node report (JSON) here when stopping."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (None = off)."""
    dashboard_port: int | None = None
    """Serve the local dashboard on 127.0.0.1 at this port (None = off)."""
    max_restarts: int = 5
    """Give up after this many crashes of a child within ``restart_window_s``."""
    restart_window_s: float = 600.0
    """Window in which crashes are counted."""
    stop_timeout_s: float = 60.0
    """On SIGTERM/SIGINT, how long children get to checkpoint before they are killed."""
    gossip: dict[str, Any] = field(default_factory=dict)
    """Advanced GossipConfig fields (config file table [gossip])."""
    learner: dict[str, Any] = field(default_factory=dict)
    """Advanced LearnerConfig fields (config file table [learner])."""
    outer: dict[str, Any] = field(default_factory=dict)
    """Advanced OuterConfig fields (config file table [outer])."""

    def __post_init__(self) -> None:
        if self.rounds is not None and self.rounds < 0:
            raise ConfigError(f"rounds: must be >= 0, got {self.rounds}")
        for key in ("metrics_port", "dashboard_port"):
            port = getattr(self, key)
            if port is not None and not 0 <= port < 65536:
                raise ConfigError(f"{key}: must be a TCP port, got {port}")
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts: must be >= 0, got {self.max_restarts}")
        for key in ("restart_window_s", "stop_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: must be > 0, got {getattr(self, key)}")
        if not self.swarm_id or len(self.swarm_id) > 64:
            raise ConfigError("swarm_id: must be 1..64 characters")
        if not self.listen:
            raise ConfigError("listen: at least one listen address is needed")
        for key in ("bootstrap", "listen", "announce"):
            for addr in getattr(self, key):
                if not addr.startswith("/"):
                    raise ConfigError(f"{key}: {addr!r} is not a multiaddr "
                                      "(e.g. /ip4/1.2.3.4/tcp/4001)")
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ConfigError(f"bootstrap: {addr!r} must end in /p2p/<peer-id>")
        check_tables(self)  # every child's typed config, from the table it will be handed

    @property
    def status_path(self) -> Path:
        return self.data_dir / "status.json"


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML config file into click's default_map shape (flat keys, lists kept)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    options = set(NodeConfig.__dataclass_fields__) - set(FILE_ONLY_KEYS)
    try:  # unknown keys, and the types of the keys no option converts
        check_table(NodeConfig, {k: v for k, v in data.items() if k not in options})
    except TableError as e:
        raise ConfigError(str(e)) from None
    return data
