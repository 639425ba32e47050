"""The supervisor of one node: identity, child processes, restarts, signals, status, report.

    swarm-node join ─ Supervisor
        ├── swarm child    python -m swarm --config-json ...   (trio + py-libp2p)
        └── learner child  python -m node.learner_process ...  (torch + hivemind)

The swarm child starts first and prints a ``ready`` event with its IPC socket; then the
learner starts and reports ``started``/``phase``/``round``/``peers``/``outer``/``checkpoint``/
``done`` events, which the status board folds into the one status record that status.json,
the terminal view (node/tui.py) and the dashboard (node/dashboard.py) show. A child that
crashes is restarted with exponential backoff (the learner resumes from its checkpoint);
after ``max_restarts`` crashes within ``restart_window_s`` the node gives up with a clear
message. SIGINT/SIGTERM: the learner finishes its phase and checkpoints, then the swarm
leaves; both get ``stop_timeout_s`` before they are killed.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.child import Child, Event
from node.config import NodeConfig
from node.report import node_report, write_json
from node.status import StatusBoard
from protocol.events import (Checkpoint, Exit, Fatal, OuterDone, Peers, Phase, Ready, RoundDone,
                             Started)
from protocol.records import RecordError, RoundRecord, StepRecord

if TYPE_CHECKING:  # prometheus_client is imported only when metrics are on
    from node.metrics import Metrics

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_GAVE_UP = 0, 1, 3
READY_TIMEOUT_S = 180.0
EXIT_LEARNER_FATAL = 2  # node.learner_process.EXIT_FATAL (not imported: it pulls in torch)


class NodeFailed(RuntimeError):
    """The node cannot go on; the message says why and what to do."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Supervisor:
    config: NodeConfig
    swarm_argv: list[str]
    learner_argv: Any  # Callable[[int | None], list[str]]: argv for the rounds still to run
    live: bool = False
    events: queue.Queue[Event] = field(default_factory=queue.Queue)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    outer_steps: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    _stop_requested: bool = False
    _stop_deadline: float = float("inf")
    _learner_done: bool = False

    def run(self) -> int:
        cfg = self.config
        from node.locks import DataDirBusy, DirLock

        try:
            lock = DirLock(cfg.data_dir / "node.lock").acquire()
        except DataDirBusy as e:
            log.error("%s", e)
            return EXIT_FAILED
        try:
            return self._run_locked()
        finally:
            lock.release()

    def _run_locked(self) -> int:
        cfg = self.config
        self.board = StatusBoard(cfg.status_path, log_rounds=not self.live)
        self.view: Any = None
        if self.live:
            from node.tui import TerminalView

            self.view = TerminalView(cfg.data_dir / "node.log").start()
        self.metrics: Metrics | None = None
        self.dashboard: Any = None
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.swarm = Child("swarm", self.swarm_argv, self.events, stderr_sink=self._sink)
        self.learner: Child | None = None
        try:
            self._start_servers()
            code = self._run()
        except NodeFailed as e:
            log.error("%s", e)
            self.board.set(phase="failed", error=str(e))
            code = e.code
        finally:
            self._shutdown()
            for s, h in old.items():
                signal.signal(s, h)
            self._write_report()
            self._flush()
            for closeable in (self.view, self.metrics, self.dashboard):
                if closeable is not None:
                    closeable.close()
        return code

    @property
    def _sink(self) -> Any:
        return self.view.child_line if self.view is not None else None

    def _start_servers(self) -> None:
        cfg = self.config
        try:
            if cfg.metrics_port is not None:
                from node.metrics import Metrics

                self.metrics = Metrics(cfg.metrics_port)
                log.info("metrics on http://0.0.0.0:%d/metrics", self.metrics.port)
            if cfg.dashboard_port is not None:
                from node.dashboard import Dashboard

                self.dashboard = Dashboard(cfg.dashboard_port)
                self.board.set(dashboard=self.dashboard.url)
                log.info("dashboard on %s", self.dashboard.url)
        except OSError as e:
            raise NodeFailed(f"cannot serve on the port asked for: {e}") from None

    def _flush(self) -> None:
        """Heartbeat, terminal view and dashboard: one status record for all three."""
        body = self.board.flush()
        if self.view is not None:
            self.view.update(self.board.state)
        if self.dashboard is not None:
            self.dashboard.publish(body, self.rounds, self.outer_steps)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._stop_requested:
            log.warning("second signal: stopping now")
            raise KeyboardInterrupt
        log.info("%s received: finishing the current phase, checkpointing, leaving",
                 signal.Signals(signum).name)
        self._stop_requested = True
        self._stop_deadline = time.monotonic() + self.config.stop_timeout_s
        self.board.set(phase="stopping")
        if self.learner is not None:
            self.learner.signal(signal.SIGTERM)

    # -- main loop ---------------------------------------------------------------------------

    def _run(self) -> int:
        self._start_swarm()
        if self._stop_requested:
            return EXIT_OK
        self._start_learner()
        last_flush = 0.0
        while not self._learner_done:
            if time.monotonic() > self._stop_deadline:
                log.warning("the learner did not stop within %.0f s; killing it",
                            self.config.stop_timeout_s)
                break  # _shutdown() kills what is left
            try:
                self._handle(self.events.get(timeout=0.5))
            except queue.Empty:
                pass
            if time.monotonic() - last_flush >= 1.0:
                self._refresh_children()
                self._flush()
                last_flush = time.monotonic()
        self.board.set(phase="stopped")
        return EXIT_OK

    def _start_swarm(self) -> None:
        self.board.set(phase="connecting")
        self.swarm.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                ev = self.events.get(timeout=0.5)
            except queue.Empty:
                self._flush()
                continue
            if ev.child != "swarm":
                continue
            event = ev.event
            if isinstance(event, Ready):
                self.info.update(peer_id=event.peer_id, addrs=event.addrs)
                self.board.set(peer_id=event.peer_id, addrs=event.addrs)
                log.info("swarm ready: %s", " ".join(event.addrs))
                return
            if isinstance(event, Exit):
                if self._stop_requested:
                    return
                raise NodeFailed(f"the swarm process exited with code {event.code} before "
                                 "it was ready (see the error above)")
        raise NodeFailed(f"the swarm process was not ready within {READY_TIMEOUT_S:.0f} s")

    def _start_learner(self) -> None:
        remaining = None
        if self.config.rounds is not None:
            remaining = max(0, self.config.rounds - len(self.rounds))
        if self.learner is None:
            self.learner = Child("learner", self.learner_argv(remaining), self.events,
                                 stderr_sink=self._sink)
        else:  # same Child: its crash history counts across restarts
            self.learner.argv = self.learner_argv(remaining)
        self.learner.start()
        self.board.set(phase="training")

    def _handle(self, ev: Event) -> None:
        event = ev.event
        if ev.child == "learner":
            if isinstance(event, Started):
                self.info.update(model=event.model)
                self.board.set(model=event.model)
            elif isinstance(event, Phase):
                self.board.on_phase(event)
            elif isinstance(event, Peers):
                self.board.on_peers(list(event.peers), links=event.links)
            elif isinstance(event, Checkpoint):
                self.board.on_checkpoint(event)
            elif isinstance(event, RoundDone):
                try:
                    done = RoundRecord.from_dict(event.record)
                except RecordError as e:  # our own learner's bug: say so, count nothing
                    log.warning("learner: malformed round record: %s", e)
                    return
                self.rounds.append(event.record)
                self.board.on_round(done)
                if self.metrics is not None:
                    self.metrics.on_round(done)
            elif isinstance(event, OuterDone):
                try:
                    step = StepRecord.from_dict(event.record)
                except RecordError as e:  # our own learner's bug: say so, count nothing
                    log.warning("learner: malformed outer record: %s", e)
                    return
                self.outer_steps.append(event.record)
                self.board.on_outer(step, len(self.outer_steps))
                if self.metrics is not None:
                    self.metrics.on_outer(step)
            elif isinstance(event, Fatal):
                self.info["fatal"] = event.error
            elif isinstance(event, Exit):
                self._on_learner_exit(event.code)
        elif ev.child == "swarm" and isinstance(event, Exit) and not self._learner_done:
            self._on_swarm_exit(event.code)

    def _on_learner_exit(self, code: int) -> None:
        if code == 0 or self._stop_requested:
            self._learner_done = True
            return
        if code == EXIT_LEARNER_FATAL:
            raise NodeFailed(f"the learner stopped: {self.info.get('fatal') or 'see the error above'}"
                             " (a restart cannot fix this; fix it and start the node again)")
        self._crashed(self.learner, code)  # type: ignore[arg-type]
        self._start_learner()

    def _on_swarm_exit(self, code: int) -> None:
        if self._stop_requested:
            return
        self._crashed(self.swarm, code)
        # the learner's socket died with the swarm: checkpoint it, restart both in order
        if self.learner is not None:
            self.learner.stop(self.config.stop_timeout_s)
            self._drain_learner_events()
        self._start_swarm()
        self._start_learner()

    def _drain_learner_events(self) -> None:
        """Keep the learner's last round/outer events; drop its exit (we stopped it)."""
        pending: list[Event] = []
        while True:
            try:
                ev = self.events.get(timeout=0.2)
            except queue.Empty:
                break
            if ev.child == "learner" and isinstance(ev.event, Exit):
                continue
            if ev.child == "learner":
                self._handle(ev)
            else:
                pending.append(ev)
        for ev in pending:
            self.events.put(ev)

    def _crashed(self, child: Child, code: int) -> None:
        n = child.record_crash(window_s=self.config.restart_window_s)
        if n > self.config.max_restarts:
            raise NodeFailed(
                f"gave up: the {child.name} process crashed {n} times within "
                f"{self.config.restart_window_s:.0f} s (last exit code {code}); see the errors "
                "above. Fix the cause and start the node again: it resumes from its checkpoint.",
                code=EXIT_GAVE_UP)
        backoff = min(30.0, 2.0 ** (n - 1))
        log.warning("%s exited with code %s; restarting in %.0f s (crash %d of %d allowed)",
                    child.name, code, backoff, n, self.config.max_restarts)
        if self.metrics is not None:
            self.metrics.restarts.labels(child.name).inc()
        self.board.set(phase=f"restarting {child.name}")
        self._flush()
        time.sleep(backoff)

    def _refresh_children(self) -> None:
        for c in (self.swarm, self.learner):
            if c is not None:
                self.board.child(c.name, pid=c.pid, alive=c.alive(), restarts=len(c.crashes))

    def _shutdown(self) -> None:
        if self.learner is not None and self.learner.alive():
            grace = max(1.0, min(self.config.stop_timeout_s, self._stop_deadline - time.monotonic()))
            self.learner.stop(grace)
        self._drain_learner_events()
        if self.swarm.alive():
            self.swarm.stop(min(15.0, self.config.stop_timeout_s))
        self._refresh_children()

    def _write_report(self) -> None:
        if self.config.report is None:
            return
        report = node_report(peer_id=self.info.get("peer_id") or "", model=self.info.get("model"),
                             rounds=self.rounds, outer_steps=self.outer_steps,
                             addrs=self.info.get("addrs"),
                             restarts={c.name: len(c.crashes) for c in (self.swarm, self.learner)
                                       if c is not None},
                             status=self.board.state.get("phase"))
        write_json(self.config.report, report)
        log.info("node report written to %s", self.config.report)
