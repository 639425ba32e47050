"""The terminal view of `swarm-node join`: one table that owns the screen and stays in place.

While the view runs, rich's ``Live`` owns the terminal's alternate screen and redraws one
table, sized to the terminal, from the status record (node/status.py) once a second. Nothing
else writes to the terminal: the supervisor's log records and every line the children write
on stderr go to ``<data dir>/node.log`` (rotated), and the newest of them fill the table's
last rows when there is room. On exit the normal screen comes back with the last warnings and
the path of the log. A small terminal gets the compact layout (fewer rows, no log lines).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from node.status import (compute_text, feeds_alarm, feeds_text, heldout_text, held_off_text,
                         links_text)

__all__ = ["TerminalView", "render", "sparkline"]

log = logging.getLogger(__name__)

LOG_BYTES, LOG_BACKUPS = 10 * 2**20, 3
_SPARKS = "▁▂▃▄▅▆▇█"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d),\d+ ")
_COMPACT_HEIGHT, _COMPACT_WIDTH = 18, 60


class _Formatter(logging.Formatter):
    """Children's lines are already formatted by the child: write them as they are."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "raw", False):
            return _CONTROL.sub(" ", record.getMessage())
        return super().format(record)


class LogRing(logging.Handler):
    """The newest formatted log lines, for the table's log rows and the exit summary."""

    def __init__(self, size: int = 200) -> None:
        super().__init__()
        self.lines: deque[tuple[int, str]] = deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((record.levelno, self.format(record)))
        except Exception:
            self.handleError(record)

    def snapshot(self) -> list[tuple[int, str]]:
        """A copy (children's reader threads append while the view draws)."""
        with self.lock:  # type: ignore[union-attr]  # the lock handle() holds around emit()
            return list(self.lines)


class TerminalView:
    """Owns the terminal while the node runs (``start`` ... ``close``)."""

    def __init__(self, log_path: Path, *, console: Console | None = None) -> None:
        self.log_path = Path(log_path)
        self._real = console is None
        self.console = console or Console(stderr=True)
        self.ring = LogRing()
        self._children = logging.getLogger("node.children")
        self._saved: list[logging.Handler] = []
        self._file: logging.Handler | None = None
        self._live: Live | None = None
        self._last: dict[str, Any] = {}

    def start(self) -> TerminalView:
        root = logging.getLogger()
        self._saved = list(root.handlers)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fmt = _Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        file = logging.handlers.RotatingFileHandler(self.log_path, maxBytes=LOG_BYTES,
                                                    backupCount=LOG_BACKUPS)
        for h in (file, self.ring):
            h.setFormatter(fmt)
        root.handlers = [file, self.ring]
        self._file = file
        self._live = Live(console=self.console, screen=True, auto_refresh=False,
                          redirect_stdout=True, redirect_stderr=True)
        self._live.start()
        return self

    def child_line(self, child: str, line: str) -> None:
        """A line a child wrote on stderr (called from its reader thread)."""
        m = _LEVEL.search(line[:80])
        level = logging.getLevelNamesMapping()[m.group(1)] if m else logging.INFO
        self._children.log(level, "%s", line, extra={"raw": True, "child": child})

    def update(self, state: dict[str, Any]) -> None:
        self._last = state
        if self._live is not None:
            width, height = self._size()
            self.console.size = (width, height)
            self._live.update(render(state, width=width, height=height,
                                     log_lines=[t for _, t in self.ring.snapshot()],
                                     log_path=str(self.log_path)), refresh=True)

    def _size(self) -> tuple[int, int]:
        """The terminal's size now. rich prefers $COLUMNS/$LINES, which shells and tmux may
        leave stale in the environment: then the table would not follow a resize."""
        if self._real:
            for fd in (2, 1, 0):
                try:
                    size = os.get_terminal_size(fd)
                except OSError:
                    continue
                if size.columns and size.lines:
                    return size.columns, size.lines
        return self.console.size

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        logging.getLogger().handlers = self._saved
        if self._file is not None:
            self._file.close()
        s = self._last
        worrying = [t for lvl, t in self.ring.snapshot() if lvl >= logging.WARNING][-8:]
        for line in worrying:
            self.console.print(Text(line), soft_wrap=True)
        self.console.print(Text(f"swarm-node {s.get('phase', '')}: round {s.get('round')}, "
                                f"{s.get('rounds_done', 0)} rounds this run; log: {self.log_path}"),
                           soft_wrap=True)


def sparkline(values: list[float], width: int) -> str:
    vals = [v for v in values if isinstance(v, (int, float))][-max(0, width):]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    return "".join(_SPARKS[int((v - lo) / span * (len(_SPARKS) - 1)) if span else 0] for v in vals)


def _bar(done: int, total: int, width: int) -> str:
    filled = round(width * min(1.0, done / total)) if total > 0 else 0
    return "█" * filled + "░" * (width - filled)


def _ago(t: Any, now: float) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    secs = max(0, int(now - t))
    return f"{secs} s" if secs < 120 else f"{secs // 60} min" if secs < 7200 else f"{secs // 3600} h"


def _short(text: Any, n: int = 12) -> str:
    text = _CONTROL.sub("", str(text or ""))
    return text if len(text) <= 2 * n + 1 else f"{text[:n]}…{text[-6:]}"


def _bytes(n: Any) -> str:
    n = float(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _reasons(d: Any) -> str:
    if not isinstance(d, dict) or not any(d.values()):
        return "none"
    return " ".join(f"{_CONTROL.sub('', str(k))[:24]} {v}" for k, v in sorted(d.items()) if v)


def _phase_text(s: dict[str, Any], now: float, bar_width: int) -> str:
    p = s.get("round_phase")
    if s.get("phase") != "training" or not isinstance(p, dict):
        return str(s.get("phase") or "-")
    name, done, total = p.get("name", ""), int(p.get("done") or 0), int(p.get("total") or 0)
    elapsed = f"{max(0.0, now - float(p.get('since') or now)):.0f} s"
    if name == "outer":
        stage = _CONTROL.sub("", str(p.get("stage") or ""))[:16]
        return f"outer step (DiLoCo){' · ' + stage if stage else ''} · {elapsed}"
    if total > 0:
        unit = " tokens" if name == "generate" else " passes" if name == "train" else ""
        return f"{name} {_bar(done, total, bar_width)} {done}/{total}{unit} · {elapsed}"
    return f"{name} · {elapsed}"


def _rows(s: dict[str, Any], *, width: int, compact: bool, now: float) -> list[tuple[str, str]]:
    children = s.get("children") or {}
    health = " ".join(f"{n} {'up' if c.get('alive') else 'DOWN'}" for n, c in children.items())
    restarts = sum(int(c.get("restarts") or 0) for c in children.values())
    rate = s.get("rounds_per_s")
    reward, acc = s.get("mean_reward"), s.get("accuracy")
    value_width = max(10, width - 16)
    spark = sparkline(s.get("recent_rewards") or [], min(40, value_width - 30))
    outer = s.get("last_outer")
    n_outer = int(s.get("outer_steps") or 0)
    outer_text = f"{n_outer} step{'' if n_outer == 1 else 's'}"
    if isinstance(outer, dict):
        secs = outer.get("seconds")
        secs_text = f"{secs:.1f}" if isinstance(secs, (int, float)) else "-"
        outer_text += (f" · last #{outer.get('step')} {outer.get('status')}: {outer.get('peers')} peers,"
                       f" {_bytes(outer.get('bytes_sent'))}, {secs_text} s,"
                       f" hash {_short(outer.get('param_hash'), 4)}")
        if outer.get("held_off"):  # what peers did to our groups (collectives/leader.py)
            outer_text += f" · held off: {held_off_text(outer['held_off'])}"
    ckpt = s.get("last_checkpoint")
    ckpt_text = (f"after round {int(ckpt.get('round') or 0) - 1} · {_ago(ckpt.get('time'), now)} ago"
                 if isinstance(ckpt, dict) else "none yet this run")
    feeds_row: list[tuple[str, str]] = []  # feeds mode only: the feed sources by kind, an attack's idle slots first
    if s.get("feeds") is not None:
        alarm = feeds_alarm(s["feeds"])
        feeds_row.append(("feeds", (f"{alarm} · " if alarm else "")
                          + feeds_text(s["feeds"])))
    rows = [
        ("node", f"{s.get('phase')} · up {_ago(s.get('started'), now)} · {health or '-'}"
                 f" · restarts {restarts}"),
        ("round", ("-" if s.get("round") is None else str(s.get("round")))
         + (f" · {rate:.2f} rounds/s" if isinstance(rate, float) else "")),
        ("phase", _phase_text(s, now, 10 if compact else 20)),
        ("reward", (f"{reward:.3f} " if isinstance(reward, (int, float)) else "- ") + spark
         + (f" · accuracy {acc:.2f}" if isinstance(acc, (int, float)) else "")
         + (f" · held-out {heldout_text(s['heldout'])}" if s.get("heldout") else "")),
        ("compute", compute_text(s.get("compute"))),
        # connected peers by link (swarm.holepunch): relayed ones named, direct is the goal
        ("peers", f"{s.get('peers', 0)}"
                  + (f" · {links_text(s['links'], name=0 if compact else 12)}"
                     if s.get("links") is not None else "")
                  + f" · reachability {s.get('reachability') or 'unknown'}"),
        *feeds_row,
        ("rollouts", f"out {s.get('rollouts_published_total', 0)} · in "
                     f"{s.get('rollouts_received_total', 0)} · used {s.get('external_used_total', 0)}"),
        ("rejected", f"re-scoring: {_reasons(s.get('rejected_by_reason'))}"
                     f" · gossip: {_reasons(s.get('gossip_rejected'))}"),
        ("outer", outer_text),
    ]
    if not compact:
        rows += [("checkpoint", ckpt_text), ("model", _short(s.get("model"), 16))]
    return rows


def render(state: dict[str, Any], *, width: int, height: int, log_lines: Sequence[str] = (),
           log_path: str = "", now: float | None = None) -> Table:
    """The table for a ``width`` x ``height`` terminal: every row one line, never taller."""
    now = time.time() if now is None else now
    compact = height < _COMPACT_HEIGHT or width < _COMPACT_WIDTH
    title = f"swarm-node · {_short(state.get('peer_id'), 8 if compact else 12)}"
    table = Table(title=title, show_header=False, box=box.ROUNDED, expand=True,
                  padding=(0, 1), title_justify="left")
    table.add_column("key", style="bold", width=10, no_wrap=True)
    table.add_column("value", ratio=1, no_wrap=True, overflow="ellipsis")
    rows = _rows(state, width=width, compact=compact, now=now)[:max(1, height - 3)]  # title, borders
    for key, value in rows:
        table.add_row(key, Text(value))
    room = height - len(rows) - 3 - 2  # title, two borders, section line, one spare
    if not compact and room > 0:
        table.add_section()
        table.add_row("log", Text(_CONTROL.sub("", log_path), style="dim"))
        for line in list(log_lines)[-(room - 1):] if room > 1 else []:
            table.add_row("", Text(_STAMP.sub(r"\1 ", line), style="dim"))
    return table
