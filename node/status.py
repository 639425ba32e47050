"""What a person (or a health check) can see of a running node.

``StatusBoard`` folds child events into one status record, rewrites ``status.json``
atomically (the heartbeat that ``swarm-node status`` and the Docker HEALTHCHECK read) and
shows it: a live rich table on a TTY, otherwise one structured log line per round.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import atomic_write_bytes

log = logging.getLogger(__name__)

COUNTERS = ("rollouts_published", "rollouts_received", "external_used", "rejected")


@dataclass
class StatusBoard:
    path: Path
    live: bool = False
    state: dict[str, Any] = field(default_factory=dict)
    _live_view: Any = None

    def __post_init__(self) -> None:
        self.state.update(pid=os.getpid(), phase="starting", round=None, mean_reward=None,
                          peers=0, outer_steps=0, children={},
                          **{f"{k}_total": 0 for k in COUNTERS})
        if self.live:
            from rich.live import Live

            self._live_view = Live(self._render(), refresh_per_second=2, transient=False)
            self._live_view.start()

    def set(self, **values: Any) -> None:
        self.state.update(values)

    def child(self, name: str, *, pid: int | None, alive: bool, restarts: int) -> None:
        self.state["children"][name] = {"pid": pid, "alive": alive, "restarts": restarts}

    def on_round(self, record: dict[str, Any]) -> None:
        s = self.state
        s["round"] = record.get("round")
        s["mean_reward"] = record.get("mean_reward")
        for k in COUNTERS:
            s[f"{k}_total"] += int(record.get(k, 0) or 0)
        if "peers" in record:
            s["peers"] = record["peers"]
        if not self.live:
            log.info("round=%s reward=%.3f peers=%s published=%s received=%s used=%s rejected=%s",
                     record.get("round"), record.get("mean_reward") or 0.0, s["peers"],
                     record.get("rollouts_published"), record.get("rollouts_received"),
                     record.get("external_used"), record.get("rejected"))

    def flush(self) -> None:
        """Write the heartbeat and refresh the view. Called every second or so."""
        self.state["time"] = time.time()
        atomic_write_bytes(self.path, json.dumps(self.state, indent=1).encode())
        if self._live_view is not None:
            self._live_view.update(self._render())

    def close(self) -> None:
        if self._live_view is not None:
            self._live_view.stop()

    def _render(self) -> Any:
        from rich.table import Table

        s = self.state
        t = Table(title=f"swarm-node {s.get('peer_id', '')}", show_header=False)
        reward = s.get("mean_reward")
        rows = [("phase", s.get("phase")), ("round", s.get("round")),
                ("mean reward", f"{reward:.3f}" if isinstance(reward, float) else "-"),
                ("peers", s.get("peers")), ("rollouts out", s.get("rollouts_published_total")),
                ("rollouts in", s.get("rollouts_received_total")),
                ("external used", s.get("external_used_total")),
                ("rejected", s.get("rejected_total")), ("outer steps", s.get("outer_steps")),
                ("model", s.get("model"))]
        for k, v in rows:
            t.add_row(k, "-" if v is None else str(v))
        return t


def check_status(data_dir: Path, *, max_age_s: float) -> tuple[bool, str]:
    """Health check: is the node at ``data_dir`` alive? Returns (healthy, one-line summary)."""
    path = Path(data_dir) / "status.json"
    try:
        s = json.loads(path.read_text())
    except FileNotFoundError:
        return False, f"no node status at {path} (is the node running with this data dir?)"
    except (OSError, json.JSONDecodeError) as e:
        return False, f"unreadable status {path}: {e}"
    age = time.time() - float(s.get("time", 0))
    if age > max_age_s:
        return False, f"status is {age:.0f} s old (node stopped or hung)"
    try:
        os.kill(int(s["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError):
        return False, "the node's supervisor is not running"
    except PermissionError:
        pass  # alive, owned by another user
    dead = [n for n, c in s.get("children", {}).items() if not c.get("alive")]
    summary = (f"phase={s.get('phase')} round={s.get('round')} peers={s.get('peers')} "
               f"reward={s.get('mean_reward')} children_down={dead or 'none'}")
    healthy = s.get("phase") not in ("failed", "stopped") and not dead
    return healthy, summary
