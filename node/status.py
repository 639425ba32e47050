"""What a person (or a health check) can see of a running node.

``StatusBoard`` folds child events into one status record and rewrites ``status.json``
atomically every second (the heartbeat that ``swarm-node status`` and the Docker HEALTHCHECK
read). The terminal view (node/tui.py) and the dashboard (node/dashboard.py) show this same
record; without a terminal the board logs one line per round instead.

Record fields (besides the counters): ``phase`` is the node's state (connecting, training,
stopping, stopped, failed, restarting <child>); ``round_phase`` is where the learner is within
a round (``name``, ``done``/``total`` — total 0 when there is no measure — and ``since``);
``peers_seen`` lists peers with the time they were last listed as live and their ``link``
now: ``direct``, ``relayed`` (every connection to it goes through a circuit relay, a
``/p2p-circuit`` address: swarm.holepunch) or None (not connected); ``links`` (None until the
learner's first report) counts the connected peers by link — ``direct``, ``relayed`` — and
``peers`` maps each (at most ``MAX_PEERS``) to its link; ``reachability`` is
"unknown" until the swarm process reports it in the round record, then ``public`` (peers
dialled this node back), ``relayed`` (reachable only through relays) or ``unreachable``
(swarm.reachability; the swarm process's log says what to do). ``feeds`` (feeds mode; None
until the first round says) is the round record's view of the feed sources
(swarm.feed_standing): open feeds by their source's kind — ``proven`` (it delivered groups
with signal), ``live`` (valid groups, no signal yet), ``trial`` (nothing yet) — ``idle`` (open
feeds holding their slot for nothing now), and the running totals ``dropped_idle``,
``dropped_no_signal``, ``idle_slot_rounds`` (slot-rounds held by idle sources) and
``searched`` (sources tried while our own groups carried signal and no held feed brought any,
swarm.feeds) and ``network_full`` (feeds not opened: their source's network already held
``feeds.max_per_network`` slots, swarm.networks): a farm of identities shows as idle slots,
drops, searches and full networks.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import atomic_write_bytes
from protocol.events import Checkpoint, Phase
from protocol.records import RoundRecord, StepRecord

log = logging.getLogger(__name__)

COUNTERS = ("rollouts_published", "rollouts_received", "external_used", "rejected")
RECENT_REWARDS = 60
"""Rewards kept for the sparkline."""
MAX_PEERS = 64
"""Peers kept in ``peers_seen`` (most recently seen first): fresh identities are free."""
HELDOUT_KEYS = ("after_rounds", "greedy_accuracy", "sampled_accuracy", "questions", "samples",
                "seconds")
"""What ``heldout`` (the newest held-out score, None before one) keeps of a round's."""
LINKS = ("direct", "relayed")
"""A connected peer's link (swarm.holepunch): relayed when all its connections go through a
circuit relay."""
RATE_WINDOW = 10
"""Rounds over which rounds/s is measured."""
FEED_KEYS = ("proven", "live", "trial", "idle", "dropped_idle", "dropped_no_signal",
             "idle_slot_rounds", "searched", "network_full")
"""What ``feeds`` keeps of a round record's ``feeds`` (node/learner_process.py)."""


@dataclass
class StatusBoard:
    path: Path
    log_rounds: bool = True
    """One log line per round (when no terminal view shows them)."""
    state: dict[str, Any] = field(default_factory=dict)
    _round_times: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW + 1))

    def __post_init__(self) -> None:
        self.state.update(pid=os.getpid(), phase="starting", round=None, mean_reward=None,
                          accuracy=None, peers=0, outer_steps=0, children={},
                          started=time.time(), round_phase=None, rounds_done=0,
                          rounds_per_s=None, recent_rewards=[], rejected_by_reason={},
                          gossip_rejected={}, peers_seen=[], reachability="unknown",
                          last_outer=None, last_checkpoint=None, heldout=None, feeds=None,
                          links=None,
                          compute=None,
                          **{f"{k}_total": 0 for k in COUNTERS})

    def set(self, **values: Any) -> None:
        self.state.update(values)

    def child(self, name: str, *, pid: int | None, alive: bool, restarts: int) -> None:
        self.state["children"][name] = {"pid": pid, "alive": alive, "restarts": restarts}

    def on_phase(self, event: Phase) -> None:
        name = event.phase[:32]
        prev = self.state.get("round_phase") or {}
        since = prev["since"] if prev.get("name") == name else time.time()
        self.state["round_phase"] = {"name": name, "done": event.done, "total": event.total,
                                     "since": since, "stage": event.stage[:16]}

    def on_round(self, record: RoundRecord) -> None:
        s = self.state
        s["round"] = record.round
        s["mean_reward"] = record.mean_reward
        s["accuracy"] = record.accuracy
        s["rounds_done"] += 1
        for k in COUNTERS:
            s[f"{k}_total"] += _int(getattr(record, k))
        for reason, n in record.rejected_by_reason.items():
            s["rejected_by_reason"][reason] = s["rejected_by_reason"].get(reason, 0) + _int(n)
        if record.peers is not None:  # the swarm's counters were read this round
            s["gossip_rejected"] = {k: _int(v) for k, v in record.gossip_rejected.items()}
            s["peers"] = record.peers
        if record.reachability is not None:
            s["reachability"] = record.reachability[:32]
        feeds = record.observed.get("feeds")
        if isinstance(feeds, dict):
            s["feeds"] = {k: _int(feeds.get(k)) for k in FEED_KEYS}
        heldout = record.heldout
        if heldout is not None:
            s["heldout"] = {k: heldout.get(k) for k in HELDOUT_KEYS}
        s["compute"] = _compute(s.get("compute"), record.observed)
        s["recent_rewards"] = [*s["recent_rewards"], record.mean_reward][-RECENT_REWARDS:]
        self._round_times.append(time.monotonic())
        if len(self._round_times) >= 2:
            span = self._round_times[-1] - self._round_times[0]
            s["rounds_per_s"] = (len(self._round_times) - 1) / span if span > 0 else None
        if self.log_rounds:
            log.info("round=%s reward=%.3f peers=%s published=%s received=%s used=%s rejected=%s%s",
                     record.round, record.mean_reward, s["peers"], record.rollouts_published,
                     record.rollouts_received, record.external_used, record.rejected,
                     f" heldout={heldout_text(s['heldout'])}" if heldout is not None else "")

    def on_peers(self, peers: list[Any], *, links: Any = None) -> None:
        """The learner's report: the live peers (announcements), and each connected peer's
        link (``direct`` or ``relayed``; None: not told, the links stay as they were)."""
        now = time.time()
        seen = {p["peer_id"]: p for p in self.state["peers_seen"]}
        for p in peers[:MAX_PEERS]:
            if isinstance(p, dict) and isinstance(p.get("peer_id"), str):
                pid = p["peer_id"][:128]
                seen[pid] = {"peer_id": pid, "model": str(p.get("model", ""))[:128],
                             "last_seen": now}
        if isinstance(links, dict):
            known = {str(k)[:128]: v for k, v in links.items() if v in LINKS}
            self.state["links"] = {
                **{link: sum(v == link for v in known.values()) for link in LINKS},
                "peers": dict(sorted(known.items(), key=lambda kv: kv[1] != "relayed")
                              [:MAX_PEERS])}
        by_peer = (self.state.get("links") or {}).get("peers") or {}
        for p in seen.values():
            p["link"] = by_peer.get(p["peer_id"])
        self.state["peers_seen"] = sorted(seen.values(), key=lambda p: -p["last_seen"])[:MAX_PEERS]

    def on_outer(self, record: StepRecord, count: int) -> None:
        self.state["outer_steps"] = count
        self.state["last_outer"] = {
            "step": record.step, "status": record.status.value, "peers": record.peers,
            "bytes_sent": record.bytes_sent, "bytes_received": record.bytes_received,
            "seconds": record.seconds, "param_hash": record.param_hash,
            "held_off": held_off(record.observed.get("blames_total"))}

    def on_checkpoint(self, event: Checkpoint) -> None:
        self.state["last_checkpoint"] = {"round": event.round, "time": time.time(),
                                         "seconds": event.seconds}

    def flush(self) -> bytes:
        """Write the heartbeat; return it (what the views show). Called every second or so."""
        self.state["time"] = time.time()
        body = json.dumps(self.state, indent=1, default=str).encode()
        atomic_write_bytes(self.path, body)
        return body


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _compute(prev: Any, observed: dict[str, Any]) -> dict[str, Any] | None:
    """The round's generator and trainer busy fractions, the staleness of its own groups
    and the dropped-stale total (``engine.staleness``; node/learner/loop.py)."""
    gen, train = observed.get("generator_busy"), observed.get("trainer_busy")
    if not isinstance(train, (int, float)):
        return prev if isinstance(prev, dict) else None
    dropped = _int(prev.get("dropped_stale_total")) if isinstance(prev, dict) else 0
    staleness = observed.get("local_staleness")
    return {"generator_busy": float(gen) if isinstance(gen, (int, float)) else None,
            "trainer_busy": float(train),
            "staleness": _int(staleness) if isinstance(staleness, int) else None,
            "dropped_stale_total": dropped + _int(observed.get("dropped_stale"))}


def compute_text(compute: Any) -> str:
    """``compute`` in one line: how busy the generator and the trainer were last round (the
    rest is idle: with ``engine.staleness = 0`` each waits on the other), the staleness of
    the local groups trained and the groups dropped as too stale."""
    if not isinstance(compute, dict):
        return "-"
    gen = compute.get("generator_busy")
    gen_text = f"{gen:.0%}" if isinstance(gen, (int, float)) else "-"
    staleness = compute.get("staleness")
    return (f"generator {gen_text} busy · trainer {compute.get('trainer_busy', 0):.0%} busy"
            f" · staleness {staleness if staleness is not None else '-'}"
            f" · dropped stale {_int(compute.get('dropped_stale_total'))}")


def heldout_text(heldout: Any) -> str:
    """``greedy/sampled@rounds`` of a status record's ``heldout``, ``none`` before one."""
    if not isinstance(heldout, dict) or not isinstance(heldout.get("greedy_accuracy"), (int, float)):
        return "none"
    sampled = heldout.get("sampled_accuracy")
    sampled_text = f"{sampled:.2f}" if isinstance(sampled, (int, float)) else "-"
    return f"{heldout['greedy_accuracy']:.2f}/{sampled_text}@{heldout.get('after_rounds')}"


def feeds_text(feeds: Any) -> str:
    """A status record's ``feeds`` in one line (``none`` outside feeds mode or before a
    round): the open feeds by kind, then what idle sources took."""
    if not isinstance(feeds, dict):
        return "none"
    n = {k: _int(feeds.get(k)) for k in FEED_KEYS}
    return (f"{n['proven']} proven · {n['live']} live · {n['trial']} on trial"
            f" · {n['idle']} idle now · dropped {n['dropped_idle']} idle,"
            f" {n['dropped_no_signal']} without signal · {n['idle_slot_rounds']} slot-rounds"
            f" held by idle sources · {n['searched']} tried in searches"
            f" · {n['network_full']} refused for a full network")


def feeds_alarm(feeds: Any) -> str | None:
    """A warning when most open feeds hold their slot for nothing or none delivers (what a
    farm of identities does), else None."""
    if not isinstance(feeds, dict):
        return None
    n = {k: _int(feeds.get(k)) for k in FEED_KEYS}
    held = n["proven"] + n["live"] + n["trial"]
    if held and (2 * n["idle"] > held or (not n["proven"] + n["live"] and n["dropped_idle"])):
        return ("most feed slots are held by sources that deliver nothing (a farm of "
                "identities? node.log lists the feeds closed as idle)")
    return None


def links_text(links: Any, *, name: int = 0) -> str:
    """A status record's ``links`` in one line, e.g. ``2 direct · 1 relayed`` (``none``
    before the first report); ``name`` > 0 adds up to 3 relayed peers' ids, each cut to
    that many characters."""
    if not isinstance(links, dict):
        return "none"
    text = f"{_int(links.get('direct'))} direct · {_int(links.get('relayed'))} relayed"
    relayed = [str(p) for p, v in (links.get("peers") or {}).items() if v == "relayed"]
    if name > 0 and relayed:
        text += " (" + ", ".join(p[:name] + ("…" if len(p) > name else "")
                                 for p in relayed[:3]) + (", …" if len(relayed) > 3 else "") + ")"
    return text


HELD_OFF = {"leader_stalled": "stalled leader", "leader_refused": "refusing leader",
            "exchange_missing": "member that never reduced", "no_show": "no-show"}
"""A step record's ``blames_total`` reasons (collectives/leader.py) and how status says them."""


def held_off(blames: Any) -> dict[str, int]:
    """The known reasons of a step record's ``blames_total`` (totals since the start)."""
    if not isinstance(blames, dict):
        return {}
    return {k: _int(blames.get(k)) for k in HELD_OFF if _int(blames.get(k)) > 0}


def held_off_text(counts: Any) -> str:
    """``held_off`` in words: what peers did to our outer steps' groups, each one held
    against its peer for a while (leader.py), e.g. ``1 stalled leader · 3 no-shows``."""
    if not isinstance(counts, dict) or not counts:
        return "none"
    return " · ".join(f"{n} {HELD_OFF[k]}{'' if n == 1 else 's'}"
                      for k, n in ((k, _int(counts.get(k))) for k in HELD_OFF) if n > 0)


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
    reach = s.get("reachability") or "unknown"
    if reach == "unreachable":
        reach += (" (peers cannot dial this node and no relay took it: forward its two TCP "
                  "ports and pass --announce; node.log says which)")
    summary = (f"phase={s.get('phase')} round={s.get('round')} peers={s.get('peers')} "
               f"reachability={reach} links={links_text(s.get('links'))} "
               f"reward={s.get('mean_reward')} "
               f"heldout={heldout_text(s.get('heldout'))} "
               f"children_down={dead or 'none'}")
    if s.get("feeds") is not None:
        alarm = feeds_alarm(s["feeds"])
        summary += f" feeds={feeds_text(s['feeds'])}" + (f" ({alarm})" if alarm else "")
    outer = s.get("last_outer")
    if isinstance(outer, dict) and outer.get("held_off"):
        summary += f" outer_held_off={held_off_text(outer['held_off'])}"
    healthy = s.get("phase") not in ("failed", "stopped") and not dead
    return healthy, summary
