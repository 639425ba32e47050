"""Clock rendezvous: when the peers of a group meet for an outer step, without polling.

Meetings are the multiples of a period P on DHT time (hivemind's ``get_dht_time`` is the wall
clock): meeting ``t = k·P``. A peer joins the first meeting that opened before the end of its
current inner round, so peers whose rounds drift by seconds still meet: each joins at its
first round boundary after ``t`` and the group is read ``window`` seconds after ``t`` (or as
soon as every peer it expects has joined).

The period adapts to the measured round times. Every period is ``min_period_s · 2^j``: on
this ladder the meetings of a longer period are a subset of those of a shorter one, so two
peers that momentarily disagree on P still meet at every meeting of the longer one. Each
peer proposes ``every_rounds ×`` its round time (and enough for its exchange) rounded up the
ladder, sends the proposal with its join record, and uses the largest proposal of the
peers that claimed its state at the last meeting: they all read the same records at the same
time, so they agree on the next period (bounded by ``max_period_s``: a hostile peer can slow
the pace to that bound, no further). Like hivemind's ``ProgressTracker`` the clock is
the DHT's; unlike it, nobody has to publish progress for the others to know when to meet.

Pure (no I/O): ``OuterLoop`` feeds it round times and proposals, asks it when to meet.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque

__all__ = ["Clock", "ladder"]

DECI = 10
"""Proposals travel in a join record's ``peers`` field in deciseconds (bounded there by the
wire schema to 10,000, i.e. 1,000 s)."""
ROUNDS_KEPT = 9
"""The round time is the median of this many last rounds (one slow round — a model load, a
checkpoint — does not stretch the period)."""


def ladder(seconds: float, *, base: float, top: float) -> float:
    """The smallest ``base · 2^j`` >= ``seconds``, capped at the largest one <= ``top``."""
    if not (base > 0 and top >= base):
        raise ValueError("ladder needs 0 < base <= top")
    j = 0 if not seconds > base else math.ceil(math.log2(seconds / base) - 1e-9)
    j_top = math.floor(math.log2(top / base) + 1e-9)
    return base * 2 ** max(0, min(j, j_top))


class Clock:
    """Meeting times of one peer (thread-safe: rounds are observed on the training thread,
    proposals and step times on the outer-step thread)."""

    def __init__(self, *, every_rounds: int, min_period_s: float, max_period_s: float,
                 period_s: float = 0.0, min_window_s: float, max_window_s: float) -> None:
        if every_rounds < 1 or not 0 < min_period_s <= max_period_s:
            raise ValueError("need every_rounds >= 1 and 0 < min_period_s <= max_period_s")
        if not 0 < min_window_s <= max_window_s:
            raise ValueError("need 0 < min_window_s <= max_window_s")
        self.every_rounds, self.period_s = every_rounds, period_s
        self.min_period_s, self.max_period_s = min_period_s, max_period_s
        self.min_window_s, self.max_window_s = min_window_s, max_window_s
        self._rounds: deque[float] = deque(maxlen=ROUNDS_KEPT)
        self._exchange_s = 0.0
        self._heard = 0.0
        self._last = -math.inf
        """The latest meeting joined or let pass."""
        self._lock = threading.Lock()

    # --- inputs ---------------------------------------------------------------------------
    def observe_round(self, seconds: float) -> None:
        """One inner round took ``seconds``."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        with self._lock:
            self._rounds.append(seconds)

    def observe_exchange(self, seconds: float) -> None:
        """The last step took ``seconds`` from the group read to its end: a period must
        hold a window and that (or the next meeting finds us still busy and we skip it)."""
        if seconds >= 0 and math.isfinite(seconds):
            with self._lock:
                self._exchange_s = seconds

    def heard(self, proposals: list[int]) -> None:
        """Proposals (deciseconds) in the join records of the peers we grouped with: the
        next meetings use the largest (bounded by ``max_period_s``)."""
        ok = [p / DECI for p in proposals if isinstance(p, int) and p > 0]
        with self._lock:
            self._heard = min(max(ok, default=0.0), self.max_period_s)

    # --- outputs --------------------------------------------------------------------------
    @property
    def round_s(self) -> float | None:
        """Median of the last rounds (None before one)."""
        with self._lock:
            return statistics.median(self._rounds) if self._rounds else None

    def proposal(self) -> float:
        """The period this peer asks for (seconds, on the ladder)."""
        if self.period_s > 0:
            return self.period_s
        round_s = self.round_s
        with self._lock:
            want = max(self.every_rounds * (round_s or 0.0),
                       1.25 * (self.min_window_s + self._exchange_s))
        return ladder(want, base=self.min_period_s, top=self.max_period_s)

    def proposal_ds(self) -> int:
        return min(10_000, max(1, round(self.proposal() * DECI)))

    def period(self) -> float:
        """The period in force: the largest proposal heard at our last meeting (every peer
        of that group read the same records, so they agree; a change of our own proposal
        takes effect through the next meeting), or ours before we met anyone."""
        if self.period_s > 0:
            return self.period_s
        with self._lock:
            heard = self._heard
        if heard:
            return ladder(heard, base=self.min_period_s, top=self.max_period_s)
        return self.proposal()

    def window(self, period: float | None = None) -> float:
        """How long after a meeting opens the group is read: 1.5 slowest rounds (a period
        holds ``every_rounds`` of them), at least ``min_window_s``, at most half a period
        and ``max_window_s``."""
        p = self.period() if period is None else period
        w = 1.5 * p / self.every_rounds
        return min(self.max_window_s, 0.5 * p, max(self.min_window_s, w))

    def due(self, now: float) -> float | None:
        """Called at a round boundary (``now``: DHT time). The meeting to join now, or None:
        the latest meeting ``k·P <= now`` not joined or let pass yet, if it opened less than
        a window ago (a peer that is later than that waits for the next one). Computed
        with the period in force now: when it shrinks, the next meeting is the next
        multiple of the new one."""
        p = self.period()
        meet = math.floor(now / p) * p
        with self._lock:
            if meet <= self._last:
                return None
            self._last = meet
        return meet if now - meet <= self.window(p) else None

    def skip_until(self, t: float) -> None:
        """Let every meeting before ``t`` pass."""
        with self._lock:
            self._last = max(self._last, t - 1e-9)
