"""OuterLoop: the DiLoCo outer step as the trainer sees it (see collectives/__init__.py).

One attempt (every ``every_rounds`` rounds), all under ``deadline_s`` from its start ``t0``:

    catch-up   read <gid>/head; if the group's canonical commit is at or past our attempt
               index, fetch that state from a holder, verify its hash, adopt it (joiners,
               stragglers)
    join       store <gid>/join/<k> = our state hash (a signed OuterStepCommit with
               peers=0); after join_window_s read the records that verify
    group      majority-hash peers; smallest id leads; JOIN / freeze (allreduce.py)
    all-reduce reduce-scatter + all-gather of θ_global − θ_local, until 0.7·deadline
    apply      outer Nesterov SGD on θ_global; copy θ_global into the params in place
    commit     signed OuterStepCommit in <gid>/commit/<k> and <gid>/head (consistency.py);
               gather the members' commits until 0.9·deadline; if our hash is not the
               majority's, fetch the canonical state from a holder and adopt it

Alone (no group formed): no averaging; θ_global, the params and the momentum stay as they
are (the pseudo-gradient keeps accumulating locally and is averaged at the next successful
step); the attempt index advances. A failed attempt behaves the same.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable

import torch

from collectives.allreduce import AllReduce
from collectives.codec import get_codec
from collectives.config import OuterConfig
from collectives.consistency import CommitBook, canonical, majority
from collectives.errors import CollectiveError, StepFailed, SyncError
from collectives.state import OuterState, flatten, unflatten_into
from collectives.transport import Transport, sanitize_maddrs
from protocol import Identity

__all__ = ["OuterLoop"]

logger = logging.getLogger(__name__)


class OuterLoop:
    """DiLoCo outer steps among the peers that share ``group`` (the model fingerprint)."""

    def __init__(self, config: OuterConfig, *, identity: Identity, group: str,
                 params: list[torch.nn.Parameter] | torch.nn.Module, data_dir: str,
                 discover: Callable[[], list[str]]) -> None:
        if not group:
            raise ValueError("group must be a non-empty string")
        self.config = config
        self.group = group
        self.peer_id = identity.peer_id
        self._params = list(params.parameters()) if isinstance(params, torch.nn.Module) \
            else list(params)
        theta = flatten(self._params)
        self._state = OuterState(theta=theta, momentum=torch.zeros_like(theta))
        self._lock = threading.Lock()
        self._discover = discover
        gid = hashlib.sha256(group.encode()).hexdigest()[:24]
        self._transport = Transport(config, identity=identity, data_dir=data_dir,
                                    initial_peers=self._safe_discover())
        self._ar = AllReduce(self._transport.p2p, config, get_codec(config.compression),
                             peer_id=self.peer_id, gid=gid, state_provider=self._serve_state)
        self._transport.run(self._ar.start(), 10)
        self._book = CommitBook(identity=identity, group=group, gid=gid,
                                swarm_id=config.swarm_id)
        self._gid = gid
        self._maddrs: list[str] | None = None

    # --- public ---------------------------------------------------------------------------
    def collective_addrs(self) -> list[str]:
        """This node's hivemind multiaddrs (with /p2p/<peer id>), to announce."""
        if self._maddrs is None:
            self._maddrs = self._transport.maddrs()
        return list(self._maddrs)

    def state_hash(self) -> str:
        with self._lock:
            return self._state.hash()

    def maybe_outer_step(self, round: int, *, weight: float | None = None) -> dict | None:
        """Attempt an outer step after every ``every_rounds`` rounds; the record, else None."""
        if (round + 1) % self.config.every_rounds != 0:
            return None
        return self.outer_step(weight=weight)

    def outer_step(self, *, weight: float | None = None) -> dict[str, Any]:
        """One outer step attempt now; never raises a CollectiveError, never blocks past
        ``deadline_s`` (plus the DHT/stream timeouts' slack)."""
        t0 = time.monotonic()
        rec: dict[str, Any] = {"step": self._state.attempt, "status": "failed", "peers": 1,
                               "excluded": {}, "resync_bytes": 0, "bytes_sent": 0,
                               "bytes_received": 0, "leader": None, "error": None}
        try:
            self._attempt(rec, t0, self.config.weight if weight is None else weight)
        except CollectiveError as e:
            rec["error"] = str(e)[:500]
            logger.warning("outer step %s of %s failed: %s", rec["step"], self.peer_id, e)
        with self._lock:
            rec["param_hash"] = self._state.hash()
            rec["applied"] = self._state.applied
        rec["seconds"] = round(time.monotonic() - t0, 4)
        rec.update(dht_restarts=self._transport.dht_restarts,
                   dht_failures=self._transport.dht_failures,
                   invalid_commits=self._book.invalid, rejected_streams=self._ar.rejected)
        return rec

    def close(self) -> None:
        self._transport.close()

    # --- one attempt ----------------------------------------------------------------------
    def _attempt(self, rec: dict[str, Any], t0: float, weight: float) -> None:
        cfg = self.config
        end = t0 + cfg.deadline_s
        found = self._safe_discover()
        self._transport.run(self._transport.connect(found), min(6.0, cfg.deadline_s / 4))
        self._transport.add_dht_peers(found, timeout=min(5.0, cfg.deadline_s / 4))
        self._catch_up(rec, deadline=t0 + cfg.deadline_s / 4)
        with self._lock:
            k, my_hash = self._state.attempt, self._state.hash()
            delta = self._state.theta - flatten(self._params)
        rec["step"] = k
        self._transport.run(self._ar.open_session(step=k, state_hash=my_hash,
                                                  numel=delta.numel(), weight=weight,
                                                  deadline=t0 + 0.7 * cfg.deadline_s), 5)
        join_key = f"{self._gid}/join/{k}"
        self._transport.dht_store(join_key, self.peer_id, self._book.seal(k, my_hash, 0),
                                  ttl=3 * cfg.deadline_s + 60, timeout=cfg.join_window_s)
        t_join = time.monotonic()  # windows count from here: hashing a big model takes time
        time.sleep(max(0.0, t_join + cfg.join_window_s - time.monotonic()))
        signed = self._book.verify(self._transport.dht_get(
            join_key, timeout=cfg.join_window_s / 2), step=k)
        records = {p: c.state_hash for p, c in signed.items()}
        records[self.peer_id] = my_hash
        best, holders = majority(records)
        if best != my_hash:
            rec["status"] = "stale"
            expect = set(holders)
            with self._lock:
                self._state.attempt = k + 1
        else:
            leader = holders[0]
            rec["leader"] = leader
            try:
                expect = self._run_group(rec, k, leader, delta, t0, t_join, set(holders))
            finally:  # failed attempts advance the attempt index too: keep heads current
                self._publish(k, rec["peers"])
        self._reconcile(rec, k, expect, commit_until=t0 + 0.9 * cfg.deadline_s, end=end)

    def _run_group(self, rec: dict[str, Any], k: int, leader: str, delta: torch.Tensor,
                   t0: float, t_join: float, seen: set[str]) -> set[str]:
        """Form the group and all-reduce; returns the members whose commits to expect."""
        cfg = self.config
        remaining = t0 + 0.7 * cfg.deadline_s - time.monotonic()
        try:
            members = self._transport.run(
                self._ar.form_group(leader, freeze_at=t_join + 1.5 * cfg.join_window_s,
                                    expected=seen, latest=t0 + 0.35 * cfg.deadline_s),
                remaining)
        except (StepFailed, TimeoutError) as e:
            with self._lock:
                self._state.attempt = k + 1
            # we were left out (late JOIN, dead leader): the peers we saw may still step;
            # gathering their commits lets us adopt the result now instead of next time
            rec["error"] = f"group did not form: {e!r}"[:500]
            logger.info("outer step %d: %s", k, rec["error"])
            return seen - {self.peer_id}
        rec["peers"] = len(members)
        if len(members) < cfg.min_peers:
            rec["status"] = "alone"
            with self._lock:
                self._state.attempt = k + 1
            return set()
        t_ar = time.monotonic()
        try:
            avg = self._transport.run(
                self._ar.exchange(delta, members, reduce_deadline=t0 + 0.55 * cfg.deadline_s),
                t0 + 0.7 * cfg.deadline_s - time.monotonic() + 1)
            rec["allreduce_seconds"] = round(time.monotonic() - t_ar, 4)
        except (StepFailed, TimeoutError) as e:
            rec["error"] = repr(e)[:500]
            with self._lock:
                self._state.attempt = k + 1
        else:
            with self._lock:
                self._state.apply(avg, lr=cfg.outer_lr, momentum=cfg.outer_momentum)
                self._state.attempt = k + 1
                unflatten_into(self._state.theta, self._params)
            rec["status"] = "ok"
        finally:  # record what the exchange did, also when it failed
            s = self._ar.session
            if s is not None:
                rec["bytes_sent"], rec["bytes_received"] = s.bytes_sent, s.bytes_received
                rec["excluded"] = dict(s.excluded)
        s = self._ar.session
        return set(members) - s.suspects if s is not None else set(members)

    def _publish(self, k: int, peers: int) -> None:
        with self._lock:
            h = self._state.hash()
        data = self._book.seal(k, h, peers)
        ttl = 3 * self.config.deadline_s + 60
        timeout = min(5.0, self.config.deadline_s / 4)
        self._transport.dht_store(self._book.key(k), self.peer_id, data, ttl=ttl,
                                  timeout=timeout)
        self._transport.dht_store(self._book.head_key, self.peer_id, data, ttl=ttl * 20,
                                  timeout=timeout)

    # --- consistency ----------------------------------------------------------------------
    def _reconcile(self, rec: dict[str, Any], k: int, expect: set[str], *, commit_until: float,
                   end: float) -> None:
        """Gather step k's commits; adopt the majority state if ours differs."""
        if not expect - {self.peer_id}:
            return
        commits: dict = {}
        while True:
            commits = self._book.verify(self._transport.dht_get(
                self._book.key(k), timeout=max(0.1, commit_until - time.monotonic())), step=k)
            if expect <= set(commits) or time.monotonic() + 0.5 > commit_until:
                break
            time.sleep(0.5)
        rec["commits"] = len(commits)
        best = canonical(commits)
        if best is None:
            return
        with self._lock:
            mine = self._state.hash()
        if best[0] != mine:
            self._fetch(rec, best[0], best[1], end=end)
            self._publish(k, len(expect))

    def _catch_up(self, rec: dict[str, Any], *, deadline: float) -> None:
        heads = self._book.verify(self._transport.dht_get(
            self._book.head_key, timeout=max(0.1, deadline - time.monotonic())), step=None)
        heads.pop(self.peer_id, None)
        if not heads:
            return
        top = max(c.step for c in heads.values())
        with self._lock:
            behind = top >= self._state.attempt
        if behind:
            best = canonical({p: c for p, c in heads.items() if c.step == top})
            assert best is not None
            self._fetch(rec, best[0], best[1], end=deadline)

    def _fetch(self, rec: dict[str, Any], want: str, holders: list[str], *, end: float) -> None:
        numel = self._state.theta.numel()
        for peer in holders:
            left = end - time.monotonic()
            if peer == self.peer_id or left <= 0:
                continue
            budget = min(left, max(2.0, left / 2))  # a dead holder must not eat it all
            try:
                data = self._transport.run(self._ar.fetch_state(peer, want, budget), budget + 1)
                state = OuterState.from_bytes(data, numel=numel)
            except Exception as e:  # noqa: BLE001 - dial errors, timeouts, bad bytes: next
                logger.info("state fetch from %s failed: %s: %s", peer, type(e).__name__, e)
                continue
            if state.hash() != want:
                logger.warning("state from %s does not match its commit; ignored", peer)
                continue
            with self._lock:
                self._state = state
                unflatten_into(state.theta, self._params)
            rec["status"] = "resynced"
            rec["resync_bytes"] += len(data)
            logger.info("adopted canonical outer state %s… from %s", want[:12], peer)
            return
        raise SyncError(f"no holder of {want[:12]}… served it in time")

    def _serve_state(self) -> tuple[str, bytes]:
        with self._lock:
            return self._state.hash(), self._state.to_bytes()

    def _safe_discover(self) -> list[str]:
        try:
            found = [a for a in self._discover() if isinstance(a, str)][:256]
            return sanitize_maddrs(found)
        except Exception as e:  # noqa: BLE001 - the caller's callback must not break us
            logger.warning("discover() failed: %s", e)
            return []
