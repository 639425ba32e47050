"""Clock rendezvous: when the peers of a group meet for an outer step, without polling.

Meetings are the multiples of a period P on DHT time (hivemind's ``get_dht_time`` is the wall
clock): meeting ``t = k·P``. A peer joins the first meeting that opened before the end of its
current inner round, so peers whose rounds drift by seconds still meet: each joins at its
first round boundary after ``t`` and the group is read ``window`` seconds after ``t`` (or as
soon as every peer it expects has joined).

The period adapts to the measured round times. Every period is ``min_period_s · 2^j``: on
this ladder the meetings of a longer period are a subset of those of a shorter one, so two
peers that momentarily disagree on P still meet at every meeting of the longer one. Each
peer proposes ``every_rounds ×`` its round time (and enough for its window and exchange)
rounded up the ladder. Its join record carries ``code()``: the rungs of its proposal and of
the period in force. After a meeting, every member takes the largest proposal of the
group's members (``heard``; they all read the same records, so they agree on the next
period, bounded by ``max_period_s``: a hostile peer can slow the pace to that bound, no
further). Like hivemind's ``ProgressTracker`` the clock is the DHT's; unlike it, nobody has
to publish progress for the others to know when to meet.

The window (how long after the meeting the group is read) follows the period, so peers
that disagree on the period would read at different times and see different groups (seen:
a fast pair read 2 s after the meeting, a slow newcomer 16 s after; the newcomer led a group
the others had already left). So the read lasts until the window of the *longest period in
force among the records that claim our state* (``window(longest(codes))``): everyone who
meets reads at the same time, whatever period brought them there.

A peer whose run ended (``finish``, finish.py) attends every meeting of the shortest rung
whose window holds ``min_window_s`` (``_finish_period``) and says so in its code (FINISHED, and PENDING while it has rounds no average counted). A version
commit carries the period its group agreed on (``agreed_code``): a peer that adopts it
without having met them (``adopt``) goes to their meetings, not to ones nobody attends.

Pure (no I/O): ``OuterLoop`` feeds it round times and proposals, asks it when to meet.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque

__all__ = ["Clock", "ladder"]

RUNGS = 32
"""A join record's ``peers`` field carries ``1 + j_proposal + RUNGS · j_in_force`` (ladder
rungs; at most 1,024), plus FINISHED for a peer whose run ended and PENDING if it still has
rounds no average counted (at most 7,168, within the wire schema's 10,000)."""
RUNGS_UP = 4
"""Another peer's period moves ours, or stretches our read, by at most this factor (two rungs
of the ladder): a newcomer adopting the period of a meeting it moves to (attempt.py), a read
waiting for the window of the longest period among the holders (rendezvous.py)."""
FINISHED = 2048
PENDING = 4096
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
        self._agreed = False
        self._finished = False
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

    def heard(self, codes: list[int]) -> None:
        """The ``code()`` of the peers we grouped with: the next meetings use the largest
        proposal (bounded by ``max_period_s``)."""
        ok = [self._decode(c)[0] for c in codes if isinstance(c, int) and c > 0]
        with self._lock:
            self._heard = min(max(ok, default=0.0), self.max_period_s)
            self._agreed |= len(ok) >= 2

    def adopt(self, codes: list[int], *, at_most: float | None = None) -> None:
        """The ``agreed_code()`` of the version we just adopted from peers we did not meet
        (the longest, capped at ``max_period_s`` and ``at_most``): their period becomes ours
        until our next meeting, so we go to their meetings, not to ones nobody else
        attends."""
        ok = [self._decode(c)[1] for c in codes if isinstance(c, int) and c > 0]
        if ok:
            with self._lock:
                self._heard = min(max(ok), self.max_period_s,
                                  math.inf if at_most is None else at_most)
                self._agreed = True

    def finish(self) -> None:
        """Our run ended (finish.py): from now on we attend every meeting of the ladder's
        base (a peer still training may meet at any of them), ask for nothing and say so."""
        with self._lock:
            self._finished = True

    @staticmethod
    def finished(code: int) -> bool:
        """Whether a join record's code comes from a peer whose run ended."""
        return isinstance(code, int) and code > 0 and bool(code // FINISHED % 2)

    @staticmethod
    def pending(code: int) -> bool:
        """Whether a finished peer still has rounds that no average counted."""
        return isinstance(code, int) and code > 0 and bool(code // PENDING % 2)

    # --- outputs --------------------------------------------------------------------------
    @property
    def agreed(self) -> bool:
        """Whether our period is one agreed with others: we met a group (``heard`` from
        two or more) or adopted a version's (``adopt``). Before that it is our own
        proposal, which a peer whose rounds differ does not share (loop.py then looks for
        the meeting the others went to). A configured ``period_s`` is everyone's."""
        with self._lock:
            return self._agreed or self.period_s > 0

    def open_meetings(self, now: float) -> list[float]:
        """The meetings of every period on the ladder that opened at most their window
        before ``now`` (DHT time), earliest first: where peers that have not agreed a
        period with us may be meeting now."""
        out: set[float] = set()
        p = self.min_period_s
        while p <= self.max_period_s:
            meet = math.floor(now / p) * p
            if now - meet <= self.window(p):
                out.add(meet)
            p *= 2
        return sorted(out)

    @property
    def round_s(self) -> float | None:
        """Median of the last rounds (None before one)."""
        with self._lock:
            return statistics.median(self._rounds) if self._rounds else None

    def proposal(self) -> float:
        """The period this peer asks for (seconds, on the ladder): ``every_rounds`` of its
        rounds, and room for the window and the last exchange with a quarter to spare (else
        the next meeting opens while this one still runs, and the peer misses it)."""
        if self.period_s > 0:
            return self.period_s
        round_s = self.round_s
        with self._lock:
            exchange = self._exchange_s
            if self._finished:
                return self._finish_period()
        p = ladder(max(self.every_rounds * (round_s or 0.0),
                       1.25 * (self.min_window_s + exchange)),
                   base=self.min_period_s, top=self.max_period_s)
        while 2 * p <= self.max_period_s and p < 1.25 * (self.window(p) + exchange):
            p *= 2
        return p

    def code(self, *, pending: bool = False) -> int:
        """What our join record carries: the rungs of our proposal and of the period in
        force (a fixed ``period_s``: 1, everyone's period is the configured one); once
        finished, FINISHED, and PENDING with ``pending``."""
        code = 1 if self.period_s > 0 else \
            1 + self._rung(self.proposal()) + RUNGS * self._rung(self.period())
        if self._finished:
            code += FINISHED + (PENDING if pending else 0)
        return code

    def agreed_code(self) -> int:
        """What a version commit carries: the period in force agreed by the group that made
        it (read back with ``adopt``; not ours when finished)."""
        with self._lock:
            heard = self._heard
        p = ladder(heard, base=self.min_period_s, top=self.max_period_s) if heard \
            else self.period_s or self.proposal()
        return 1 + RUNGS * self._rung(p)

    def longest(self, codes: list[int], *, ours: bool = True) -> float:
        """The longest period in force among ours (unless not ``ours``) and those ``codes``
        carry (capped)."""
        if self.period_s > 0:
            return self.period_s
        ok = [self._decode(c)[1] for c in codes if isinstance(c, int) and c > 0]
        mine = [self.period()] if ours or not ok else []
        return min(max([*mine, *ok]), self.max_period_s)

    def near(self, period: float) -> float:
        """``period``, at most ``RUNGS_UP`` times ours (in force, or our proposal if longer):
        how far another peer's claim may stretch our read (a staller re-storing records that
        claim the longest period held three honest peers in one read for minutes: a
        fresh-clone CI run timed out so)."""
        if self.period_s > 0:
            return self.period_s
        return min(period, RUNGS_UP * max(self.period(), self.proposal()))

    def _rung(self, period: float) -> int:
        return max(0, min(RUNGS - 1, round(math.log2(period / self.min_period_s))))

    def _decode(self, code: int) -> tuple[float, float]:
        """(proposal, period in force) in seconds, each at most ``max_period_s``."""
        code %= FINISHED
        j_p, j_f = (code - 1) % RUNGS, max(0, min((code - 1) // RUNGS, RUNGS - 1))
        return (min(self.min_period_s * 2.0 ** j_p, self.max_period_s),
                min(self.min_period_s * 2.0 ** j_f, self.max_period_s))

    def period(self) -> float:
        """The period in force: the largest proposal heard at our last meeting (every peer
        of that group read the same records, so they agree; a change of our own proposal
        takes effect through the next meeting), or ours before we met anyone."""
        if self.period_s > 0:
            return self.period_s
        with self._lock:
            heard, finished = self._heard, self._finished
        if finished:
            return self._finish_period()
        if heard:
            return ladder(heard, base=self.min_period_s, top=self.max_period_s)
        return self.proposal()

    def _finish_period(self) -> float:
        """The period of a peer whose run ended: the shortest rung whose window can hold
        ``min_window_s`` (a window is at most half its period). The ladder's base itself (2 s
        by default) gave 1 s windows, shorter than a rendezvous takes over a WAN (DHT reads
        and tunnels at 80 ms RTT, a loaded CPU: 1.7-2.7 s measured on the WAN bed), so a
        finished peer behind NAT came late to every meeting and ended apart. On the ladder,
        its meetings are still among those of every longer period."""
        return ladder(2 * self.min_window_s, base=self.min_period_s, top=self.max_period_s)

    def window(self, period: float | None = None) -> float:
        """How long after a meeting opens the group is read: 1.5 slowest rounds (a period
        holds ``every_rounds`` of them), at least ``min_window_s``, at most half a period
        and ``max_window_s``."""
        p = self.period() if period is None else period
        w = 1.5 * p / self.every_rounds
        return min(self.max_window_s, 0.5 * p, max(self.min_window_s, w))

    def closes(self, meet_at: float, codes: list[int]) -> float:
        """When the read of a meeting opened at ``meet_at`` ended for the other peers, whose
        join records carry ``codes``: the window of the longest period in force among them
        after the opening (ours only if there are none), what every one of them reads until
        (``OuterLoop._read_group``). A join record stored after that came too late for their
        group: they never read it, so our own period did not lengthen their read (seen: a
        newcomer on its own 16 s period counted on an 8 s window, stored 0.03 s after the
        others' 4 s read ended and led a group of nobody for 10 s)."""
        return meet_at + self.window(self.longest(codes, ours=False))

    def due(self, now: float, *, lead: float = 0.0) -> float | None:
        """Called at a round boundary (``now``: DHT time). The meeting to join now, or None:
        the latest meeting ``k·P <= now + lead`` not joined or let pass yet, if it opened
        less than a window ago (a peer that is later than that waits for the next one).
        ``lead`` (at most a quarter of the period): a meeting that opens within it is due
        already, so the attempt prepares before the opening (the caller reads the group
        from the opening on). Computed with the period in force now: when it shrinks, the
        next meeting is the next multiple of the new one."""
        p = self.period()
        meet = math.floor((now + min(max(0.0, lead), 0.25 * p)) / p) * p
        with self._lock:
            if meet <= self._last:
                return None
            self._last = meet
        return meet if now - meet <= self.window(p) else None

    def skip_until(self, t: float) -> None:
        """Let every meeting before ``t`` pass."""
        with self._lock:
            self._last = max(self._last, t - 1e-9)
