"""Adopting states: catch-up along our lineage, fetching a state from its holders (and
serving ours).

A mixin of ``OuterLoop`` (loop.py); the rules themselves are in consistency.py. Adopting
never overwrites inner work: it goes through ``OuterLoop._rebase``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from typing import Any, Callable

import torch

from collectives.consistency import (Candidate, Lineage, extension, head_rejections, sibling,
                                     trusted_head)
from collectives.errors import SyncError
from collectives.parts import LoopParts
from collectives.state import OuterState
from protocol import OuterVersion

__all__ = ["Adopter", "MAX_HOPS"]

logger = logging.getLogger(__name__)
MAX_HOPS = 64
"""Most versions one catch-up walks."""


def _step_rms(state: OuterState, mu: float) -> float:
    """Root mean square of the recent outer steps' mean delta, read from the momentum
    (m <- mu m + g: (1 - mu) m is a running average of g; with mu 0, the last g)."""
    m = state.momentum
    if not m.numel():
        return 0.0
    rms = (1 - mu) * float(torch.linalg.vector_norm(m)) / math.sqrt(m.numel())
    return rms if math.isfinite(rms) else 0.0


class Adopter(LoopParts):
    """Catch-up and state fetches (the attributes are ``OuterLoop``'s)."""

    _trust: Callable[[str], bool]
    _cache: tuple[str, bytes] | None
    _cache_lock: threading.Lock

    def _catch_up(self, rec: dict[str, Any], rejected: dict[tuple[str, str, int], str], *,
                  deadline: float) -> None:
        """Adopt what extends our lineage, or the winning sibling of a fork, or (joiners) a
        trusted/anchored head; count and refuse every other newer claim."""
        heads = self._book.verify(self._transport.dht_get(
            self._book.head_key, timeout=max(0.1, deadline - time.monotonic())),
            OuterVersion, step=None)
        heads.pop(self.peer_id, None)
        with self._lock:
            start = lineage = self._lineage
        target: Candidate | None = None
        base: torch.Tensor | None = None  # rebase relative to this θ (None: the θ we hold)
        if lineage.is_genesis:
            target = self._joiner_target(heads, lineage)
            if target is not None:
                lineage = Lineage(hash=target.hash, version=target.version,
                                  witnesses=frozenset(target.members),
                                  parent=heads[target.holders[0]].parent)
        elif any(c.step == lineage.version and c.parent == lineage.parent
                 and c.state_hash != lineage.hash for c in heads.values()):
            commits = self._book.verify(self._transport.dht_get(
                self._book.key(lineage.version), timeout=max(0.1, deadline - time.monotonic())),
                OuterVersion, step=lineage.version)
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
                timeout=max(0.1, deadline - time.monotonic())),
                OuterVersion, step=lineage.version + 1)
            nxt = extension(commits, lineage, self.peer_id)
            if nxt is None and any(c.parent == lineage.hash for c in commits.values()) \
                    and any(c.step > lineage.version + 1 for c in heads.values()):
                # too few of our witnesses signed it: count those that stepped from it
                children = self._book.verify(self._transport.dht_get(
                    self._book.key(lineage.version + 2),
                    timeout=max(0.1, deadline - time.monotonic())),
                    OuterVersion, step=lineage.version + 2)
                nxt = extension(commits, lineage, self.peer_id, children)
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
            self.clock.adopt([c.period for c in heads.values() if c.state_hash == target.hash])

    def _joiner_target(self, heads: dict[str, OuterVersion],
                       lineage: Lineage) -> Candidate | None:
        """The head a joiner (genesis lineage) adopts: anchored or trusted (rule 3), newer
        than ours unless it is the anchor."""
        target = trusted_head(heads, anchor=self.config.anchor, trust=self._trust,
                              mine=lineage.hash)
        if target is not None and target.version <= lineage.version \
                and target.hash != self.config.anchor:
            return None
        return target

    def _read_agreed(self) -> None:
        """Before our first attempt (loop.py ``_period_known``): the period agreed by the
        group whose version we would adopt, read from its head commits (they carry it,
        commit.py), so that our first meeting is theirs: the attempt there adopts their
        state and steps with them. Nothing is fetched here; a head we would not adopt
        tells us nothing (its period is a hostile peer's word)."""
        found = self._safe_discover()
        timeout = min(5.0, self.config.deadline_s / 4)
        self._transport.add_dht_peers(found, timeout=timeout)
        heads = self._book.verify(self._transport.dht_get(self._book.head_key, timeout=timeout),
                                  OuterVersion, step=None)
        heads.pop(self.peer_id, None)
        with self._lock:
            lineage = self._lineage
        if not lineage.is_genesis:
            return  # we hold a lineage: our catch-up follows it, with its period
        target = self._joiner_target(heads, lineage)
        if target is not None:
            self.clock.adopt([heads[p].period for p in target.holders])
            logger.info("meeting on the period of version %d (%.0f s) from the first attempt",
                        target.version, self.clock.period())

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
            # the member check's reference (exchange.py): a joiner that trained little
            # since it rebased must not fail every honest mean of the others' deltas
            self._ar.mean_rms = max(self._ar.mean_rms,
                                    _step_rms(state, self.config.outer_momentum))
            if self._lineage.parent == held.hash:
                self._parent_theta = old
            elif self._lineage.parent != held.parent:
                self._parent_theta = None  # a sibling keeps our parent; else it is unknown
        rec["status"] = "resynced"
        rec["made_by"] = len(target.members)  # the peers whose average made that version
        rec["resync_bytes"] += size
        logger.info("adopted outer state %s… (version %d)", target.hash[:12], target.version)

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
