"""The learner child process: torch + transformers (+ hivemind for outer steps); never libp2p.

    python -m node.learner_process --config-json '{"ipc_path":..., "rounds":..., "learner":
        {...LearnerConfig...}, "outer": {...OuterConfig...}, "data_dir": ...}'

Talks to the swarm process through the Unix-socket bridge, runs the SAPO loop, does DiLoCo
outer steps through ``collectives.OuterLoop`` and reports JSON events on stdout for the
supervisor: ``started``, ``phase`` (where a round is: name, done/total; throttled),
``round``, ``peers``, ``outer``, ``checkpoint``, ``done``. SIGTERM/SIGINT: finish the current
phase, checkpoint, exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from collectives.config import OuterConfig
from node.child import supervisor_pid, watch_parent
from node.orphans import (ORPHAN_GRACE_S, is_learner_on, leave_orphaned, reap_children,
                          sweep_leftovers)
from protocol.events import (Checkpoint, ChildEvent, Done, Fatal, OuterDone, Peers, Phase,
                             RoundDone, Started)
from protocol.records import RoundRecord

log = logging.getLogger("node.learner_process")

MAX_PEERS_REPORTED = 64
"""The ``peers`` event lists at most this many peers (fresh identities are free)."""
EXIT_FATAL = 2
"""Exit code for errors a restart cannot fix (bad model id, corrupt checkpoint, full disk,
a data dir a live node uses): the supervisor stops instead of restarting."""


class EventPipe:
    """Event lines to the supervisor, from any thread (the checkpoint writer emits too).

    A closed pipe means the supervisor is gone: lines are dropped and ``broken`` is set
    instead of raising. Seen: a BrokenPipeError from ``emit`` in ``main``'s ``finally``
    skipped the reaping of hivemind's children, and the orphaned learner then hung forever in
    multiprocessing's exit-time join of its DHT process, holding the data dir's lock."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.broken = False

    def write(self, line: str) -> None:
        with self._lock:
            if self.broken:
                return
            try:
                self._stream.write(line)
                self._stream.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.broken = True
                with contextlib.suppress(OSError):  # drop the buffered line with the fd
                    self._stream.close()


_events = EventPipe(sys.stdout)
"""Where event lines go: the original stdout (see ``_reserve_stdout_for_events``)."""


def _reserve_stdout_for_events() -> None:
    """Keep fd 1 for event lines only: library code that prints (reasoning_gym's ``bf``
    generator writes dots to stdout) would otherwise corrupt them. Events get a private dup of
    fd 1; fd 1 itself and ``sys.stdout`` now point at stderr (the log)."""
    global _events
    _events = EventPipe(os.fdopen(os.dup(1), "w", buffering=1))
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(event: ChildEvent) -> None:
    """Tell the supervisor (protocol/events.py)."""
    _events.write(event.line() + "\n")


TRUST_AFTER_ROUNDS = 2
"""A peer whose validated rollout batches for our model arrived in this many of our rounds
may anchor a joiner's outer state (collectives.OuterLoop ``trust``)."""
MAX_TRACKED_SENDERS = 4096


class AnnouncingBridge:
    """Wraps the bridge: remembers the model fingerprint announced by the learner, adds the
    collective's addresses to every announcement, and remembers in how many rounds each
    sender delivered validated rollout batches for our model (the outer loop's ``trust``)."""

    def __init__(self, bridge: Any, peer_id: str) -> None:
        self._bridge = bridge
        self.peer_id = peer_id  # seeds this node's task sampling: must differ per node
        self.model: str | None = None
        self.collective_addrs: tuple[str, ...] = ()
        self._rounds_with_rollouts: dict[str, int] = {}
        self.round_senders: set[str] = set()
        """Senders of the rollout batches received since the last round record."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bridge, name)

    def receive(self, type_: str, *, max_items: int = 256) -> list[Any]:
        got = self._bridge.receive(type_, max_items=max_items)
        if type_ == "rollouts":
            for r in got:
                if len(self.round_senders) < MAX_PEERS_REPORTED:
                    self.round_senders.add(r.sender)
        senders = {r.sender for r in got
                   if getattr(r.message, "model", None) == self.model and self.model}
        for sender in senders:  # one count per receive call (once per round)
            if sender in self._rounds_with_rollouts \
                    or len(self._rounds_with_rollouts) < MAX_TRACKED_SENDERS:
                self._rounds_with_rollouts[sender] = self._rounds_with_rollouts.get(sender, 0) + 1
        return got

    def take_round_senders(self) -> list[str]:
        """Senders of rollout batches received since the last call (the round record's
        ``rollouts_from``), at most MAX_PEERS_REPORTED."""
        out, self.round_senders = sorted(self.round_senders), set()
        return out

    def trusted(self, peer_id: str) -> bool:
        """Whether ``peer_id`` sent us validated rollouts in >= TRUST_AFTER_ROUNDS rounds."""
        return self._rounds_with_rollouts.get(peer_id, 0) >= TRUST_AFTER_ROUNDS

    def announce(self, *, model: str, collective_addrs: tuple[str, ...] = (),
                 capabilities: tuple[str, ...] = ()) -> None:
        if self.model is None:
            emit(Started(model=model))
        self.model = model
        self._bridge.announce(model=model, collective_addrs=tuple(collective_addrs)
                              or self.collective_addrs, capabilities=("train", *capabilities))


START_WAIT_S = 180.0
"""How long a run that ended by itself waits for its collective to come up, for its last
steps (``OuterLoop.finish``): the start took up to ~110 s on a loaded 2-core box."""
ABANDON_S = 15.0
"""How long leaving waits for an abandoned collective start to end what it had started
(``Startup.cancel``); it answers within about a second unless stuck where it starts nothing."""


class OuterHook:
    """``outer(model, round)`` for run_learner: starts the collective after the first round
    (the group is the model fingerprint, known once the learner announced it) on a thread of
    its own (``collectives.Startup``: p2pd, reachability probes, DHT, genesis weights), never
    on the training thread; runs its outer steps once it is up."""

    def __init__(self, config: OuterConfig, bridge: AnnouncingBridge, data_dir: str,
                 learner_config: Any = None, stop: threading.Event | None = None) -> None:
        self.config = config
        self.bridge = bridge
        self.data_dir = data_dir
        self.learner_config = learner_config
        self.loop: Any = None
        self.stop = stop
        """Set on SIGTERM/SIGINT: cuts the last step's wait for the peers short, and
        abandons a collective still starting."""
        self._startup: Any = None
        """The collective being built (collectives.Startup) until ``loop`` takes it."""
        self._rounds_waiting = 0
        """Rounds trained while the collective was starting (they count in its first step)."""
        self._finishing = False
        """finish() runs: the outer step is the node's phase (``_on_stage`` shows its stages)."""

    def _genesis(self, model: Any) -> Any:
        """θ of the base model (flat): the outer state's version 0, the same on every node of
        the group. The loop starts after the first round, so the live params have moved."""
        if self.learner_config is None:
            return None
        try:
            from collectives.state import flatten
            from node.learner.policy import load_policy

            base = load_policy(self.learner_config.policy, self.learner_config.data_dir)
            flat = flatten(list(base.model.parameters()))
            if flat.numel() != sum(p.numel() for p in model.parameters()):
                raise ValueError("the base model's parameters differ from the trained model's")
            return flat
        except Exception as e:  # noqa: BLE001 - without it the node still trains (alone)
            log.warning("could not load the base weights for the outer state: %s", e)
            return None

    def _discover(self) -> list[str]:
        out: list[str] = []
        for p in self.bridge.peers():
            if p.model != self.bridge.model:
                continue
            if p.addrs and all("/p2p-circuit" in a for a in p.addrs):
                # behind NAT: nobody can dial it. Only once it announced its collective: its
                # swarm process refuses a tunnel before (nothing to forward to), and our
                # p2pd then backs off from the tunnel's address (go-libp2p dial backoff)
                if p.collective_addrs:
                    out.extend(self._tunnelled(p.peer_id))
            else:
                out.extend(p.collective_addrs)
        return out

    def _tunnelled(self, peer_id: str) -> list[str]:
        """The collective address of a peer reachable only through relays: a local port the
        swarm process tunnels to it (swarm.tunnel)."""
        try:  # the swarm process keeps the listener; asking again is cheap
            host, port = self.bridge.tunnel(peer_id)
        except Exception as e:  # noqa: BLE001 - refused or too many: skip the peer this time
            log.warning("no collective tunnel to %s: %s", peer_id, e)
            return []
        return [f"/ip4/{host}/tcp/{port}/p2p/{peer_id}"]

    def _build(self, model: Any, abort: threading.Event) -> Any:
        """The outer loop (on the startup thread; ``abort`` set abandons it). Reads the live
        params only for their count: theta is the genesis weights (the params themselves,
        read while training moves them, only if those failed to load: a node training alone)."""
        from collectives import OuterLoop
        from protocol import load_or_create_identity

        genesis = self._genesis(model)
        loop = OuterLoop(self.config, identity=load_or_create_identity(self.data_dir),
                         group=self.bridge.model or "unknown", params=model,
                         data_dir=self.data_dir, discover=self._discover,
                         trust=self.bridge.trusted, genesis=genesis, abort=abort,
                         on_stage=self._on_stage)
        loop.collective_addrs()  # asked once (cached) here: announcing it then costs nothing
        return loop

    def _started(self, model: Any) -> Any:
        """The loop once the collective is up (adopted and announced here, on the training
        thread: the bridge's announcement state belongs to it); None while it starts. The
        first call starts it; a start that failed raises here, as it did when it ran inline."""
        if self.loop is not None:
            return self.loop
        if self._startup is None:
            from functools import partial

            from collectives import Startup

            log.info("peer %s: starting the collective in the background",
                     self.bridge.peer_id[:16])
            self._startup = Startup(partial(self._build, model))
        loop = self._startup.take()
        if loop is None:
            self._rounds_waiting += 1  # trained without the loop; counted once it is up
            return None
        self._adopt(loop)
        return loop

    def _adopt(self, loop: Any) -> None:
        loop.count_rounds(self._rounds_waiting)
        self.loop = loop
        self.bridge.collective_addrs = tuple(loop.collective_addrs())
        self.bridge.announce(model=self.bridge.model or "unknown")
        log.info("peer %s: collective up after %.1f s (%d rounds trained meanwhile): %s",
                 self.bridge.peer_id[:16], self._startup.seconds or 0.0, self._rounds_waiting,
                 ", ".join(self.bridge.collective_addrs))

    def _on_stage(self, stage: str) -> None:
        """An attempt reached ``stage`` (rendezvous, exchange, commit): shown while the run's
        last steps are the node's phase (``finish``); a background step's stages are not
        (the round's own phases go on meanwhile)."""
        if self._finishing:
            emit(Phase(phase="outer", stage=stage))

    def __call__(self, model: Any, round_: int) -> dict[str, Any] | None:
        """After every round: never waits for the network. The collective starts in the
        background (``_started``); once it is up, outer steps start on the clock and run in
        the background while rounds go on (OuterLoop.after_round); a finished one is applied
        here, between rounds, and its record returned."""
        if self.stop is not None and self.stop.is_set() and self.loop is None:
            return None  # leaving: close() abandons a collective still starting
        if self._started(model) is None:
            return None
        if self.stop is not None and self.stop.is_set():
            # leaving (SIGTERM): collect a step that finished, start none. Seen: a node
            # whose last round ended as the signal came started an attempt at the next
            # meeting, which the others, leaving too, never attended; it waited there alone
            record = self.loop.collect()
        else:
            record = self.loop.after_round(round_)
        if record is None:
            return None
        out = record.to_dict()
        emit(OuterDone(record=out))
        return out

    def state(self) -> Any:
        """The node's outer state now (a copy, for checkpoints); None before the collective
        is up."""
        return self.loop.state() if self.loop is not None else None

    def finish(self) -> None:
        """The run ended by itself: its last steps (``OuterLoop.finish``: keep attending the
        meetings of the peers still training until they all ended too, step with them and
        serve the result, bounded by ``final_wait_s``), so the swarm ends at one state. A
        step still running is collected first (its record is emitted), and a collective
        still starting is waited for (at most START_WAIT_S). run_learner calls this before
        its final checkpoint: the weights it keeps are the ones these steps leave."""
        if self.loop is None and self._startup is not None:
            self._finish_start(final_step=True)
        if self.loop is None:
            return
        try:
            self._collect()
            self._finishing = True  # the round is over: its phase is the outer step's
            emit(Phase(phase="outer"))
            self.loop.finish(stop=self.stop,
                             on_record=lambda r: emit(OuterDone(record=r.to_dict())))
        except Exception as e:  # noqa: BLE001 - leaving anyway
            log.warning("outer step at exit: %s", e)

    def close(self) -> None:
        """Leave: collect a step still running (its record is emitted) and tell finished
        peers not to wait for us. A collective still starting is abandoned."""
        if self.loop is None and self._startup is not None:
            self._finish_start(final_step=False)
        if self.loop is None:
            return
        try:
            self._collect()
        except Exception as e:  # noqa: BLE001 - leaving anyway
            log.warning("outer step at exit: %s", e)
        self.loop.close()

    def _collect(self) -> None:
        # < stop timeout
        record = self.loop.poll(wait=min(self.config.schedule.deadline_s + 5, 30.0))
        if record is not None:
            emit(OuterDone(record=record.to_dict()))

    def _finish_start(self, *, final_step: bool) -> None:
        """Take the loop still starting (the run ended by itself) or abandon it."""
        stopped = self.stop.is_set if self.stop is not None else (lambda: False)
        if final_step:
            deadline = time.monotonic() + START_WAIT_S
            while not self._startup.wait(0.2) and not stopped() \
                    and time.monotonic() < deadline:
                pass
            if self._startup.done() and not stopped():
                try:
                    loop = self._startup.take()
                except Exception as e:  # noqa: BLE001 - leaving anyway
                    log.warning("the collective did not start: %s", e)
                    return
                if loop is not None:
                    self._adopt(loop)
                    return
        t0 = time.monotonic()
        ended = self._startup.cancel(timeout=ABANDON_S)
        log.info("collective start abandoned in %.1f s%s", time.monotonic() - t0,
                 "" if ended else " (its thread is still in a part that starts nothing)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node.learner_process")
    parser.add_argument("--config-json", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s learner %(name)s: %(message)s")
    payload = json.loads(args.config_json)
    _reserve_stdout_for_events()

    from node.learner.config import LearnerConfig

    try:  # the supervisor checked both tables already (node/tables.py): the same builders
        config = LearnerConfig.from_dict(payload["learner"])
        outer_config = OuterConfig.from_dict(payload.get("outer") or {})
    except (ValueError, TypeError) as e:
        log.error("invalid learner configuration: %s", e)
        emit(Fatal(error=f"invalid configuration: {e}"))
        return EXIT_FATAL
    from node.learner.errors import LearnerError
    from node.learner.fit import fit_model

    try:  # before the data dir's lock, the swarm's socket and any weights: refused in seconds
        config = fit_model(config)  # resolves --model auto; the step's memory must fit
    except LearnerError as e:
        log.error("%s", e)
        emit(Fatal(error=str(e)))
        return EXIT_FATAL
    from node.ipc_client import SocketBridge
    from node.learner.loop import run_learner
    from node.locks import DataDirBusy, DirLock

    supervisor = supervisor_pid()
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    # the parent-death signal only sets ``stop``; this also bounds the way out
    watch_parent(supervisor, on_gone=lambda why: leave_orphaned(why, stop),
                 broken=lambda: _events.broken)
    data_dir = Path(payload["data_dir"])
    try:  # a learner of a killed node may still be checkpointing: wait for it, or stop it
        lock = DirLock(data_dir / "learner.lock").acquire(
            wait_s=ORPHAN_GRACE_S + 10, supervisor=supervisor,
            reclaim=lambda pid: is_learner_on(pid, data_dir))
    except DataDirBusy as e:
        log.error("%s", e)
        emit(Fatal(error=str(e)))
        return EXIT_FATAL
    sweep_leftovers(data_dir, supervisor)
    from protocol import load_or_create_identity

    peer_id = load_or_create_identity(payload["data_dir"]).peer_id
    bridge = AnnouncingBridge(SocketBridge.connect(payload["ipc_path"], wait_s=60), peer_id)
    outer = OuterHook(outer_config, bridge, payload["data_dir"], config, stop)
    try:
        report = run_learner(config, bridge, rounds=payload.get("rounds"), stop=stop,
                             on_round=lambda rec: _on_round(rec, bridge), outer=outer,
                             on_phase=lambda name, done, total: emit(
                                 Phase(phase=name, done=done, total=total)),
                             on_checkpoint=lambda r, path, secs: emit(
                                 Checkpoint(round=r, path=str(path), seconds=round(secs, 3))),
                             swarm_id=outer.config.swarm_id, outer_state=outer.state,
                             finish=outer.finish)
    except (LearnerError, ValueError) as e:
        log.error("%s", e)
        emit(Fatal(error=str(e)))
        return EXIT_FATAL
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        log.error("out of disk space writing %s: free space in the data dir and start the node "
                  "again (it resumes from its last good checkpoint)", e.filename)
        emit(Fatal(error=f"out of disk space: {e.filename}"))
        return EXIT_FATAL
    finally:
        emit(Phase(phase="leaving"))
        with contextlib.ExitStack() as leave:  # each step runs even if one before it raised
            leave.callback(reap_children)
            leave.callback(bridge.close)
            outer.close()
    emit(Done(rounds=len(report.get("rounds", []))))
    lock.release()
    return 0


def _on_round(record: RoundRecord, bridge: Any) -> None:
    done = _with_peers(record, bridge).with_observed(
        rollouts_from=bridge.take_round_senders())
    emit(RoundDone(record=done.to_dict()))
    try:
        peers = bridge.peers()[:MAX_PEERS_REPORTED]
    except Exception:  # the status view must never kill training
        return
    try:
        links: dict[str, str] | None = dict(bridge.links())
    except Exception:  # a bridge that cannot tell: the status keeps the last links
        links = None
    emit(Peers(peers=tuple({"peer_id": p.peer_id, "model": p.model,
                            "capabilities": list(p.capabilities)} for p in peers),
               links=links))


def reachability(stats: dict[str, int]) -> str:
    """The swarm process's verdict (swarm.reachability.STATES): public, relayed, unreachable
    or unknown; it reports one ``reachability_<state>`` counter set to 1."""
    for state in ("public", "relayed", "unreachable"):
        if stats.get(f"reachability_{state}"):
            return state
    return "unknown"


def _with_peers(record: RoundRecord, bridge: Any) -> RoundRecord:
    try:
        stats = bridge.stats()
    except Exception:  # the status line must never kill training
        return record
    # the swarm process's counters are totals since it started, not per round
    return dataclasses.replace(
        record, peers=int(stats.get("peers", 0)), reachability=reachability(stats),
        gossip_rejected={k[len("rejected_"):]: int(v) for k, v in stats.items()
                         if k.startswith("rejected_") and v}).with_observed(
        # what the swarm process did not deliver (e.g. ``outbound_queue_full``: a peer too
        # slow to read our gossip) and how many peers its pubsub exchanges with
        gossip_dropped={k[len("dropped_"):]: v for k, v in stats.items()
                        if k.startswith("dropped_") and v},
        pubsub_peers=stats.get("pubsub_peers", 0),
        rollout_subscribers=stats.get("subscribers_rollouts", 0),
        # feeds mode (swarm.feed_standing): open feeds by their source's kind (proven: it
        # delivered groups with signal after our re-scoring; live: valid groups, no signal
        # yet; trial: nothing yet) and those holding their slot for nothing now (idle); the
        # running totals of feeds closed as idle or without signal, of slot-rounds held by
        # idle sources, of sources tried while searching (our own groups carried
        # signal, no held feed brought any: FeedClient._search), and of feeds not opened
        # because their source's network already held its slots (swarm.networks)
        feeds={"proven": stats.get("feed_sources_proven", 0),
               "live": stats.get("feed_sources_live", 0),
               "trial": stats.get("feed_sources_trial", 0),
               "idle": stats.get("feed_sources_idle", 0),
               "dropped_idle": stats.get("feed_dropped_idle", 0),
               "dropped_no_signal": stats.get("feed_dropped_no_signal", 0),
               "idle_slot_rounds": stats.get("feed_idle_slot_rounds", 0),
               "searched": stats.get("feed_search_rotations", 0),
               "network_full": stats.get("feed_network_full", 0)})


if __name__ == "__main__":
    sys.exit(main())
