"""`swarm-node local`: a bootstrap peer and N training nodes as real processes on 127.0.0.1.

Each node is a full `swarm-node join` (its own supervisor, swarm and learner processes and
data dir). Their logs go to ``<base>/<node>/node.log``; this command shows progress from
their status files, then writes the swarm report ``{"nodes": [...], ...}`` and a PNG with
every node's reward curve next to it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.report import learning, plot_rewards, write_json
from protocol import IdentityError, load_or_create_identity

log = logging.getLogger(__name__)

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
# A short demo should show every mechanism: outer steps and checkpoints every 2 rounds.
# The outer step is the plain mean (lr 1, no momentum): with DiLoCo's Nesterov (0.7, 0.9)
# at H = 2 the nodes collapsed to accuracy ~0.03 against 0.15 alone (issue 29,
# bench/outer_learning.py); stated here so the demo does not follow a changed default.
LOCAL_DEFAULTS = ("[outer]\nevery_rounds = 2\n\n[outer.optimizer]\nlr = 1.0\nmomentum = 0.0\n\n"
                  "[outer.schedule]\njoin_window_s = 3.0\ndeadline_s = 60.0\n"
                  "final_wait_s = 60.0\n\n"
                  "[learner]\ncheckpoint_every = 2\neval_every = 10\n")
BOOTSTRAP_TIMEOUT_S = 120.0


def _learned(summary: dict[str, Any] | None) -> str:
    """One node's learning in words (``node.report.learning``)."""
    if summary is None:
        return "no round scored"
    k = summary["window"]
    text = (f"training accuracy {summary['first']:.2f} over its first {k} round{'s' * (k > 1)}"
            f" -> {summary['last']:.2f} over its last {k}")
    if "heldout_last" in summary:
        a, b = summary["heldout_first"], summary["heldout_last"]
        text += (f"; held-out greedy {a['greedy']:.2f} after {a['after_rounds']} rounds -> "
                 f"{b['greedy']:.2f} after {b['after_rounds']}")
    return text


@dataclass
class LocalSwarm:
    nodes: int
    rounds: int
    report: Path
    base_dir: Path | None = None
    model: str = "embedded"
    config_file: str | None = None
    swarm_id: str = field(default_factory=lambda: f"local-{os.getpid()}")
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    peer_ids: dict[str, str] = field(default_factory=dict)
    """Each node's peer id (its key is made before it starts): every node trusts the others'
    outer-step versions (``--trust-peer``), so one that starts late or runs slow adopts the
    version the others reached instead of ending on its own (it would trust them only
    after their rollouts arrived in two of its rounds, which a short run may not have)."""

    def run(self) -> int:
        base = Path(self.base_dir or tempfile.mkdtemp(prefix="swarm-local-"))
        base.mkdir(parents=True, exist_ok=True)
        log.info("local swarm of %d nodes in %s", self.nodes, base)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        started = time.monotonic()
        try:
            if self.config_file is None:
                self.config_file = str(base / "local.toml")
                Path(self.config_file).write_text(LOCAL_DEFAULTS)
            names = [f"node-{i}" for i in range(self.nodes)]
            try:
                self.peer_ids = {n: load_or_create_identity(base / n).peer_id for n in names}
            except IdentityError as e:
                raise SystemExit(f"cannot prepare the nodes' identities: {e}") from None
            addr = self._start_bootstrap(base / "bootstrap")
            for name in names:
                self._start_node(name, base / name, addr)
            codes = self._wait(base)
        finally:
            for p in self._procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in self._procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                if p.stdout is not None:
                    p.stdout.close()
            for s, h in old.items():
                signal.signal(s, h)
        return self._write_report(base, codes, time.monotonic() - started)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        log.info("stopping the local swarm (nodes checkpoint and write their reports)")
        for name, p in self._procs.items():
            if name != "bootstrap" and p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "node", *args]

    def _start_bootstrap(self, data_dir: Path) -> str:
        data_dir.mkdir(parents=True, exist_ok=True)
        with open(data_dir / "node.log", "ab") as logf:  # the child keeps its own copy
            p = subprocess.Popen(self._cli("bootstrap", "--listen", LOOPBACK, "--data-dir",
                                           str(data_dir), "--swarm-id", self.swarm_id),
                                 stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL)
        self._procs["bootstrap"] = p
        assert p.stdout is not None
        deadline = time.monotonic() + BOOTSTRAP_TIMEOUT_S
        while time.monotonic() < deadline:
            line = p.stdout.readline().decode().strip()
            if not line:
                if p.poll() is not None:
                    raise SystemExit(f"the bootstrap peer exited (code {p.returncode}); "
                                     f"see {data_dir / 'node.log'}")
                continue
            if line.startswith("/ip4/127.0.0.1/"):
                log.info("bootstrap peer at %s", line)
                return line
        raise SystemExit("the bootstrap peer did not start in time")

    def join_args(self, data_dir: Path, bootstrap: str) -> list[str]:
        """The arguments of one node's `swarm-node join` (the CLI checks them before any
        process starts)."""
        args = ["join", "--bootstrap", bootstrap, "--listen", LOOPBACK, "--data-dir", str(data_dir),
                "--rounds", str(self.rounds), "--report", str(data_dir / "report.json"),
                "--swarm-id", self.swarm_id, "--model", self.model, "--plain",
                "--device", os.environ.get("SWARM_NODE_DEVICE", "cpu")]
        for name, peer_id in sorted(self.peer_ids.items()):
            if Path(data_dir).name != name:
                args += ["--trust-peer", peer_id]
        return args + ["--config", self.config_file] if self.config_file else args

    def _start_node(self, name: str, data_dir: Path, bootstrap: str) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        with open(data_dir / "node.log", "ab") as logf:
            self._procs[name] = subprocess.Popen(self._cli(*self.join_args(data_dir, bootstrap)),
                                                 stdout=logf, stderr=logf,
                                                 stdin=subprocess.DEVNULL)

    def _wait(self, base: Path) -> dict[str, int]:
        nodes = [n for n in self._procs if n != "bootstrap"]
        last = 0.0
        while any(self._procs[n].poll() is None for n in nodes):
            time.sleep(0.5)
            if time.monotonic() - last > 5:
                last = time.monotonic()
                log.info("progress: %s", "  ".join(self._progress(base, n) for n in nodes))
        return {n: int(self._procs[n].returncode) for n in nodes}

    def _progress(self, base: Path, name: str) -> str:
        try:
            s = json.loads((base / name / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return f"{name}: starting"
        reward = s.get("mean_reward")
        r = f"{reward:.2f}" if isinstance(reward, (int, float)) else "-"
        return f"{name}: {s.get('phase')} r{s.get('round')}/{self.rounds} reward={r}"

    def _write_report(self, base: Path, codes: dict[str, int], seconds: float) -> int:
        nodes, missing = [], []
        for name, code in codes.items():
            path = base / name / "report.json"
            try:
                node = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                missing.append(name)
                continue
            nodes.append({**node, "name": name, "exit_code": code, "data_dir": str(base / name),
                          "learning": learning(node.get("rounds", []))})
        ok = not missing and all(c == 0 for c in codes.values())
        report = {"nodes": nodes, "swarm_id": self.swarm_id, "rounds": self.rounds,
                  "seconds": round(seconds, 1), "base_dir": str(base), "ok": ok,
                  "missing_reports": missing}
        write_json(self.report, report)
        png = self.report.with_suffix(".png")
        plot_rewards(nodes, png, title=f"{len(nodes)} nodes, {self.rounds} rounds")
        for n in nodes:
            rs = n.get("rounds", [])
            log.info("%s %s: %d rounds, received %d, external used %d; %s", n["name"],
                     n.get("peer_id", "")[-8:], len(rs), sum(r.get("rollouts_received", 0) for r in rs),
                     sum(r.get("external_used", 0) for r in rs), _learned(learning(rs)))
        log.info("swarm report: %s, curves: %s (%s)", self.report, png,
                 "ok" if ok else f"FAILED: exit codes {codes}, missing {missing}")
        return 0 if ok else 1
