"""NodeConfig: everything one `swarm-node join` needs, from file < env < flags.

The CLI builds one NodeConfig; the supervisor derives each child's typed config from it
(swarm: ``swarm.config.GossipConfig``, learner: ``node.learner.config.LearnerConfig``, outer
steps: ``collectives.OuterConfig``). Advanced, per-component settings live in the config
file's ``[gossip]``, ``[learner]`` and ``[outer]`` tables and are passed through to those
configs' ``from_dict`` (which validate them).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_DATA_DIR = Path(os.environ.get("HOME", ".")) / ".swarm-node"
DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4001"
DEFAULT_SWARM_ID = "swarm-node-main"


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
            raise ConfigError(f"rounds must be ≥ 0, got {self.rounds}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics_port must be a TCP port, got {self.metrics_port}")
        if self.dashboard_port is not None and not 0 <= self.dashboard_port < 65536:
            raise ConfigError(f"dashboard_port must be a TCP port, got {self.dashboard_port}")
        if self.max_restarts < 0:
            raise ConfigError("max_restarts must be ≥ 0")
        if not self.swarm_id or len(self.swarm_id) > 64:
            raise ConfigError("swarm_id must be 1..64 characters")
        if not self.listen:
            raise ConfigError("at least one listen address is needed")
        for addr in (*self.bootstrap, *self.listen, *self.announce):
            if not addr.startswith("/"):
                raise ConfigError(f"{addr!r} is not a multiaddr (e.g. /ip4/1.2.3.4/tcp/4001)")
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ConfigError(f"bootstrap address {addr!r} must end in /p2p/<peer-id>")
        self._check_task_families()

    def _check_task_families(self) -> None:
        """Refuse unvetted or unknown task families before any child starts (the learner
        would refuse them too, but only once the swarm is up). Imports no torch."""
        tasks = self.learner.get("tasks")
        from node.learner.errors import TaskError
        from node.learner.tasks import check_family
        from node.learner.tasks.presets import preset_families

        preset = tasks.get("preset") if isinstance(tasks, dict) else None
        if preset:
            try:
                preset_families(str(preset))
            except TaskError as e:
                raise ConfigError(f"[learner.tasks] preset: {e}") from None
        families = tasks.get("families") if isinstance(tasks, dict) else None
        if not isinstance(families, (list, tuple)):
            return

        for family in families:
            try:
                check_family(str(family))
            except TaskError as e:
                raise ConfigError(f"[learner.tasks] families: {e}") from None

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
    known = set(NodeConfig.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {sorted(unknown)}; "
                          f"known: {sorted(known)}")
    return data
