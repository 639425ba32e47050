"""Holding: what a node holds of the outer step, and its one owner.

θ_global and the outer momentum (``OuterState``), the lineage (the version, its hash, its
witnesses: consistency.py), the θ of the parent version when we held it (a fork's loser
rebases relative to it), the streak of minority attempts and the members of our last group.
Read from the training thread (hash, checkpoint copies, a non-finite reset), the outer-step
thread (every attempt) and the asyncio thread (a state served to a peer); written by the
outer-step thread only, every access under one lock. Each method is one transition of the
outer step; none touches the network.
"""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from collectives.consistency import Lineage
from collectives.landing import Landing
from collectives.state import OuterState, unflatten_into
from collectives.streams import work_pool
from collectives.work import Work

__all__ = ["Holding", "Start"]

logger = logging.getLogger(__name__)


def _step_rms(state: OuterState, mu: float) -> float:
    """Root mean square of the recent outer steps' mean delta, read from the momentum
    (m <- mu m + g: (1 - mu) m is a running average of g; with mu 0, the last g)."""
    m = state.momentum
    if not m.numel():
        return 0.0
    rms = (1 - mu) * float(torch.linalg.vector_norm(m)) / math.sqrt(m.numel())
    return rms if math.isfinite(rms) else 0.0


@dataclass(frozen=True)
class Start:
    """What a group step starts from (``Holding.start``): our version, its hash, the
    attempt's params (its snapshot with its rebases so far), θ − those params (being
    computed in the codec pool while we join) and the peers we expect at the meeting (our
    version's witnesses, our last group)."""

    version: int
    state_hash: str
    snapshot: torch.Tensor
    delta: Future[torch.Tensor]
    expected: frozenset[str]

    @property
    def numel(self) -> int:
        return self.snapshot.numel()


class Holding:
    """The outer state a node holds (see the module docstring)."""

    def __init__(self, theta: torch.Tensor, *, peer_id: str, momentum: float,
                 minority_patience: int) -> None:
        self._lock = threading.Lock()
        self._state = OuterState(theta=theta, momentum=torch.zeros_like(theta))
        self._lineage = Lineage(hash=self._state.hash(), version=0)
        self._parent_theta: torch.Tensor | None = None
        self._minority_streak = 0
        self._last_group: frozenset[str] = frozenset()
        self._rms_floor = 0.0
        self._me, self._mu, self._patience = peer_id, momentum, minority_patience
        self._cache: tuple[str, bytes] | None = None
        self._cache_lock = threading.Lock()

    # --- reads ----------------------------------------------------------------------------
    def version(self) -> int:
        with self._lock:
            return self._state.version

    def hash(self) -> str:
        with self._lock:
            return self._state.hash()

    def lineage(self) -> Lineage:
        with self._lock:
            return self._lineage

    def numel(self) -> int:
        return self._state.theta.numel()

    def copy(self) -> OuterState:
        """A copy of the state with its hash recorded (8 bytes per parameter)."""
        with self._lock:
            digest = self._state.hash()
            return self._state.clone().with_digest(digest)

    def knows_peers(self) -> bool:
        """Whether a peer may come to our meetings: our version's witnesses, our last group."""
        with self._lock:
            return bool(self._lineage.witnesses or self._last_group)

    def serve(self, want: str) -> bytes | None:
        """The serialized state if we hold ``want`` (asyncio thread): once per hash."""
        with self._cache_lock:
            if self._cache is not None and self._cache[0] == want:
                return self._cache[1]
            with self._lock:
                if self._state.hash() != want:
                    return None
                data = self._state.to_bytes()
            self._cache = (want, data)
            return data

    def reset(self, params: list[torch.nn.Parameter]) -> None:
        """params <- θ_global (a non-finite local delta: nothing of it is kept)."""
        with self._lock:
            unflatten_into(self._state.theta, params)

    def take_rms_floor(self) -> float:
        """The size of the recent outer steps of the last state we adopted, once (the
        member check's reference, member.py: a joiner that trained little since it
        rebased must not fail every honest mean of the others' deltas); 0 after."""
        with self._lock:
            floor, self._rms_floor = self._rms_floor, 0.0
            return floor

    # --- transitions (outer-step thread) ----------------------------------------------------
    def start(self, work: Work) -> Start:
        """What a group step of ``work`` starts from; θ − its params runs in the codec pool
        (a pass over the model: 0.2-0.3 s at 100M values) while we join and the group forms."""
        with self._lock:
            snapshot = work.params()
            delta = work_pool().submit(torch.sub, self._state.theta, snapshot)
            expected = (self._lineage.witnesses | self._last_group) - {self._me}
            return Start(self._state.version, self._state.hash(), snapshot, delta, expected)

    def adopt(self, state: OuterState, lineage: Lineage, work: Work, *,
              base: torch.Tensor | None) -> None:
        """Hold a fetched, verified ``state``: params <- θ_new + (params − base), base = the
        θ we held unless given."""
        with self._lock:
            old, held = self._state.theta, self._lineage
            self._state = state
            work.rebase(onto=state.theta, base=old if base is None else base)
            self._lineage = lineage
            self._minority_streak = 0
            self._rms_floor = max(self._rms_floor, _step_rms(state, self._mu))
            if lineage.parent == held.hash:
                self._parent_theta = old
            elif lineage.parent != held.parent:
                self._parent_theta = None  # a sibling keeps our parent; else it is unknown

    def parent_theta(self) -> torch.Tensor | None:
        with self._lock:
            return self._parent_theta

    def grouped(self, members: list[str]) -> None:
        self._last_group = frozenset(members)

    def landing(self, like: torch.Tensor, *, lr: float) -> Landing:
        """A landing of the average on the state we hold (landing.py)."""
        with self._lock:
            return Landing(self._state, torch.empty_like(like), lr=lr, momentum=self._mu)

    def may_advance(self, contributors: set[str]) -> bool:
        """Whether a group with these contributors may make the next version: it must hold a
        strict majority of the current version's witnesses, so that two groups that met in
        different windows cannot both advance (a fork); the minority keeps its delta and
        later adopts the majority's version by rule 2. After ``minority_patience``
        consecutive refusals (the majority stayed away) the group advances anyway."""
        with self._lock:
            witnesses = self._lineage.witnesses
        present = contributors | {self._me}
        if not witnesses or 2 * len(present & witnesses) > len(witnesses):
            self._minority_streak = 0
            return True
        self._minority_streak += 1
        if self._minority_streak > self._patience:
            logger.warning("advancing without a majority of the last version's witnesses "
                           "after %d attempts", self._minority_streak - 1)
            self._minority_streak = 0
            return True
        return False

    def apply(self, landing: Landing, avg: torch.Tensor, snapshot: torch.Tensor, work: Work,
              *, lr: float, out: torch.Tensor) -> OuterState:
        """Apply the group's average: θ_global takes the outer step (as landed, or stepped
        now if our state changed since the landing began) and the params are rebased onto it
        (params <- θ_new + (params − snapshot), through ``work``'s shift). Returns the state
        before, the one to roll back to. The new θ and the shift go into the buffers of
        ``out`` (our delta) and ``avg``, dead from here on."""
        with self._lock:
            pre = self._state
            new = landing.state() if landing.base is pre else None
            self._state = new or pre.stepped(avg, lr=lr, momentum=self._mu, out=out)
            work.rebase(onto=self._state.theta, base=snapshot, out=avg)
        return pre

    def roll_back(self, pre: OuterState, snapshot: torch.Tensor, work: Work) -> None:
        """Undo an applied step: the state before it, our params as if it never happened."""
        with self._lock:
            applied = self._state.theta
            self._state = pre
            work.rebase(onto=snapshot, base=applied)

    def before_vote(self, pre: OuterState | None) -> tuple[Lineage, torch.Tensor]:
        """The lineage we hold and the θ the next version's parent has (``pre``: the state
        before we applied this step, None if we did not), read before the vote's outcome
        may replace them."""
        with self._lock:
            return self._lineage, (pre.theta if pre is not None else self._state.theta)

    def settle(self, lineage: Lineage, parent_theta: torch.Tensor) -> None:
        """The version the vote decided is ours now."""
        with self._lock:
            self._lineage, self._parent_theta = lineage, parent_theta
