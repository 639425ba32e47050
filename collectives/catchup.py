"""Catch-up: which newer state of our lineage to adopt (``Catchup.plan``), and fetching a
state from its holders (``Fetcher``).

The rules are consistency.py's; the adoption itself (a rebase that never overwrites inner
work) is ``Holding.adopt``. Nothing here writes what the node holds.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from collectives.allreduce import AllReduce
from collectives.config import OuterConfig
from collectives.consistency import (Candidate, CommitBook, Lineage, extension,
                                     head_rejections, sibling, trusted_head)
from collectives.errors import SyncError
from collectives.state import OuterState
from collectives.transport import Transport
from protocol import OuterVersion

__all__ = ["Catchup", "Fetcher", "MAX_HOPS", "Plan"]

logger = logging.getLogger(__name__)
MAX_HOPS = 64
"""Most versions one catch-up walks."""

Rejected = dict[tuple[str, str, int], str]
"""(signer, state hash, version) -> why a newer version was refused."""


@dataclass(frozen=True)
class Plan:
    """A state to adopt: its version's candidate, the lineage we hold once it is adopted, the
    θ to rebase relative to (None: the θ we hold) and the clock codes of the heads holding it
    (the period its group agreed on)."""

    target: Candidate
    lineage: Lineage
    base: torch.Tensor | None
    periods: tuple[int, ...]


class Fetcher:
    """Fetches a state by hash from the peers that hold it, checked against the hash."""

    def __init__(self, *, transport: Transport, ar: AllReduce, peer_id: str,
                 numel: int) -> None:
        self._transport, self._ar, self._me, self._numel = transport, ar, peer_id, numel

    def fetch(self, target: Candidate, *, end: float) -> tuple[OuterState, int]:
        """``target``'s state and its size on the wire; SyncError if no holder served it by
        ``end`` or it is not at the version its commits say."""
        state, size = self._fetch(target.hash, list(target.holders), end=end)
        if state.version != target.version:
            raise SyncError(f"state {target.hash[:12]}… is at version {state.version}, "
                            f"its commits say {target.version}")
        return state, size

    def _fetch(self, want: str, holders: list[str], *, end: float) -> tuple[OuterState, int]:
        numel = self._numel
        holders = [p for p in holders if p != self._me]
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


class Catchup:
    """Reads the version records in the DHT and says what to adopt (rules: consistency.py)."""

    def __init__(self, *, config: OuterConfig, peer_id: str, book: CommitBook,
                 transport: Transport, trust: Callable[[str], bool]) -> None:
        self._config, self._me, self._book = config, peer_id, book
        pinned = frozenset(config.catchup.trusted_peers)
        self._transport = transport
        self._trust: Callable[[str], bool] = lambda p: p in pinned or trust(p)

    def _read(self, key: str, version: int | None, deadline: float) -> dict[str, OuterVersion]:
        return self._book.verify(self._transport.dht_get(
            key, timeout=max(0.1, deadline - time.monotonic())), OuterVersion, step=version)

    def plan(self, held: Lineage, parent_theta: torch.Tensor | None, *, deadline: float,
             rejected: Rejected) -> Plan | None:
        """What extends our lineage ``held``, or the winning sibling of a fork (rebased
        relative to ``parent_theta``), or (joiners) a trusted/anchored head; every other
        newer claim is refused and counted in ``rejected``. None: nothing to adopt."""
        heads = self._read(self._book.head_key, None, deadline)
        heads.pop(self._me, None)
        lineage = held
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
            commits = self._read(self._book.key(lineage.version), lineage.version, deadline)
            target = sibling(commits, lineage, self._me)
            if target is not None:
                logger.info("fork at version %d: switching to %s… (signed by a majority of "
                            "the parent's witnesses)", lineage.version, target.hash[:12])
                base = parent_theta
                lineage = Lineage(hash=target.hash, version=target.version,
                                  witnesses=frozenset(target.members), parent=lineage.parent,
                                  parent_witnesses=lineage.parent_witnesses)
        hops = 0
        while any(c.step > lineage.version for c in heads.values()) and hops < MAX_HOPS \
                and time.monotonic() < deadline:
            commits = self._read(self._book.key(lineage.version + 1), lineage.version + 1,
                                 deadline)
            nxt = extension(commits, lineage, self._me)
            if nxt is None and any(c.parent == lineage.hash for c in commits.values()) \
                    and any(c.step > lineage.version + 1 for c in heads.values()):
                # too few of our witnesses signed it: count those that stepped from it
                children = self._read(self._book.key(lineage.version + 2),
                                      lineage.version + 2, deadline)
                nxt = extension(commits, lineage, self._me, children)
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
                why = head_rejections({p: c}, lineage if target else held,
                                      joiner=held.is_genesis and target is None)
                for reason in why:
                    rejected.setdefault((p, c.state_hash, c.step), reason)
        if rejected:
            logger.warning("refused %d commit(s) claiming newer versions: %s", len(rejected),
                           dict(Counter(rejected.values())))
        if target is None:
            return None
        return Plan(target=target, lineage=lineage, base=base,
                    periods=tuple(c.period for c in heads.values()
                                  if c.state_hash == target.hash))

    def _joiner_target(self, heads: dict[str, OuterVersion],
                       lineage: Lineage) -> Candidate | None:
        """The head a joiner (genesis lineage) adopts: anchored or trusted (rule 3), newer
        than ours unless it is the anchor."""
        target = trusted_head(heads, anchor=self._config.catchup.anchor, trust=self._trust,
                              mine=lineage.hash)
        if target is not None and target.version <= lineage.version \
                and target.hash != self._config.catchup.anchor:
            return None
        return target

    def agreed(self, held: Lineage) -> tuple[int, tuple[int, ...]] | None:
        """Before our first attempt (loop.py ``_period_known``): the version a joiner would
        adopt and the clock codes of its heads (the period its group agreed on, which the
        version commits carry), so that our first meeting is theirs: the attempt there adopts
        their state and steps with them. Nothing is fetched here; a head we would not adopt
        tells us nothing (its period is a hostile peer's word). None when we hold a lineage
        (our catch-up follows it, with its period) or there is no such head."""
        timeout = self._config.schedule.dht_op_timeout_s
        heads = self._book.verify(self._transport.dht_get(self._book.head_key, timeout=timeout),
                                  OuterVersion, step=None)
        heads.pop(self._me, None)
        if not held.is_genesis:
            return None
        target = self._joiner_target(heads, held)
        if target is None:
            return None
        return target.version, tuple(heads[p].period for p in target.holders)
