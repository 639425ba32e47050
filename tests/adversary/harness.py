"""One run of a small real swarm on 127.0.0.1, with or without hostile peers.

A bootstrap peer and ``honest`` (two by default) honest ``swarm-node join`` nodes
(``tests/e2e/procs.py``) with fixed identities, ports and seeds, so a baseline and an attacked
run differ only by the attackers. Attackers (``python -m tests.adversary.hostile``) start
first; once their imports are done the nodes start (with ``Plan.late_s``, the last one that
long after the attackers are in the swarm), the attackers attack as soon as they reach them,
and are stopped (SIGTERM: they report) when the nodes are done. While it
runs, a sampler records each node's learner and swarm process: peak RSS and CPU seconds.
``run_swarm`` returns everything as one JSON-able dict (tests assert on it, the benchmark
writes it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from cryptography.hazmat.primitives import serialization

from node.child import kill_group
from protocol import Identity, atomic_write_bytes
from tests.adversary.attacks import Attack
from tests.e2e.procs import Bootstrap, join, log_tail
from tests.swarm.procs import short_tmpdir

__all__ = ["Plan", "rounds_beside_others", "run_swarm"]

SWARM_ID = "adversary"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one run does."""

    rounds: int = 6
    """Rounds every honest node runs."""
    attacks: tuple[tuple[Attack, dict[str, Any]], ...] = ()
    """Attackers to start (each its own process) with their JSON overrides."""
    seed: int = 0
    """Learner seed of the honest nodes (their identities are fixed too)."""
    every_rounds: int = 3
    """DiLoCo outer step after every this many rounds."""
    timeout_s: float = 300.0
    """The nodes are stopped (SIGTERM: they still write their reports) after this long."""
    keep: bool = False
    """Keep the run's directory (logs, data dirs) instead of deleting it."""
    honest: int = 2
    """Honest ``join`` nodes (honest-0, honest-1, ...)."""
    slowdown: float = 1.0
    """The honest nodes' ``[learner] slowdown_for_tests``: rounds stretched to this multiple
    of their compute (a sleep). The embedded model's rounds take 0.05-0.2 s, so 60 rounds
    are 5-10 s: shorter than a feed's probe or rotation, and a measure per round then
    measures the swarm's first seconds (who announced first) more than any defence."""
    late_s: float = 0.0
    """The last honest node joins this long after the other honest nodes started, and not
    before the attackers are in the swarm (their ``ready`` line): a node joining a swarm
    where a farm already sits, with no head start over it, and with or without a farm at the
    same point of the others' training. It runs ``rounds``; the other honest nodes train
    until it is done, then are stopped."""
    rollout_mode: str = "flood"
    """The honest nodes' ``[gossip] rollout_mode``: the gossip attackers publish on the
    rollouts topic (flood); the feed farm (feeds.py) needs "feeds"."""
    farm_ip: str = ""
    """The attackers listen on, and dial from, this 127/8 address (e.g. 127.0.1.1): a farm
    on a machine of its own, in another network (swarm.networks) than the honest nodes on
    127.0.0.1, whose ``[gossip.feeds] loopback_networks`` is then on. "": 127.0.0.1, one
    machine for all (no networks: loopback is none)."""
    max_per_network: int = 2
    """The honest nodes' ``[gossip.feeds] max_per_network`` (0: no cap)."""

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.every_rounds < 1 or not self.timeout_s > 0 \
                or self.honest < 1 or not 1.0 <= self.slowdown <= 100.0 \
                or not 0.0 <= self.late_s < self.timeout_s or (self.late_s and self.honest < 2):
            raise ValueError("Plan: rounds, every_rounds, timeout_s and honest must be "
                             "positive, slowdown in [1, 100], late_s in [0, timeout_s) "
                             "with another honest node to join late to")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"honest-{i}" for i in range(self.honest))


def honest_identity(name: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"swarm-node/adversary/{name}".encode()).digest())


@functools.cache
def embedded_fingerprint() -> str:
    """The fingerprint every honest node announces for the embedded model
    (``node.learner.policy``): the model is public, so a farm can announce it from the start
    instead of waiting to hear it from the victims. Loaded as the nodes load it (their
    ``[learner.policy]`` is the default)."""
    from node.learner.config import PolicyConfig
    from node.learner.policy import load_policy

    with tempfile.TemporaryDirectory(prefix="sn-fp-") as tmp:
        return load_policy(PolicyConfig(), tmp).fingerprint


def _write_identity(data_dir: Path, identity: Identity) -> None:
    pem = identity.private_key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
    atomic_write_bytes(data_dir / "identity.key", pem, mode=0o600)


def _free_port_pair(hold: list[socket.socket] | None = None) -> int:
    """A port p with p and p+1 free (swarm and collective ports of one node). ``hold``: the
    two sockets stay bound (appended to it) until the caller closes them, so that no
    connection takes either port as its ephemeral one meanwhile (a node joining 150 s later
    found its port taken: the farm's 50 keys had dialled out from it)."""
    for _ in range(100):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s2 = socket.socket()
        try:
            if port >= 65535:
                raise OSError("no port above")
            s2.bind(("127.0.0.1", port + 1))
        except OSError:
            s.close()
            s2.close()
            continue
        if hold is None:
            s.close()
            s2.close()
        else:
            hold += [s, s2]
        return int(port)
    raise RuntimeError("no free pair of ports")


def _config(base: Path, plan: Plan) -> Path:
    path = base / "node.toml"
    path.write_text(
        # tiny_add pinned: the steering payloads (and the measurements) are tiny_add groups
        f"[learner]\nseed = {plan.seed}\ncheckpoint_every = 0\n"
        f"slowdown_for_tests = {plan.slowdown}\n\n[learner.policy]\nthreads = 1\n\n"
        f"[learner.tasks]\nfamilies = [\"tiny_add\"]\n\n"
        # the gossip attackers publish rollouts on gossip (tests/adversary/gossip.py): flood
        # mode subscribes that topic; in feeds mode they would have to be picked as sources
        f"[gossip]\nrollout_mode = \"{plan.rollout_mode}\"\n\n"
        f"[gossip.feeds]\nmax_per_network = {plan.max_per_network}\n"
        f"loopback_networks = {'true' if plan.farm_ip else 'false'}\n\n"
        f"[outer]\nevery_rounds = {plan.every_rounds}\n"
        f"schedule = {{ join_window_s = 3.0, deadline_s = 20.0 }}\n")
    return path


@dataclass
class Sampler:
    """Samples each node's learner and swarm process (found by command line) twice a second."""

    procs: dict[str, subprocess.Popen[bytes]]
    peak_rss: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        for name, proc in list(self.procs.items()):  # a late node is added while it runs
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                try:
                    cmd = " ".join(child.cmdline())
                    kind = "learner" if "node.learner_process" in cmd else \
                        "swarm" if "-m swarm" in cmd else None
                    if kind is None:
                        continue
                    rss = child.memory_info().rss / 2**20
                    cpu = child.cpu_times()
                except psutil.Error:
                    continue
                key = f"{name}/{kind}"
                self.peak_rss[key] = max(self.peak_rss.get(key, 0.0), rss)
                self.cpu_s[key] = cpu.user + cpu.system

    def run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class Attacker:
    """One hostile process; ``ready`` holds its first line, ``stop()`` returns its last."""

    def __init__(self, attack: Attack, args: dict[str, Any], log: Path) -> None:
        self.attack = attack
        with open(log, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.adversary.hostile", attack.value, json.dumps(args)],
                stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL,
                env=os.environ.copy(),
                start_new_session=True)  # kill() reaches its p2pd and DHT child (takeover)
        self.log = log
        self.ready: dict[str, Any] = {}

    def wait_for(self, event: str, timeout_s: float) -> None:
        """Wait for the line ``{"event": event}`` ("loaded": imports done; "ready": in the
        victims' swarm, attacking)."""
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().decode() if r else ""
        if not line.startswith("{") or json.loads(line).get("event") != event:
            raise RuntimeError(f"attacker {self.attack.value}: no {event!r} line in "
                               f"{timeout_s:.0f} s (got {line[:200]!r}):\n"
                               + self.log.read_text(errors="replace")[-3000:])
        self.ready = json.loads(line)

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            out, _ = self.proc.communicate()
        lines = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
        done = lines[-1] if lines and lines[-1].get("event") == "done" else {
            "event": "no_result", "code": self.proc.returncode,
            "log": self.log.read_text(errors="replace")[-2000:]}
        return {**self.ready, **done}

    def kill(self) -> None:
        """SIGKILL its process group: a takeover's p2pd and DHT child die with it (SIGKILL of
        the python alone leaves both running, orphaned: the DHT child holds p2pd's pipe)."""
        kill_group(self.proc.pid)


def run_swarm(plan: Plan) -> dict[str, Any]:
    """Run ``plan``; returns ``{"nodes": {name: {...}}, "attackers": {...}, ...}``."""
    base = short_tmpdir()
    marker_dir = base / "markers"
    marker_dir.mkdir()
    config = _config(base, plan)
    boot = Bootstrap(base / "bootstrap", SWARM_ID)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    victims: dict[str, dict[str, str]] = {}
    attackers: list[Attacker] = []
    joined_at: dict[str, float] = {}
    timed_out, ready_s = False, 0.0
    late = plan.names[-1:] if plan.late_s else ()
    held: dict[str, list[socket.socket]] = {name: [] for name in late}
    try:
        for name in plan.names:
            ident = honest_identity(name)
            port = _free_port_pair(held.get(name))
            victims[name] = {"swarm": f"/ip4/127.0.0.1/tcp/{port}/p2p/{ident.peer_id}",
                             "collective": f"/ip4/127.0.0.1/tcp/{port + 1}/p2p/{ident.peer_id}"}
        for i, (attack, extra) in enumerate(plan.attacks):
            args = {"data_dir": str(base / f"attacker-{i}"), "swarm_id": SWARM_ID,
                    "duration_s": plan.timeout_s, "marker_dir": str(marker_dir),
                    "victims": [v["swarm"] for v in victims.values()],
                    "collective": [v["collective"] for v in victims.values()],
                    **({"listen_ip": plan.farm_ip} if plan.farm_ip else {}), **extra}
            attackers.append(Attacker(attack, args, base / f"attacker-{i}.log"))
        for a in attackers:  # imports done before the nodes start: they attack from round 0
            a.wait_for("loaded", 180)
        started = time.monotonic()

        def start(name: str, rounds: int) -> None:
            for sock in held.pop(name, ()):
                sock.close()
            data_dir = base / name
            data_dir.mkdir()
            _write_identity(data_dir, honest_identity(name))
            port = victims[name]["swarm"].split("/")[4]
            procs[name] = join(data_dir, boot.addr, SWARM_ID, "--config", str(config),
                               "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--rounds",
                               str(rounds), "--report", str(data_dir / "report.json"))

        for name in plan.names:
            if name not in late:
                # with a late node, the others train until it is done (stopped then): a farm
                # of 50 keys takes a minute to be in, longer than their own rounds
                start(name, plan.rounds * 100 if late else plan.rounds)
        with Sampler(procs) as sampler:
            for a in attackers:
                a.wait_for("ready", 180)
            ready_s = time.monotonic() - started
            for name in late:
                time.sleep(max(0.0, started + plan.late_s - time.monotonic()))
                joined_at[name] = time.time()
                start(name, plan.rounds)
            deadline = started + plan.timeout_s
            for name in late or plan.names:
                try:
                    procs[name].wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
            for p in procs.values():  # SIGTERM: they still write their reports
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs.values():
                p.wait(timeout=120)
        results = {a.attack.value: a.stop() for a in attackers}
    finally:
        for sock in (x for socks in held.values() for x in socks):
            sock.close()
        for a in attackers:
            a.kill()  # also what a finished attacker may have left in its group
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        boot.stop()
    nodes = {}
    for name in plan.names:
        try:
            report = json.loads((base / name / "report.json").read_text())
        except (OSError, json.JSONDecodeError):
            report = {"rounds": [], "outer_steps": [], "log": log_tail(base / name)}
        nodes[name] = {"report": report, "exit_code": procs[name].returncode,
                       "joined_late_at": joined_at.get(name),
                       "refused_commit_lines": _refused_commit_lines(base / name),
                       "peer_id": honest_identity(name).peer_id,
                       "learner_peak_rss_mb": sampler.peak_rss.get(f"{name}/learner", 0.0),
                       "swarm_peak_rss_mb": sampler.peak_rss.get(f"{name}/swarm", 0.0),
                       "learner_cpu_s": sampler.cpu_s.get(f"{name}/learner", 0.0),
                       "swarm_cpu_s": sampler.cpu_s.get(f"{name}/swarm", 0.0)}
    out = {"plan": {"rounds": plan.rounds, "seed": plan.seed, "every_rounds": plan.every_rounds,
                    "slowdown": plan.slowdown, "late_s": plan.late_s,
                    "honest": plan.honest, "rollout_mode": plan.rollout_mode,
                    "farm_ip": plan.farm_ip, "max_per_network": plan.max_per_network,
                    "attacks": [[a.value, extra] for a, extra in plan.attacks]},
           "nodes": nodes, "attackers": results, "timed_out": timed_out,
           "markers": sorted(p.name for p in marker_dir.iterdir()),
           "seconds": round(time.monotonic() - started, 1), "base_dir": str(base),
           # when the attackers were in, after the honest nodes started (a late node joins
           # at late_s or then, whichever is later)
           "attackers_ready_s": round(ready_s, 1)}
    if not plan.keep:
        shutil.rmtree(base, ignore_errors=True)
    return out


def rounds_beside_others(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per honest node of ``run_swarm``'s result: its rounds published while another honest
    node ran (from 1 s after that node's first round to its last), the rounds in which an
    honest sender was possible."""
    rounds = {n: node["report"]["rounds"] for n, node in run["nodes"].items()}
    alive = {n: (rs[0]["published_at"] + 1.0, rs[-1]["published_at"])
             for n, rs in rounds.items() if rs}
    return {name: [r for r in rs if any(lo <= r["published_at"] <= hi
                                        for o, (lo, hi) in alive.items() if o != name)]
            for name, rs in rounds.items()}


def _refused_commit_lines(data_dir: Path) -> int:
    """Catch-ups that refused newer-version commits, as the node logged them: also those of a
    finished node's meetings (OuterLoop.finish), which emit no step record when nobody steps."""
    try:
        text = (data_dir / "node.log").read_text(errors="replace")
    except OSError:
        return 0
    return sum("commit(s) claiming newer versions" in line for line in text.splitlines())
