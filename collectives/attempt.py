"""One outer-step attempt on the outer-step thread, from the rendezvous to the commit: the
one function that orchestrates the phases (loop.py's docstring lists them).

``Attempt.run(work)`` calls the collaborators in order and decides from what each returns:

    catch-up    Catchup.plan → Fetcher.fetch → Holding.adopt       (catchup.py, holding.py)
    rendezvous  Rendezvous.join → Roster; finished peers: who_steps (rendezvous.py, finish.py)
    group       AllReduce.form_group → GroupInfo                    (matchmaking.py, group.py)
    exchange    AllReduce.exchange → the average, landed on θ       (member.py, reducer.py,
                                                                     landing.py)
    apply       Holding.may_advance → Holding.apply                 (holding.py)
    vote        Ballot.settle → Outcome; adopt or roll back         (vote.py)
    commit      Holding.settle, Ballot.publish

It returns a ``StepRecord`` (record.py) when the attempt did something, ``Passed`` when its
meeting passed without a step. What it does to the params goes into ``work``'s shift
(work.py); what it does to θ_global and the lineage, through ``Holding``. It never raises a
``CollectiveError``. Every deadline is one ``Deadlines`` computed from ``deadline_s``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from typing import Callable

import torch

from collectives.allreduce import AllReduce, ExchangeReport
from collectives.catchup import Catchup, Fetcher, Plan, Rejected
from collectives.config import OuterConfig
from collectives.consistency import Candidate, CommitBook, Lineage
from collectives.errors import CollectiveError, StepFailed, SyncError
from collectives.feedback import ErrorFeedback
from collectives.finish import Farewell, who_steps
from collectives.group import GroupInfo
from collectives.leader import Blame, leader_order, yield_lead
from collectives.matchmaking import LeaderFailed
from collectives.holding import Holding, Start
from collectives.record import Deadlines, Draft, Passed, Status, StepRecord
from collectives.rendezvous import Rendezvous, Roster
from collectives.schedule import RUNGS_UP, Clock
from collectives.state import OuterState
from collectives.transport import Transport
from collectives.vote import Ballot
from collectives.work import Work

__all__ = ["Attempt", "FREEZE_GRACE_S"]

logger = logging.getLogger(__name__)

REPLY_GRACE_S = 1.0
"""A member waits for its leader's answer until the leader's latest freeze (as far as the
member can tell: its own, plus a window) and this much more; then the leader stalled."""
FREEZE_GRACE_S = 0.5
"""On the clock, the leader freezes the group at most this long after its read ended (for
JOINs already on their way)."""


class Attempt:
    """Runs attempts (one at a time, on the outer-step thread) with the node's collaborators."""

    def __init__(self, *, config: OuterConfig, peer_id: str, holding: Holding, clock: Clock,
                 transport: Transport, ar: AllReduce, book: CommitBook, catchup: Catchup,
                 fetcher: Fetcher, rendezvous: Rendezvous, ballot: Ballot, farewell: Farewell,
                 discover: Callable[[], list[str]], now: Callable[[], float],
                 on_stage: Callable[[str], None],
                 feedback: ErrorFeedback | None = None) -> None:
        self.config, self.peer_id, self.holding, self.clock = config, peer_id, holding, clock
        self.transport, self.ar, self.book, self.catchup = transport, ar, book, catchup
        self.fetcher, self.rendezvous, self.ballot = fetcher, rendezvous, ballot
        self.farewell, self.discover, self.now, self.stage = farewell, discover, now, on_stage
        self.feedback = feedback
        """Error feedback of the sparse codec (None for a dense one): feedback.py."""
        self.blame = Blame()
        """Peers we saw stall a group: last in our leader order for a few attempts."""

    # --- the attempt ----------------------------------------------------------------------
    def run(self, work: Work) -> StepRecord | Passed:
        """One attempt of ``work``; never raises a CollectiveError."""
        t0 = time.monotonic()
        weight = work.weight
        if weight is None:
            bounds = self.config.bounds
            weight = min(bounds.max_weight, bounds.weight * max(1, work.rounds))
        draft = Draft(step=self.holding.version(), weight=weight)
        if work.meet is not None:
            draft.note(meet=work.meet)
        rejected: Rejected = {}
        passed: Passed | None = None
        read_at: float | None = None
        try:
            ended = self._attempt(work, draft, t0, weight, rejected)
            if isinstance(ended, Passed):
                passed = ended
            else:
                read_at = ended
        except CollectiveError as e:
            draft.error = str(e)[:500]
            logger.warning("outer step at version %s of %s failed: %s", draft.step,
                           self.peer_id, e)
        finally:
            self.blame.attempt_ended()
        reasons = Counter(rejected.values())
        self.book.rejected.update(reasons)
        ended_at = self.now()
        if passed is not None:
            return dataclasses.replace(passed, ended_at=ended_at)
        if read_at is not None and draft.status is Status.OK:
            self.clock.observe_exchange(time.monotonic() - read_at)
        draft.note(dht_restarts=self.transport.dht_restarts,
                   dht_failures=self.transport.dht_failures, invalid_commits=self.book.invalid,
                   rejected_streams=self.ar.rejected,
                   state_requests_refused=self.ar.state_refused,
                   rejected_commits_total=dict(self.book.rejected))
        if self.blame.counts:
            draft.note(blames_total=dict(self.blame.counts))
        return draft.freeze(version=self.holding.version(), param_hash=self.holding.hash(),
                            seconds=round(time.monotonic() - t0, 4), ended_at=ended_at,
                            rejected_commits=dict(reasons))

    def _attempt(self, work: Work, draft: Draft, t0: float, weight: float,
                 rejected: Rejected) -> Passed | float | None:
        """The phases; a ``Passed`` if the meeting passes, else when the group was read
        (monotonic; None if it never was)."""
        cfg = self.config
        self.stage("rendezvous")
        if work.meet is not None:  # > 0: started before the opening (config.schedule.prepare_s)
            draft.note(before_meet_s=round(work.meet - self.now(), 4))
        found = self.discover()
        discovered = frozenset(a.rsplit("/p2p/", 1)[1] for a in found if "/p2p/" in a)
        draft.note(discovered=len(discovered))
        self.transport.run(self.transport.connect(found), min(6.0, cfg.schedule.deadline_s / 4))
        self.transport.add_dht_peers(found, timeout=cfg.schedule.dht_op_timeout_s)
        deadlines = Deadlines.starting(t0, cfg.schedule.deadline_s)
        try:
            adopted = self._catch_up(work, draft, rejected, deadlines.catch_up)
        except SyncError as e:  # its holders moved on (their step of this meeting applied
            # while their new head was not yet stored): the heads once more
            logger.info("catch-up: %s; reading the heads again", e)
            time.sleep(0.5)
            adopted = self._catch_up(work, draft, rejected, deadlines.catch_up)
        draft.mark("rendezvous")
        if self._unagreed(work):  # go where peers at our state went, if they did
            self._meet_others(work, draft)
        if work.meet is not None and abs(math.remainder(work.meet, self.clock.period())) > 1e-3:
            # the version we adopted meets on a longer period: not one of its meetings
            # (nobody would come); an adoption is reported
            return None if adopted else Passed(ended_at=0.0, why="period")
        if adopted and work.meet is not None and not work.final \
                and self.rendezvous.made_at(self.holding.lineage(), work.meet):
            return None  # its group has left this meeting: nobody here could advance it
        start = self.holding.start(work)
        draft.step = start.version
        self.transport.run(self.ar.open_session(
            step=start.version, state_hash=start.state_hash, numel=start.numel, weight=weight,
            deadline=deadlines.exchange, rms_floor=self.holding.take_rms_floor()), 5)
        roster = self._roster(work, draft, start, discovered)
        if roster.late is not None:
            draft.note(late_s=roster.late)
            if roster.late > FREEZE_GRACE_S and not work.final:
                # the others froze their group (their read's end + at most the grace)
                # before our record was even stored: their leader admits nobody now (seen:
                # a slow newcomer 11 s late stood there alone). The meeting passes; our
                # delta waits for the next
                logger.info("%.1f s late for the meeting at %.1f: letting it pass",
                            roster.late, work.meet)
                return None if adopted else Passed(ended_at=0.0, why="late")
        holders = roster.holders
        if work.meet is not None:  # finished peers (finish.py): who steps here
            pinned = frozenset(cfg.catchup.trusted_peers)  # the operator's other nodes
            verdict = who_steps(holders, start.expected | discovered | pinned, me=self.peer_id,
                                last_call=work.last_call, min_peers=cfg.group.min_peers,
                                gone=self.farewell.gone)
            if verdict.stepping is None:
                self.transport.run(self.ar.refuse_joins(), 5)
                return Passed(ended_at=0.0, why="end" if verdict.end else "waiting",
                              end=verdict.end, waiting_for=verdict.waiting_for)
            holders = verdict.stepping
        draft.mark("join")
        read_at = time.monotonic()
        draft.note(read_early=roster.early)  # every peer we expected joined before the end
        if work.meet is not None:  # >= 0: the group is never read before the opening
            draft.note(read_after_meet_s=round(self.now() - work.meet, 4))
        draft.note(wait_seconds=round(read_at - t0, 4))
        # in the order they lead (leader.py); late, we go last: their leader's freeze grace
        # may admit us (and we take the lead back if they JOIN us: they read our record)
        order, yielded = yield_lead(
            leader_order(holders, state_hash=start.state_hash,
                         meeting="" if work.meet is None else str(round(work.meet * 10)),
                         witnesses=self.holding.lineage().witnesses, blamed=self.blame.blamed()),
            self.peer_id, late=roster.late is not None)
        draft.leader = order[0]
        if work.meet is not None:
            # a blamed peer's clock code does not stretch our window (seen: a staller's
            # proposal made the honest peers' window 8 s for a meeting)
            unwaited = self.blame.unwaited()
            window = self.clock.window(self.clock.near(self.clock.longest(
                [c for p, c in holders.items() if p not in unwaited] or list(holders.values()))))
            draft.note(window=round(window, 3))
        else:
            window = min(cfg.schedule.deadline_s / 2, work.window or cfg.schedule.join_window_s)
        grace = min(0.5 * window, FREEZE_GRACE_S) if work.meet is not None else 0.5 * window
        # read early, the leader freezes at once and waits only for the holders it still
        # waits for; a first no-show among them (leader.py) gets the grace it would get
        # from a read that ran to its end. Without it, a no-show that is here is never
        # admitted again (seen: a's record from its lone attempt made b mark a a no-show; at
        # their shared step b read early, froze alone before a's JOIN came, and refused it).
        # Only a first one: a holder that is a no-show at every meeting would cost each the
        # grace
        absent = (set(holders) - {self.peer_id}) & self.blame.first_no_shows()
        freeze_at = read_at + (0.0 if roster.early and not absent else grace)
        if work.meet is not None or work.window is not None:
            # the deadline's shares count from the read, as if it came join_window_s after
            # the start (a clock's window is sized by round times, a final step's by the
            # caller)
            deadlines = Deadlines.starting(max(t0, time.monotonic() - cfg.schedule.join_window_s),
                                           cfg.schedule.deadline_s)
        # late (then never the leader while others came, unless they JOIN us): as a group of
        # one, wait for no JOIN past the freeze (waiting until 0.35 x deadline_s would miss
        # the next meetings)
        # the leader's freeze is over by its latest join, counted from its read, which
        # may come up to a window after ours
        reply_by = deadlines.latest_join + window + REPLY_GRACE_S
        # a leader's wait for no-shows does not recur (they are marked): not a step's length
        # that the next periods must hold (seen: one such wait made the period 8 s)
        waited = self._group_step(work, draft, start, order, holders, deadlines, freeze_at,
                                  reply_by, wait_joins=roster.late is None,
                                  lead_if_joined=yielded)
        return read_at + waited

    # --- catch-up -------------------------------------------------------------------------
    def _catch_up(self, work: Work, draft: Draft, rejected: Rejected, deadline: float) -> bool:
        """Adopt what extends our lineage (catchup.py); whether we did."""
        plan = self.catchup.plan(self.holding.lineage(), self.holding.parent_theta(),
                                 deadline=deadline, rejected=rejected)
        if plan is None:
            return False
        self._adopt(work, draft, plan, end=deadline)
        self.clock.adopt(list(plan.periods))
        return True

    def _adopt(self, work: Work, draft: Draft, plan: Plan, *, end: float) -> None:
        """Fetch ``plan``'s state, verify it, hold it (a rebase: work.py)."""
        state, size = self.fetcher.fetch(plan.target, end=end)
        self.holding.adopt(state, plan.lineage, work, base=plan.base)
        draft.status = Status.RESYNCED
        draft.note(made_by=len(plan.target.members))  # whose average made that version
        draft.resync_bytes += size
        logger.info("adopted outer state %s… (version %d)", plan.target.hash[:12],
                    plan.target.version)

    # --- rendezvous -----------------------------------------------------------------------
    def _unagreed(self, work: Work) -> bool:
        """A meeting on the clock while our period is only our own proposal (schedule.py
        ``agreed``): peers whose rounds differ from ours meet at other times."""
        return work.meet is not None and not work.final and not self.clock.agreed

    def _meet_others(self, work: Work, draft: Draft, *, but: float | None = None,
                     among: frozenset[str] | None = None) -> bool:
        """Move ``work`` to the open meeting where peers at our state joined (with
        ``among``: one of those) and take their period; False if there is none."""
        found = self.rendezvous.find_meeting(self.holding.version(), self.holding.hash(),
                                             but=but, among=among,
                                             ignore=self.blame.unwaited())
        if found is None:
            return False
        work.meet, codes = found
        work.met = tuple(codes)
        draft.note(meet=work.meet)
        # a period in a join record is its peer's word: at most two rungs past our own
        # proposal (a staller claiming the longest, 600 s, kept three honest peers from
        # ever meeting); the group we then meet agrees on its members' proposals (heard)
        self.clock.adopt(codes, at_most=RUNGS_UP * self.clock.proposal())
        logger.info("joining the meeting at %.1f where %d peer(s) at our state are",
                    work.meet, len(codes))
        return True

    def _roster(self, work: Work, draft: Draft, start: Start,
                discovered: frozenset[str]) -> Roster:
        """Join ``work``'s meeting and read who came; once more at another meeting when
        peers at our state went there instead."""
        v, my_hash, expected = start.version, start.state_hash, start.expected
        ignore = self.blame.unwaited()
        roster = self.rendezvous.join(work, v, my_hash, expected, discovered, ignore=ignore)
        if len(roster.holders) < self.config.group.min_peers and self._unagreed(work) \
                and self._meet_others(work, draft, but=work.meet):
            # alone where our own period led us; peers at our state are at another meeting
            # (they joined after our first look): there, once
            return self.rendezvous.join(work, v, my_hash, expected, discovered, ignore=ignore)
        if work.final and work.meet is not None and not roster.early:
            # finished (finish.py), and a peer we expect is not at our meeting: one still
            # training may be at one of its own period's, which opened earlier and is read
            # longer than ours (seen: a finished node read each 8 s meeting for 4 s while
            # the two still training joined a 64 s period's 25 s after its opening; it
            # left 4 s before they stepped, and the swarm ended at two states)
            missing = (expected | discovered) - set(roster.holders) - {self.peer_id}
            if missing and self._meet_others(work, draft, but=work.meet, among=missing):
                return self.rendezvous.join(work, v, my_hash, expected, discovered, ignore=ignore)
        return roster

    # --- group, exchange, apply, vote, commit ---------------------------------------------
    def _group_step(self, work: Work, draft: Draft, start: Start, order: list[str],
                    seen: dict[str, int], deadlines: Deadlines, freeze_at: float,
                    reply_by: float, *, wait_joins: bool, lead_if_joined: bool = False
                    ) -> float:
        """Form the group, all-reduce, apply, vote, commit. ``order``: the peers whose join
        records claim our hash, in the order they lead; ``seen``: those peers -> their clock
        code (``wait_joins``: as leader, wait past ``freeze_at`` for those that did not JOIN
        yet). Returns how long the leader waited past the freeze for holders that never
        came (0 if none)."""
        cfg = self.config
        v, my_hash = start.version, start.state_hash
        try:
            group = self.transport.run(
                self.ar.form_group(order, freeze_at=freeze_at,
                                   latest=deadlines.latest_join if wait_joins else freeze_at,
                                   reply_by=reply_by, deadline=deadlines.exchange,
                                   no_wait=self.blame.unwaited(),
                                   refuse=self.blame.blamed(), lead_if_joined=lead_if_joined),
                deadlines.exchange - time.monotonic())
        except LeaderFailed as e:
            # a leader that stalled us, or refused a JOIN we sent in time, ranks last in our
            # order for the next attempts (leader.py); a late peer's refusal is its due
            if e.why == "stalled" or wait_joins:
                self.blame.blame(e.leader, f"leader_{e.why}")
            draft.error = f"group did not form: {e!r}"[:500]
            logger.info("outer step at version %d: %s", v, draft.error)
            return 0.0
        except (StepFailed, TimeoutError) as e:
            # left out (late JOIN, dead leader): if the others step, their version commits
            # extend ours and our next catch-up adopts them (rule 2)
            draft.error = f"group did not form: {e!r}"[:500]
            logger.info("outer step at version %d: %s", v, draft.error)
            return 0.0
        draft.mark("group")
        members = list(group.members)
        # a holder of our state outside the group did not JOIN by the freeze: not blamed
        # (its record may be an earlier attempt's at this version: test_lineage's lone
        # peers then disagreed on the leader), but not waited for again (leader.py no_show;
        # every member got the same group, so every one of them marks it)
        no_shows = set(seen) - set(members) - {self.peer_id}
        for peer in sorted(no_shows):
            self.blame.no_show(peer)
        waited = max(0.0, time.monotonic() - freeze_at) if no_shows else 0.0
        draft.peers = len(members)
        # the next period: the largest proposal of this group's members (every member read
        # their records, so every member takes the same)
        self.clock.heard([seen[m] for m in members if m in seen])
        if len(members) < cfg.group.min_peers:
            draft.status = Status.ALONE
            return waited
        self.holding.grouped(members)
        pre, report, unsent = self._exchange(work, draft, start, group, deadlines)
        for peer in sorted(report.suspects):  # its shard or its contribution never came
            self.blame.blame(peer, "exchange_missing")
        for peer in report.witnessed - report.suspects:  # it took part: nothing held against it
            self.blame.clear(peer)
        draft.mark("exchange")
        self._settle(work, draft, start, members, pre, report, deadlines, unsent)
        return waited

    def _exchange(self, work: Work, draft: Draft, start: Start, group: GroupInfo,
                  deadlines: Deadlines
                  ) -> tuple[OuterState | None, ExchangeReport, torch.Tensor | None]:
        """All-reduce our delta with ``group`` and apply the average if the version may
        advance; the state before it (None: not applied), what the exchange did and, with
        error feedback, what our contribution left out (feedback.py)."""
        cfg = self.config
        t_ar = time.monotonic()
        pre = None
        self.stage("exchange")
        delta, snapshot = start.delta.result(), start.snapshot
        zero = work.final and work.rounds == 0
        if zero:
            # nothing trained since our delta was last counted: contribute exactly zero
            # (rounding in the rebases must not look like a direction)
            delta.zero_()
        landing = self.holding.landing(delta, lr=cfg.optimizer.lr)
        t_ret: float | None = None
        avg: torch.Tensor | None = None
        try:
            avg = self.transport.run(
                self.ar.exchange(delta, group, reduce_deadline=deadlines.reduce,
                                 out=landing.avg, on_landed=landing.land),
                deadlines.exchange - time.monotonic() + 1)
            t_ret = time.monotonic()
            draft.note(allreduce_seconds=round(t_ret - t_ar, 4))
        except (StepFailed, TimeoutError) as e:
            draft.error = repr(e)[:500]
        report = self._report(draft, t_ar, t_ret)
        unsent = None
        if self.feedback is not None and not zero:
            # before the apply (it reuses delta's buffer); also when our exchange failed: the
            # others' average may hold our contribution, and we may adopt it
            t = time.monotonic()
            unsent = self.feedback.unsent(delta, group.wire_chunks(delta.numel()))
            draft.note(feedback_s=round(time.monotonic() - t, 4))
        if avg is not None and not self.holding.may_advance(set(report.witnessed)):
            draft.status = Status.MINORITY
            draft.error = "too few of the current version's contributors took part"
        elif avg is not None:
            pre = self.holding.apply(landing, avg, snapshot, work, lr=cfg.optimizer.lr,
                                     out=delta)
            draft.status = Status.OK
        return pre, report, unsent

    def _settle(self, work: Work, draft: Draft, start: Start, members: list[str],
                pre: OuterState | None, report: ExchangeReport, deadlines: Deadlines,
                unsent: torch.Tensor | None = None) -> None:
        """Vote and follow the group's decision: keep our step, roll it back, or adopt the
        contributors' state; commit the version if it advanced (``pre``: the state before
        we applied, None if we did not)."""
        v, my_hash, snapshot = start.version, start.state_hash, start.snapshot
        self.stage("commit")
        voters = set(report.witnessed) - set(report.bad_shards) - {self.peer_id}
        expect = (set(members) - report.suspects) & voters
        mine = self.holding.hash()
        outcome = self.ballot.settle(v, nonce=report.nonce, mine=mine,
                                     parent=my_hash, voters=voters, expect=expect,
                                     until=deadlines.votes)
        if outcome.settled_without:
            draft.note(settled_without=list(outcome.settled_without))
        draft.note(votes=len(outcome.votes))
        draft.mark("vote")
        decided = outcome.decided
        if decided == my_hash and pre is not None:  # we applied, the group did not: undo
            self._roll_back(draft, pre, snapshot, work,
                            "most contributors did not apply this step")
            return
        witnesses = voters | {self.peer_id}
        held, parent_theta = self.holding.before_vote(pre)
        lineage = Lineage(hash=decided, version=v + 1, witnesses=frozenset(witnesses),
                          parent=my_hash, parent_witnesses=held.witnesses)
        if decided != mine:  # we failed or diverged; the contributors' state wins
            holders = tuple(sorted(p for p, c in outcome.votes.items()
                                   if c.state_hash == decided))
            target = Candidate(hash=decided, version=v + 1, members=tuple(sorted(witnesses)),
                               holders=holders)
            try:  # we took part: our delta is in their average, as if we had applied it
                self._adopt(work, draft, Plan(target=target, lineage=lineage, base=snapshot,
                                              periods=()), end=deadlines.end)
            except SyncError:
                if pre is not None:  # keep our lineage: the next catch-up can follow theirs
                    self._roll_back(draft, pre, snapshot, work,
                                    "the group's state was not served")
                raise
        if decided != my_hash:
            work.counted = True  # our delta is in the average
            self.holding.settle(lineage, parent_theta)
            # stored before the attempt returns: a peer that missed this step must find it
            # in its next catch-up, which may start right after ours ends
            self.ballot.publish(v + 1, decided, parent=my_hash,
                                members=tuple(sorted(witnesses)),
                                period_code=self.clock.agreed_code())
            draft.mark("commit")
            if unsent is not None:  # our params keep what our contribution left out
                assert self.feedback is not None
                self.feedback.keep(work, unsent)

    def _report(self, draft: Draft, t_ar: float, t_ret: float | None) -> ExchangeReport:
        """What the exchange did (also when it failed), into the draft."""
        report = self.transport.run(self.ar.report(), 30)  # a read on the loop: at once
        assert report is not None  # the session was opened by this attempt
        draft.bytes_sent, draft.bytes_received = report.bytes_sent, report.bytes_received
        draft.note(bytes_sent_gather=report.gather_sent)
        if "start" in report.marks:  # where the exchange's time went: s since its start
            # (the last of each phase's events); the start on the wall clock lines up the
            # peers' timelines (and a link trace) in a bench
            start = report.marks["start"]
            marks = dict(report.marks, called=t_ar)
            if t_ret is not None:
                marks["returned"] = t_ret
            draft.note(exchange_start_wall=time.time() - (time.monotonic() - start),
                       exchange_marks={k: round(t - start, 4) for k, t in
                                       sorted(marks.items(), key=lambda kv: kv[1])})
        draft.excluded = dict(report.excluded)
        if report.bad_shards:
            draft.note(bad_shards=dict(report.bad_shards))
        if report.clipped:
            draft.note(clipped=list(report.clipped))
        return report

    def _roll_back(self, draft: Draft, pre: OuterState, snapshot: torch.Tensor, work: Work,
                   why: str) -> None:
        """Undo an applied step: the state before it, our params as if it never happened."""
        self.holding.roll_back(pre, snapshot, work)
        draft.status = Status.FAILED
        draft.error = f"rolled back: {why}"
        logger.info("outer step at version %d rolled back: %s", pre.version, why)
