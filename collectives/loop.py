"""OuterLoop: the DiLoCo outer step as the trainer sees it (see collectives/__init__.py).

One attempt (every ``every_rounds`` rounds), all under ``deadline_s`` from its start ``t0``:

    catch-up   walk the version commits that extend our lineage (a quorum of our witnesses
               signed each, consistency.py), after switching to the winning sibling if our
               version lost a fork; a joiner may adopt a trusted or anchored head;
               fetch the end state, verify its hash, adopt it by rebasing (below); everything
               else that claims a newer version is refused and counted, never fetched
    join       store <gid>/join/<version> = our state hash (signed); after join_window_s
               read the records that verify; the peers that claim our hash form the group
    group      smallest id among them leads; JOIN / freeze (allreduce.py)
    all-reduce reduce-scatter + all-gather of θ_global − θ_local, until 0.7·deadline;
               every returned shard is checked before it is used
    apply      outer Nesterov SGD on θ_global; the version advances (>= 2 peers averaged)
               if the contributors hold a strict majority of our version's witnesses (else
               status "minority": no fork; that delta waits for the majority's version)
    vote       signed vote in <gid>/vote/<version> (our new hash, or the old one if we
               failed); the hash with most votes among the peers our reducer saw contribute
               wins: a failed member adopts it, an applied member that lost rolls back
    commit     if the version advanced: <gid>/commit/<version+1> and <gid>/head

Alone or failed: nothing is published, nothing is lost; θ_global, the version and the hash
stay as they are and the local delta keeps accumulating (it joins the next average, weighted
by the rounds since it was last counted).

Rebase: adopting a state θ_new never overwrites inner work: ``params <- θ_new + (params −
θ_old)``. After an applied step the counted delta is replaced by the average, so params
become θ_new plus whatever changed since the delta was taken. ``discarded_rounds`` counts
rounds whose work was dropped anyway (only a non-finite local delta is: reducers exclude it,
and the rebase resets such params to θ_global).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

import torch

from collectives.allreduce import AllReduce
from collectives.codec import get_codec
from collectives.config import OuterConfig
from collectives.consistency import (Candidate, CommitBook, Lineage, decide_votes, extension,
                                     head_rejections, sibling, trusted_head)
from collectives.errors import CollectiveError, StepFailed, SyncError
from collectives.state import OuterState, flatten, unflatten_into
from collectives.transport import Transport, sanitize_maddrs
from protocol import Identity

__all__ = ["OuterLoop"]

logger = logging.getLogger(__name__)
MAX_HOPS = 64
"""Most versions one catch-up walks."""


def _trust_nobody(_peer: str) -> bool:
    return False


class OuterLoop:
    """DiLoCo outer steps among the peers that share ``group`` (the model fingerprint).

    ``trust(peer_id)``: whether a joiner (no lineage beyond genesis) may adopt a state that
    peer signed; wire it to peers this node has exchanged valid rollouts with for a while.
    The default trusts nobody: a joiner then trains on its own state and averages only with
    peers at its own hash (see consistency.py).

    ``genesis``: θ of version 0, flat fp32 — the base model every peer of the group starts
    from (default: the params now; pass the base weights when the loop is created after the
    first inner rounds, or every node's genesis differs and none can group with another).
    """

    def __init__(self, config: OuterConfig, *, identity: Identity, group: str,
                 params: list[torch.nn.Parameter] | torch.nn.Module, data_dir: str,
                 discover: Callable[[], list[str]],
                 trust: Callable[[str], bool] = _trust_nobody,
                 genesis: torch.Tensor | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        if not group:
            raise ValueError("group must be a non-empty string")
        self.config = config
        self.group = group
        self.peer_id = identity.peer_id
        self._params = list(params.parameters()) if isinstance(params, torch.nn.Module) \
            else list(params)
        theta = flatten(self._params)
        if genesis is not None:
            if genesis.dim() != 1 or genesis.numel() != theta.numel():
                raise ValueError(f"genesis has {genesis.numel()} values, params {theta.numel()}")
            theta = genesis.detach().to("cpu", torch.float32).clone()
        self._state = OuterState(theta=theta, momentum=torch.zeros_like(theta))
        self._lineage = Lineage(hash=self._state.hash(), version=0)
        self._parent_theta: torch.Tensor | None = None
        """θ of ``_lineage.parent`` when we held it (a fork's loser rebases relative to it)."""
        self._lock = threading.Lock()
        self._discover = discover
        self._trust = trust
        self._on_stage = on_stage
        """Told "rendezvous", "exchange" and "commit" as an attempt reaches them (status view)."""
        self._rounds_pending = 0
        """Rounds since our delta was last counted in an applied average."""
        self._discarded_rounds = 0
        self._minority_streak = 0
        self._cache: tuple[str, bytes] | None = None
        self._cache_lock = threading.Lock()
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
        """Count one inner round; after every ``every_rounds`` rounds attempt an outer step
        and return its record, else None. ``weight``: this contribution's declared weight
        (default: ``config.weight`` x the rounds since our delta was last counted)."""
        self._rounds_pending += 1
        if (round + 1) % self.config.every_rounds != 0:
            return None
        return self.outer_step(weight=weight)

    def outer_step(self, *, weight: float | None = None) -> dict[str, Any]:
        """One outer step attempt now; never raises a CollectiveError, never blocks past
        ``deadline_s`` (plus the DHT/stream timeouts' slack)."""
        t0 = time.monotonic()
        with self._lock:
            version = self._state.version
        rec: dict[str, Any] = {"step": version, "status": "failed", "peers": 1,
                               "excluded": {}, "resync_bytes": 0, "bytes_sent": 0,
                               "bytes_received": 0, "leader": None, "error": None,
                               "rejected_commits": {}}
        if weight is None:
            weight = min(self.config.max_weight,
                         self.config.weight * max(1, self._rounds_pending))
        rec["weight"] = weight
        rejected: dict[tuple[str, str, int], str] = {}
        try:
            self._attempt(rec, t0, weight, rejected)
        except CollectiveError as e:
            rec["error"] = str(e)[:500]
            logger.warning("outer step at version %s of %s failed: %s", rec["step"],
                           self.peer_id, e)
        reasons = Counter(rejected.values())
        self._book.rejected.update(reasons)
        rec["rejected_commits"] = dict(reasons)
        with self._lock:
            rec["param_hash"] = self._state.hash()
            rec["version"] = rec["applied"] = self._state.version
        rec["seconds"] = round(time.monotonic() - t0, 4)
        rec.update(dht_restarts=self._transport.dht_restarts,
                   dht_failures=self._transport.dht_failures,
                   invalid_commits=self._book.invalid, rejected_streams=self._ar.rejected,
                   state_requests_refused=self._ar.state_refused,
                   rejected_commits_total=dict(self._book.rejected),
                   rounds_pending=self._rounds_pending,
                   discarded_rounds=self._discarded_rounds)
        return rec

    def close(self) -> None:
        self._transport.close()

    # --- one attempt ----------------------------------------------------------------------
    def _stage(self, name: str) -> None:
        if self._on_stage is not None:
            try:
                self._on_stage(name)
            except Exception as e:  # noqa: BLE001 - the status view must never break a step
                logger.debug("on_stage(%s) failed: %s", name, e)

    def _attempt(self, rec: dict[str, Any], t0: float, weight: float,
                 rejected: dict[tuple[str, str, int], str]) -> None:
        cfg = self.config
        self._stage("rendezvous")
        found = self._safe_discover()
        self._transport.run(self._transport.connect(found), min(6.0, cfg.deadline_s / 4))
        self._transport.add_dht_peers(found, timeout=min(5.0, cfg.deadline_s / 4))
        self._catch_up(rec, rejected, deadline=t0 + 0.3 * cfg.deadline_s)
        with self._lock:
            v, my_hash = self._state.version, self._state.hash()
            snapshot = flatten(self._params)
            delta = self._state.theta - snapshot
        rec["step"] = v
        self._transport.run(self._ar.open_session(step=v, state_hash=my_hash,
                                                  numel=delta.numel(), weight=weight,
                                                  deadline=t0 + 0.7 * cfg.deadline_s), 5)
        join_key = self._book.join_key(v)
        self._transport.dht_store(join_key, self.peer_id,
                                  self._book.seal(v, my_hash, 0, kind="join"),
                                  ttl=2 * cfg.join_window_s + 2, timeout=cfg.join_window_s)
        t_join = time.monotonic()  # windows count from here: hashing a big model takes time
        time.sleep(max(0.0, t_join + cfg.join_window_s - time.monotonic()))
        signed = self._book.verify(self._transport.dht_get(
            join_key, timeout=cfg.join_window_s / 2), step=v, kind="join")
        holders = sorted({p for p, c in signed.items() if c.state_hash == my_hash}
                         | {self.peer_id})
        rec["leader"] = holders[0]
        self._run_group(rec, v, my_hash, holders[0], delta, snapshot, t0, t_join, set(holders))

    def _run_group(self, rec: dict[str, Any], v: int, my_hash: str, leader: str,
                   delta: torch.Tensor, snapshot: torch.Tensor, t0: float, t_join: float,
                   seen: set[str]) -> None:
        """Form the group, all-reduce, apply, vote, commit."""
        cfg = self.config
        remaining = t0 + 0.7 * cfg.deadline_s - time.monotonic()
        try:
            members = self._transport.run(
                self._ar.form_group(leader, freeze_at=t_join + 1.5 * cfg.join_window_s,
                                    expected=seen, latest=t0 + 0.35 * cfg.deadline_s),
                remaining)
        except (StepFailed, TimeoutError) as e:
            # left out (late JOIN, dead leader): if the others step, their version commits
            # extend ours and our next catch-up adopts them (rule 2)
            rec["error"] = f"group did not form: {e!r}"[:500]
            logger.info("outer step at version %d: %s", v, rec["error"])
            return
        rec["peers"] = len(members)
        if len(members) < cfg.min_peers:
            rec["status"] = "alone"
            return
        t_ar = time.monotonic()
        pre: OuterState | None = None
        self._stage("exchange")
        try:
            avg = self._transport.run(
                self._ar.exchange(delta, members, reduce_deadline=t0 + 0.55 * cfg.deadline_s),
                t0 + 0.7 * cfg.deadline_s - time.monotonic() + 1)
            rec["allreduce_seconds"] = round(time.monotonic() - t_ar, 4)
        except (StepFailed, TimeoutError) as e:
            rec["error"] = repr(e)[:500]
        else:
            if not self._may_advance(set(self._ar.session.witnessed)):  # type: ignore[union-attr]
                rec["status"] = "minority"
                rec["error"] = "too few of the current version's contributors took part"
            else:
                with self._lock:
                    pre = self._state.clone()
                    self._state.apply(avg, lr=cfg.outer_lr, momentum=cfg.outer_momentum)
                    self._rebase(onto=self._state.theta, base=snapshot)
                rec["status"] = "ok"
        finally:  # record what the exchange did, also when it failed
            s = self._ar.session
            if s is not None:
                rec["bytes_sent"], rec["bytes_received"] = s.bytes_sent, s.bytes_received
                rec["excluded"] = dict(s.excluded)
                if s.bad_shards:
                    rec["bad_shards"] = dict(s.bad_shards)
                if s.clipped:
                    rec["clipped"] = list(s.clipped)
        s = self._ar.session
        assert s is not None
        self._stage("commit")
        voters = set(s.witnessed) - set(s.bad_shards) - {self.peer_id}
        expect = (set(members) - s.suspects) & voters
        self._reconcile(rec, v, my_hash, pre, snapshot, voters, expect, members,
                        until=t0 + 0.9 * cfg.deadline_s, end=t0 + cfg.deadline_s)

    def _may_advance(self, contributors: set[str]) -> bool:
        """Whether a group with these contributors may make the next version: it must hold a
        strict majority of the current version's witnesses, so that two groups that met in
        different windows cannot both advance (a fork); the minority keeps its delta and
        later adopts the majority's version by rule 2. After ``minority_patience``
        consecutive refusals (the majority stayed away) the group advances anyway."""
        with self._lock:
            witnesses = self._lineage.witnesses
        present = contributors | {self.peer_id}
        if not witnesses or 2 * len(present & witnesses) > len(witnesses):
            self._minority_streak = 0
            return True
        self._minority_streak += 1
        if self._minority_streak > self.config.minority_patience:
            logger.warning("advancing without a majority of the last version's witnesses "
                           "after %d attempts", self._minority_streak - 1)
            self._minority_streak = 0
            return True
        return False

    def _reconcile(self, rec: dict[str, Any], v: int, parent: str, pre: OuterState | None,
                   snapshot: torch.Tensor, voters: set[str], expect: set[str],
                   members: list[str], *, until: float, end: float) -> None:
        """Vote, gather the votes of the peers we saw contribute, follow their decision.

        ``pre``: the state before we applied this step (None if we did not); ``snapshot``:
        the params whose delta we contributed."""
        with self._lock:
            mine = self._state.hash()
        self._transport.dht_store(
            self._book.vote_key(v), self.peer_id,
            self._book.seal(v + 1, mine, len(members), parent=parent,
                            members=sorted(voters | {self.peer_id}), kind="vote"),
            ttl=3 * self.config.deadline_s + 60, timeout=min(5.0, self.config.deadline_s / 4))
        votes: dict = {}
        while expect:
            votes = self._book.verify(self._transport.dht_get(
                self._book.vote_key(v), timeout=max(0.1, until - time.monotonic())),
                step=v + 1, kind="vote")
            if expect <= set(votes) or time.monotonic() + 0.5 > until:
                break
            time.sleep(0.5)
        rec["votes"] = len(votes)
        decided = decide_votes(votes, mine=mine, parent=parent, voters=voters, me=self.peer_id)
        if decided == parent and pre is not None:  # we applied, the group did not: undo
            self._roll_back(rec, pre, snapshot, "most contributors did not apply this step")
            return
        witnesses = voters | {self.peer_id}
        with self._lock:
            held = self._lineage
            parent_theta = pre.theta if pre is not None else self._state.theta
        lineage = Lineage(hash=decided, version=v + 1, witnesses=frozenset(witnesses),
                          parent=parent, parent_witnesses=held.witnesses)
        if decided != mine:  # we failed or diverged; the contributors' state wins
            holders = tuple(sorted(p for p, c in votes.items() if c.state_hash == decided))
            try:  # we took part: our delta is in their average, as if we had applied it
                self._fetch_adopt(rec, Candidate(hash=decided, version=v + 1,
                                                 members=tuple(sorted(witnesses)),
                                                 holders=holders),
                                  end=end, lineage=lineage, base=snapshot)
            except SyncError:
                if pre is not None:  # keep our lineage: the next catch-up can follow theirs
                    self._roll_back(rec, pre, snapshot, "the group's state was not served")
                raise
        if decided != parent:
            self._rounds_pending = 0  # our delta is in the average now
            with self._lock:
                self._lineage, self._parent_theta = lineage, parent_theta
            self._publish(v + 1, parent, tuple(sorted(witnesses)))

    def _roll_back(self, rec: dict[str, Any], pre: OuterState, snapshot: torch.Tensor,
                   why: str) -> None:
        """Undo an applied step: the state before it, our params as if it never happened."""
        with self._lock:
            applied = self._state.theta
            self._state = pre
            self._rebase(onto=snapshot, base=applied)
        rec["status"] = "failed"
        rec["error"] = f"rolled back: {why}"
        logger.info("outer step at version %d rolled back: %s", pre.version, why)

    def _publish(self, version: int, parent: str, members: tuple[str, ...]) -> None:
        with self._lock:
            h = self._state.hash()
        data = self._book.seal(version, h, len(members), parent=parent, members=members)
        ttl = (3 * self.config.deadline_s + 60) * 20
        timeout = min(5.0, self.config.deadline_s / 4)
        self._transport.dht_store(self._book.key(version), self.peer_id, data, ttl=ttl,
                                  timeout=timeout)
        self._transport.dht_store(self._book.head_key, self.peer_id, data, ttl=ttl,
                                  timeout=timeout)

    # --- adopting states ------------------------------------------------------------------
    def _catch_up(self, rec: dict[str, Any], rejected: dict[tuple[str, str, int], str], *,
                  deadline: float) -> None:
        """Adopt what extends our lineage, or the winning sibling of a fork, or (joiners) a
        trusted/anchored head; count and refuse every other newer claim."""
        heads = self._book.verify(self._transport.dht_get(
            self._book.head_key, timeout=max(0.1, deadline - time.monotonic())), step=None,
            kind="version")
        heads.pop(self.peer_id, None)
        with self._lock:
            start = lineage = self._lineage
        target: Candidate | None = None
        base: torch.Tensor | None = None  # rebase relative to this θ (None: the θ we hold)
        if lineage.is_genesis:
            target = trusted_head(heads, anchor=self.config.anchor, trust=self._trust,
                                  mine=lineage.hash)
            if target is not None and target.version <= lineage.version \
                    and target.hash != self.config.anchor:
                target = None
            if target is not None:
                lineage = Lineage(hash=target.hash, version=target.version,
                                  witnesses=frozenset(target.members),
                                  parent=heads[target.holders[0]].parent)
        elif any(c.step == lineage.version and c.parent == lineage.parent
                 and c.state_hash != lineage.hash for c in heads.values()):
            commits = self._book.verify(self._transport.dht_get(
                self._book.key(lineage.version), timeout=max(0.1, deadline - time.monotonic())),
                step=lineage.version, kind="version")
            target = sibling(commits, lineage, self.peer_id)
            if target is not None:
                logger.info("fork at version %d: switching to %s… (signed by a majority of "
                            "the parent's witnesses)", lineage.version, target.hash[:12])
                with self._lock:
                    base = self._parent_theta
                lineage = Lineage(hash=target.hash, version=target.version,
                                  witnesses=frozenset(target.members), parent=lineage.parent,
                                  parent_witnesses=lineage.parent_witnesses)
        hops = 0
        while any(c.step > lineage.version for c in heads.values()) and hops < MAX_HOPS \
                and time.monotonic() < deadline:
            commits = self._book.verify(self._transport.dht_get(
                self._book.key(lineage.version + 1),
                timeout=max(0.1, deadline - time.monotonic())), step=lineage.version + 1,
                kind="version")
            nxt = extension(commits, lineage, self.peer_id)
            if nxt is None:
                for p, c in commits.items():
                    if c.state_hash != lineage.hash:
                        rejected[(p, c.state_hash, c.step)] = \
                            "no_quorum" if c.parent == lineage.hash else "unknown_parent"
                break
            heads_holding = tuple(p for p, c in heads.items() if c.state_hash == nxt.hash)
            target = Candidate(hash=nxt.hash, version=nxt.version, members=nxt.members,
                               holders=tuple(dict.fromkeys(nxt.holders + heads_holding)))
            lineage = Lineage(hash=nxt.hash, version=nxt.version,
                              witnesses=frozenset(nxt.members), parent=lineage.hash,
                              parent_witnesses=lineage.witnesses)
            hops += 1
        for p, c in heads.items():
            if c.step > lineage.version and c.state_hash != lineage.hash:
                why = head_rejections({p: c}, lineage if target else start,
                                      joiner=start.is_genesis and target is None)
                for reason in why:
                    rejected.setdefault((p, c.state_hash, c.step), reason)
        if rejected:
            logger.warning("refused %d commit(s) claiming newer versions: %s", len(rejected),
                           dict(Counter(rejected.values())))
        if target is not None:
            self._fetch_adopt(rec, target, end=deadline, lineage=lineage, base=base)

    def _fetch_adopt(self, rec: dict[str, Any], target: Candidate, *, end: float,
                     lineage: Lineage | None = None, base: torch.Tensor | None = None) -> None:
        """Fetch ``target`` from its holders, verify it, adopt it: params <- θ_new +
        (params − base), base = the θ we held unless given (our counted snapshot)."""
        state, size = self._fetch(target.hash, list(target.holders), end=end)
        if state.version != target.version:
            raise SyncError(f"state {target.hash[:12]}… is at version {state.version}, "
                            f"its commits say {target.version}")
        with self._lock:
            old, held = self._state.theta, self._lineage
            self._state = state
            self._rebase(onto=state.theta, base=old if base is None else base)
            self._lineage = lineage or Lineage(hash=target.hash, version=target.version,
                                               witnesses=frozenset(target.members))
            self._minority_streak = 0
            if self._lineage.parent == held.hash:
                self._parent_theta = old
            elif self._lineage.parent != held.parent:
                self._parent_theta = None  # a sibling keeps our parent; else it is unknown
        rec["status"] = "resynced"
        rec["resync_bytes"] += size
        logger.info("adopted outer state %s… (version %d)", target.hash[:12], target.version)

    def _fetch(self, want: str, holders: list[str], *, end: float) -> tuple[OuterState, int]:
        numel = self._state.theta.numel()
        holders = [p for p in holders if p != self.peer_id]
        for k, peer in enumerate(holders):
            left = end - time.monotonic()
            if left <= 0:
                break
            budget = min(left, max(1.0, left / (len(holders) - k)))  # a dead one must not
            # eat it all
            try:
                data = self._transport.run(
                    self._ar.fetch_state(peer, want, budget,
                                         max_bytes=OuterState.wire_size(numel)), budget + 1)
                state = OuterState.from_bytes(data, numel=numel)
            except Exception as e:  # noqa: BLE001 - dial errors, timeouts, bad bytes: next
                logger.info("state fetch from %s failed: %s: %s", peer, type(e).__name__, e)
                continue
            if state.hash() != want:
                logger.warning("state from %s does not match its commit; ignored", peer)
                continue
            if not state.is_finite():
                logger.warning("state %s… from %s is not finite; ignored", want[:12], peer)
                continue
            return state, len(data)
        raise SyncError(f"no holder of {want[:12]}… served it in time")

    def _rebase(self, *, onto: torch.Tensor, base: torch.Tensor) -> None:
        """params <- onto + (params − base): the work done since ``base`` survives. Called
        with ``_lock`` held. A non-finite local difference is dropped (and counted)."""
        local = flatten(self._params) - base
        if bool(torch.isfinite(local).all()):
            unflatten_into(onto + local, self._params)
        else:
            self._discarded_rounds += self._rounds_pending
            self._rounds_pending = 0
            unflatten_into(onto, self._params)

    def _serve_state(self, want: str) -> bytes | None:
        """The serialized state if we hold ``want``: serialized once per hash."""
        with self._cache_lock:
            if self._cache is not None and self._cache[0] == want:
                return self._cache[1]
            with self._lock:
                if self._state.hash() != want:
                    return None
                data = self._state.to_bytes()
            self._cache = (want, data)
            return data

    def _safe_discover(self) -> list[str]:
        try:
            found = [a for a in self._discover() if isinstance(a, str)][:256]
            return sanitize_maddrs(found)
        except Exception as e:  # noqa: BLE001 - the caller's callback must not break us
            logger.warning("discover() failed: %s", e)
            return []
