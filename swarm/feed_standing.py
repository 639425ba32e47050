"""What a feed source has shown us, and what that earns it (issue 32).

Keys are free, so a source's standing comes only from what it delivered. Once a round the
learner reports, per sender, two running totals (the IPC op ``sources``, swarm.feeds
``FeedClient.rate``):

- ``signal``: groups that passed its own re-scoring *and* carried signal (their rewards
  differ: the only groups it can learn from);
- ``valid``: groups that passed its re-scoring with the rewards their sender claimed (an
  honest node publishes these every round, even while its groups carry no signal yet).

From them a source is one ``Kind``: ``PROVEN`` (it delivered signal), ``LIVE`` (it delivers
valid groups, none with signal yet) or ``STRANGER`` (nothing yet, or nothing since it was
dropped). Each open feed is on ``Trial`` from its opening; ``Standing.judge`` closes (counting in
reports, the learner's rounds, and never sooner than the *wait*: a learner whose rounds skip
training — no local group with signal — reports several times a second, faster than honest
sources publish. The wait is ``PACE_FACTOR`` times the median gap between two frames of one
feed (the swarm's publishing pace) once feeds have delivered, else, after ``trial_rounds``
reports, the same times our own round (a node whose every pick so far was a silent key must
not wait on a pace it never saw), else ``probe_s``; always at least ``MIN_WAIT_S`` and at most
``probe_s``: measured on the embedded model, whose rounds take 0.2 s, a fixed 10 s kept idle
keys in their slots for most of a run, and a node whose first picks were all silent keys
found no honest peer among 50 in 60 rounds):

- a stranger's feed that brought no frame at all in ``probe_rounds`` reports and the wait
  (an honest source answers a new subscription with its newest batch, or publishes within
  its round): *idle*;
- a feed that delivered no valid group in ``trial_rounds`` reports and the wait:
  *idle* — a stranger's at once, a known source's only if these are reports in which
  another feed had delivered (else the whole swarm is quiet) and it has been silent for
  ``probe_s`` and 3 of its own gaps between frames;
- a feed that delivered no signal in ``LIVE_PATIENCE`` (a proven source's:
  ``PROVEN_PATIENCE``) times ``trial_rounds`` reports in which another feed had delivered
  signal: *no signal* (a farm sending valid all-wrong groups; an honest source that lags far
  behind the swarm).

"Another feed" includes our own rounds for signal: the learner also reports how many of its
own local groups carried signal (``own``). A node whose own groups carry signal knows the task
gives signal now, so a source whose valid groups carry none is behind or hostile even when
every feed it holds is such a source (measured: four keys trickling valid all-wrong groups
held all four slots of a node for the whole run, judged against nobody).

Once signal flows (in our own groups or any sender's, within ``LIVE_PATIENCE`` times
``trial_rounds`` reports), valid groups alone no longer rank a candidate: a ``LIVE`` source
not held now is picked like a stranger (``rank``), not ahead of never-tried peers (measured:
each key of a farm sending valid all-wrong groups became live with its first batch and, once
rotated out, was picked again ahead of never-tried honest peers, each for 2 x
``trial_rounds`` rounds). A held ``LIVE`` source keeps its slot and its patience: an honest
one shows signal within rounds.

A dropped source is a stranger again: after an idle drop until it delivers a valid group,
after a no-signal drop until it delivers signal. Idle drops cool the source for longer each
time (``strikes``), so a farm of idle keys leaves the pool of candidates while it is searched.
Pure bookkeeping: no I/O; the caller passes the time.
"""

from __future__ import annotations

import collections
import enum
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["LIVE_PATIENCE", "MIN_WAIT_S", "PACE_FACTOR", "PROVEN_PATIENCE", "Kind", "Standing",
           "Trial", "Verdict"]

LIVE_PATIENCE = 2
"""A feed whose groups pass re-scoring but carry no signal is closed after this many times
``trial_rounds`` reports without signal (while another feed delivered signal): long enough for
an honest source to catch up once the swarm's signal reaches it (the embedded model: 5-6
rounds from its first external signal to its own), short enough to explore past a farm."""
PROVEN_PATIENCE = 4
"""The same for a source that had delivered signal when its feed opened."""
PACE_FACTOR = 3.0
"""The wait is this many of the swarm's gaps between two batches of one source."""
MIN_WAIT_S = 1.0
"""The least wait (a dial and a backfilled batch on a loaded box take about a second)."""
PACE_SAMPLES = 64
"""Gaps between frames the pace is the median of (the newest)."""


class Kind(enum.IntEnum):
    """What a source has shown, ordered: a slot prefers the higher kind."""

    STRANGER = 0
    LIVE = 1
    PROVEN = 2

    @property
    def label(self) -> str:
        """Its name in stats and round records (``trial``: unknown, still on trial)."""
        return ("trial", "live", "proven")[self]


class Verdict(str, enum.Enum):
    """Why ``Standing.judge`` closes a feed; the value is the counter it adds to."""

    IDLE = "feed_dropped_idle"
    NO_SIGNAL = "feed_dropped_no_signal"


@dataclass
class Trial:
    """One open feed's record since it opened (report counts are ``Standing.reports``)."""

    kind: Kind
    """Its source's kind when the feed opened."""
    opened: int
    opened_s: float
    """The time it opened (the caller's clock, seconds)."""
    signal: int
    """The source's signal total at its last growth (or at the opening)."""
    valid: int
    signal_grew: int
    """The report in which the signal total last grew (the opening's, if never)."""
    valid_grew: int
    """The report in which the source last delivered a valid group or signal."""
    valid_s: float
    """The time of that report (the opening's, if never)."""
    missed_valid: int = 0
    """Reports since then in which another open feed had delivered a valid group within
    ``trial_rounds`` reports and this one had not."""
    missed_signal: int = 0
    """The same for signal, since this feed's last."""
    frames: int = 0
    """Frames the feed brought (counted by the swarm process, before any re-scoring)."""
    signal_s: float = 0.0
    """The time of the report in which its signal last grew (the opening's, if never)."""


@dataclass(kw_only=True)
class Standing:
    """The learner's reports and what they make of each source; bounded by ``capacity``."""

    trial_rounds: int
    probe_rounds: int
    probe_s: float
    capacity: int
    reports: int = 0
    _signal: dict[str, int] = field(default_factory=dict, repr=False)
    _valid: dict[str, int] = field(default_factory=dict, repr=False)
    _base: dict[str, tuple[int, float]] = field(default_factory=dict, repr=False)
    """Totals (signal, valid) a dropped source must exceed to rank again (valid: inf after
    a no-signal drop: only signal brings it back)."""
    _strikes: dict[str, int] = field(default_factory=dict, repr=False)
    _last_frame: dict[str, float] = field(default_factory=dict, repr=False)
    _gaps: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=PACE_SAMPLES), repr=False)
    _report_gaps: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=PACE_SAMPLES), repr=False)
    _last_report: float | None = field(default=None, repr=False)
    _own_gap: dict[str, float] = field(default_factory=dict, repr=False)
    _own: int = field(default=0, repr=False)
    """Our own local groups with signal so far (the learner's ``own``)."""
    own_grew: int = field(default=-(10**9), repr=False)
    """The report in which our own signal total last grew."""
    any_grew: int = field(default=-(10**9), repr=False)
    """The report in which ours or any sender's signal total last grew."""

    def frame(self, peer: str, now: float) -> None:
        """An accepted frame from ``peer``'s feed at ``now``: the swarm's pace, and the
        source's own (an exponential mean of its gaps)."""
        last = self._last_frame.pop(peer, None)
        if last is not None:
            self._gaps.append(now - last)
            own = self._own_gap.pop(peer, None)
            self._own_gap[peer] = now - last if own is None else 0.7 * own + 0.3 * (now - last)
            if len(self._own_gap) > self.capacity:
                del self._own_gap[next(iter(self._own_gap))]
        elif len(self._last_frame) >= self.capacity:
            del self._last_frame[next(iter(self._last_frame))]
        self._last_frame[peer] = now

    def wait_s(self) -> float:
        """The least time before a feed is closed for bringing nothing (module docstring)."""
        if len(self._gaps) >= 4:
            pace = statistics.median(self._gaps)
        elif self.reports >= self.trial_rounds and len(self._report_gaps) >= 4:
            pace = statistics.median(self._report_gaps)
        else:
            return self.probe_s
        return min(self.probe_s, max(MIN_WAIT_S, PACE_FACTOR * pace))

    def silent_s(self, peer: str) -> float:
        """How long a known source may bring no valid group before it is silent while
        nothing arrives (``swarm.feeds``' starved rotation): the wait, and at least 3 of its
        own gaps between frames (a source slower than the swarm is slow, not silent)."""
        return max(self.wait_s(), PACE_FACTOR * self._own_gap.get(peer, 0.0))

    def starved(self, trials: Iterable[Trial | None], now: float) -> bool:
        """Nothing arrives: every open feed (its ``trials``) brought no valid group in
        ``probe_rounds`` reports and for the wait (``swarm.feeds``: a rotation then comes
        every wait)."""
        wait, trials = self.wait_s(), list(trials)
        return bool(trials) and bool(self.reports) and all(
            t is not None and self.idle(t) and now - t.valid_s >= wait for t in trials)

    def silent(self, peer: str, trial: Trial, now: float, *, starved: bool) -> bool:
        """A held live source that rotates like a stranger: idle and silent for
        ``probe_s`` (``starved``: for ``silent_s``, if shorter)."""
        after = min(self.probe_s, self.silent_s(peer)) if starved else self.probe_s
        return self.kind(peer) is Kind.LIVE and self.idle(trial) and now - trial.valid_s >= after

    def searching(self, trials: Iterable[Trial | None]) -> bool:
        """Our own groups carry signal (they grew within ``trial_rounds`` reports) and no open
        feed (its ``trials``) brought any in ``LIVE_PATIENCE`` times ``trial_rounds`` reports,
        nor is a proven source's opened as recently: the task gives signal now and every
        source we hold is behind or hostile (``swarm.feeds``: the sources that are not proven
        then rotate one wait after their opening, each to a stranger). Measured: a node that
        joined where 50 keys sending valid all-wrong groups already sat held four of them as
        live sources for its whole run, one stranger tried per ``feeds.rotate_s``, and never
        met either of its two honest peers; its own groups carried signal in most rounds."""
        if not self.trial_rounds or self.reports - self.own_grew >= self.trial_rounds:
            return False
        window = LIVE_PATIENCE * self.trial_rounds

        def brings(t: Trial) -> bool:  # signal since it opened, or a proven source's, lately
            grew = t.signal_grew > t.opened and self.reports - t.signal_grew < window
            return grew or (t.kind is Kind.PROVEN and self.reports - t.opened < window)
        return not any(t is not None and brings(t) for t in trials)

    @property
    def flowing(self) -> bool:
        """Signal reached us (our own groups' or a sender's) within ``LIVE_PATIENCE`` times
        ``trial_rounds`` reports: valid groups alone earn nothing now."""
        return self.reports - self.any_grew < LIVE_PATIENCE * max(1, self.trial_rounds)

    def kind(self, peer: str) -> Kind:
        """What ``peer`` has shown (since it was last dropped)."""
        base_signal, base_valid = self._base.get(peer, (0, 0))
        if self._signal.get(peer, 0) > base_signal:
            return Kind.PROVEN
        if self._valid.get(peer, 0) > base_valid:
            return Kind.LIVE
        return Kind.STRANGER

    def rank(self, peer: str) -> Kind:
        """``kind`` as a candidate for a slot: a ``LIVE`` source ranks as a stranger while
        signal flows (module docstring)."""
        kind = self.kind(peer)
        return Kind.STRANGER if kind is Kind.LIVE and self.flowing else kind

    def report(self, signal: Mapping[str, int], valid: Mapping[str, int], now: float,
               own: int | None = None) -> None:
        """One round's report (running totals per sender, and ``own``: our own local groups
        that carried signal so far, if the learner says), made at ``now``."""
        self.reports += 1
        if any(v > self._signal.get(k, 0) for k, v in signal.items()):
            self.any_grew = self.reports
        if own is not None:
            if own > self._own:
                self.own_grew = self.any_grew = self.reports
            self._own = own
        self._signal, self._valid = dict(signal), dict(valid)
        if self._last_report is not None:
            self._report_gaps.append(now - self._last_report)
        self._last_report = now

    def open(self, peer: str, now: float) -> Trial:
        """The trial of a feed from ``peer`` opening at ``now``."""
        return Trial(kind=self.kind(peer), opened=self.reports, opened_s=now,
                     signal=self._signal.get(peer, 0), valid=self._valid.get(peer, 0),
                     signal_grew=self.reports, valid_grew=self.reports, valid_s=now,
                     signal_s=now)

    def _update(self, peer: str, trial: Trial, now: float) -> None:
        signal, valid = self._signal.get(peer, 0), self._valid.get(peer, 0)
        if signal > trial.signal:
            trial.signal, trial.signal_grew, trial.signal_s = signal, self.reports, now
        if valid > trial.valid or trial.signal_grew == self.reports > trial.opened:
            trial.valid, trial.valid_grew = max(valid, trial.valid), self.reports
            trial.valid_s = now
            self._strikes.pop(peer, None)

    def idle(self, trial: Trial) -> bool:
        """The feed holds a slot for nothing now (no valid group in ``probe_rounds``
        reports, at least 2): the slots lost to idle sources."""
        return self.reports - trial.valid_grew >= max(2, self.probe_rounds)

    def judge(self, trials: Mapping[str, Trial], now_s: float) -> dict[str, Verdict]:
        """Update the open feeds' ``trials`` with the last report, made at ``now_s``; the
        ones to close, and why (see the module docstring). Nothing is judged while
        ``trial_rounds`` is 0."""
        for peer, trial in trials.items():
            self._update(peer, trial, now_s)
        if not self.trial_rounds:
            return {}
        now, t, wait = self.reports, self.trial_rounds, self.wait_s()
        out: dict[str, Verdict] = {}
        for peer, trial in trials.items():
            # patience is counted only in reports where another feed showed what this one
            # did not: while the whole swarm is quiet (a hard task's first rounds, our
            # rounds faster than anyone publishes) nobody is behind
            # (another feed's growth counts only after its opening: a feed opened a moment
            # ago has shown nothing; measured, counting its opening as growth dropped two
            # honest live sources for 'no signal' beside freshly opened idle keys)
            others = [o for p, o in trials.items() if p != peer]
            if trial.valid_grew < now and any(
                    o.valid_grew > max(now - t, o.opened) for o in others):
                trial.missed_valid += 1
            elif trial.valid_grew == now:
                trial.missed_valid = 0
            # our own signal counts in the reports in which it grew only (measured: counting
            # the t reports after each, honest sources were dropped while their groups and
            # ours carried signal only now and then, as the model took off)
            if trial.signal_grew < now and (self.own_grew == now or any(
                    o.signal_grew > max(now - t, o.opened) for o in others)):
                trial.missed_signal += 1
            elif trial.signal_grew == now:
                trial.missed_signal = 0
            stranger = self.kind(peer) is Kind.STRANGER
            # a known source gets probe_s at least, and 3 of its own gaps: one that publishes
            # slower than the swarm now and then (a round re-scoring 150 groups) is slow, not
            # idle (measured: honest live sources dropped beside keys whose one batch counted
            # as delivering, then found again only by exploration); a key that delivered
            # once holds a slot that long, an honest source lost costs far more
            waited = now_s - trial.valid_s >= (
                wait if stranger else
                max(self.probe_s, PACE_FACTOR * self._own_gap.get(peer, 0.0)))
            if stranger and trial.kind is Kind.STRANGER and not trial.frames and \
                    self.probe_rounds and now - trial.opened >= self.probe_rounds and \
                    now_s - trial.opened_s >= wait:
                out[peer] = Verdict.IDLE
            elif waited and (now - trial.valid_grew >= t if stranger
                             else trial.missed_valid >= t):
                out[peer] = Verdict.IDLE
            elif (trial.kind is not Kind.STRANGER or trial.valid_grew > trial.opened) and \
                    trial.missed_signal >= t * (
                        PROVEN_PATIENCE if trial.kind is Kind.PROVEN else LIVE_PATIENCE) and \
                    now_s - trial.signal_s >= wait:
                # only a feed that delivers valid groups is judged by their signal; one that
                # delivers nothing is idle, judged above (never sooner than probe_s); never
                # sooner than the wait either: our own rounds may be faster than its
                out[peer] = Verdict.NO_SIGNAL
        return out

    def dropped(self, peer: str, verdict: Verdict) -> int:
        """``peer``'s feed was closed for ``verdict``: it ranks as a stranger until it shows
        more. Returns its idle strikes (consecutive idle drops), for its cool-down."""
        signal, valid = self._signal.get(peer, 0), self._valid.get(peer, 0)
        self._base.pop(peer, None)
        self._base[peer] = (signal, valid if verdict is Verdict.IDLE else math.inf)
        if len(self._base) > self.capacity:  # bounded: forgetting one only ranks it again
            del self._base[next(iter(self._base))]
        if verdict is not Verdict.IDLE:
            return 0
        if peer not in self._strikes and len(self._strikes) >= self.capacity:
            del self._strikes[next(iter(self._strikes))]
        self._strikes[peer] = self._strikes.get(peer, 0) + 1
        return self._strikes[peer]
