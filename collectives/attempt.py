"""One outer-step attempt on the outer-step thread, from the rendezvous to the commit (a
mixin of ``OuterLoop``; loop.py ``_run`` wraps it into its record, and its docstring lists
the phases).

``_attempt``: catch-up, the join records and the group read (join.py), the freeze time;
``_run_group``: the leader (smallest id among the peers whose join records claim our hash)
freezes the member list (allreduce.py), the members exchange θ_global − θ_local, the outer
step is applied and hashed range by range as the average lands (landing.py), and if the
contributors hold a strict majority of our version's witnesses the version advances (else
status "minority"); then the vote and the version commit (commit.py).
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future
from typing import Any, Callable

import torch

from collectives.background import Work
from collectives.errors import StepFailed, SyncError
from collectives.landing import Landing
from collectives.parts import LoopParts
from collectives.state import OuterState
from collectives.streams import work_pool

__all__ = ["Attempt"]

logger = logging.getLogger(__name__)

FREEZE_GRACE_S = 0.5
"""On the clock, the leader freezes the group at most this long after its read ended (for
JOINs already on their way)."""


class Attempt(LoopParts):
    """One attempt (the attributes are ``OuterLoop``'s)."""

    _stage: Callable[[str], None]
    _may_advance: Callable[[set[str]], bool]
    _reconcile: Callable[..., None]
    _catch_up: Callable[..., None]
    _unagreed: Callable[[Work], bool]
    _meet_others: Callable[..., bool]
    _made_at: Callable[[float], bool]
    _join: Callable[..., tuple[dict[str, int], bool, float | None]]
    _who_steps: Callable[..., dict[str, int] | None]

    def _attempt(self, rec: dict[str, Any], t0: float, weight: float,
                 rejected: dict[tuple[str, str, int], str]) -> None:
        cfg = self.config
        work = self._work
        assert work is not None
        self._stage("rendezvous")
        if work.meet is not None:  # > 0: started before the opening (config.prepare_s)
            rec["before_meet_s"] = round(work.meet - self._now(), 4)
        found = self._safe_discover()
        discovered = frozenset(a.rsplit("/p2p/", 1)[1] for a in found if "/p2p/" in a)
        rec["discovered"] = len(discovered)
        self._transport.run(self._transport.connect(found), min(6.0, cfg.deadline_s / 4))
        self._transport.add_dht_peers(found, timeout=min(5.0, cfg.deadline_s / 4))
        try:
            self._catch_up(rec, rejected, deadline=t0 + 0.3 * cfg.deadline_s)
        except SyncError as e:  # its holders moved on (their step of this meeting applied
            # while their new head was not yet stored): the heads once more
            logger.info("catch-up: %s; reading the heads again", e)
            time.sleep(0.5)
            self._catch_up(rec, rejected, deadline=t0 + 0.3 * cfg.deadline_s)
        self._mark(rec, "rendezvous")
        if self._unagreed(work):  # go where peers at our state went, if they did
            self._meet_others(work, rec)
        if work.meet is not None and abs(math.remainder(work.meet, self.clock.period())) > 1e-3:
            if rec["status"] != "resynced":  # (an adoption is reported)
                rec["status"] = "skipped"  # the version we adopted meets on a longer
            return  # period: not one of its meetings (nobody would come)
        if rec["status"] == "resynced" and work.meet is not None and not work.final \
                and self._made_at(work.meet):
            return  # its group has left this meeting: nobody here could advance it
        with self._lock:
            v, my_hash = self._state.version, self._state.hash()
            snapshot = work.params()
            # θ − snapshot (a pass over the model: 0.2-0.3 s at 100M values) runs in the
            # codec pool while we join and the group forms
            delta_job = work_pool().submit(torch.sub, self._state.theta, snapshot)
            expected = (self._lineage.witnesses | self._last_group) - {self.peer_id}
        rec["step"] = v
        self._transport.run(self._ar.open_session(step=v, state_hash=my_hash,
                                                  numel=snapshot.numel(), weight=weight,
                                                  deadline=t0 + 0.7 * cfg.deadline_s), 5)
        holders, early, late = self._join(work, v, my_hash, expected, discovered)
        if len(holders) < cfg.min_peers and self._unagreed(work) \
                and self._meet_others(work, rec, but=work.meet):
            # alone where our own period led us; peers at our state are at another meeting
            # (they joined after our first look): there, once
            holders, early, late = self._join(work, v, my_hash, expected, discovered)
        elif work.final and work.meet is not None and not early:
            # finished (finish.py), and a peer we expect is not at our meeting: one still
            # training may be at one of its own period's, which opened earlier and is read
            # longer than ours (seen: a finished node read each 8 s meeting for 4 s while
            # the two still training joined a 64 s period's 25 s after its opening; it
            # left 4 s before they stepped, and the swarm ended at two states)
            missing = (expected | discovered) - set(holders) - {self.peer_id}
            if missing and self._meet_others(work, rec, but=work.meet, among=missing):
                holders, early, late = self._join(work, v, my_hash, expected, discovered)
        if late is not None:
            rec["late_s"] = late
            if late > FREEZE_GRACE_S and not work.final:
                # the others froze their group (their read's end + at most the grace)
                # before our record was even stored: their leader admits nobody now (seen:
                # a slow newcomer 11 s late stood there alone). The meeting passes; our
                # delta waits for the next
                if rec["status"] != "resynced":
                    rec["status"] = "skipped"
                logger.info("%.1f s late for the meeting at %.1f: letting it pass", late,
                            work.meet)
                return
        if work.meet is not None:  # finished peers (finish.py): who steps here
            stepping = self._who_steps(rec, work, holders, expected | discovered)
            if stepping is None:
                return
            holders = stepping
        self._mark(rec, "join")
        rec["read_at"] = time.monotonic()
        rec["read_early"] = early  # every peer we expected had joined before the window's end
        if work.meet is not None:  # >= 0: the group is never read before the opening
            rec["read_after_meet_s"] = round(self._now() - work.meet, 4)
        rec["wait_seconds"] = round(rec["read_at"] - t0, 4)
        # late: the others never read our record, so their leader is the smallest of them,
        # not us (with the smallest id we would lead nobody); its freeze grace may admit us
        others = set(holders) - {self.peer_id}
        leader = min(others) if late is not None and others else min(holders)
        rec["leader"] = leader
        if work.meet is not None:
            window = self.clock.window(self.clock.longest(list(holders.values())))
            rec["window"] = round(window, 3)
        else:
            window = min(cfg.deadline_s / 2, work.window or cfg.join_window_s)
        grace = min(0.5 * window, FREEZE_GRACE_S) if work.meet is not None else 0.5 * window
        freeze_at = rec["read_at"] + (0.0 if early else grace)
        if work.meet is not None or work.window is not None:
            # the deadline's shares count from the read, as if it came join_window_s after
            # the start (a clock's window is sized by round times, a final step's by the
            # caller)
            t0 = max(t0, time.monotonic() - cfg.join_window_s)
            self._ar.session.deadline = t0 + 0.7 * cfg.deadline_s  # type: ignore[union-attr]
        # late (then never the leader while others came): as a group of one, wait for no
        # JOIN past the freeze (waiting until 0.35 x deadline_s would miss the next meetings)
        self._run_group(rec, v, my_hash, leader, delta_job, snapshot, t0, freeze_at,
                        holders, zero=work.final and work.rounds == 0, wait_joins=late is None)

    def _run_group(self, rec: dict[str, Any], v: int, my_hash: str, leader: str,
                   delta_job: Future[torch.Tensor], snapshot: torch.Tensor, t0: float,
                   freeze_at: float, seen: dict[str, int], *, zero: bool,
                   wait_joins: bool = True) -> None:
        """Form the group, all-reduce, apply, vote, commit. ``seen``: the peers whose join
        records claim our hash -> their clock code; ``delta_job``: θ − snapshot (``zero``:
        nothing trained since our delta was last counted: contribute exactly zero;
        ``wait_joins``: as leader, wait past ``freeze_at`` for those that did not JOIN yet)."""
        cfg = self.config
        remaining = t0 + 0.7 * cfg.deadline_s - time.monotonic()
        try:
            members = self._transport.run(
                self._ar.form_group(leader, freeze_at=freeze_at, expected=set(seen),
                                    latest=t0 + 0.35 * cfg.deadline_s if wait_joins
                                    else freeze_at),
                remaining)
        except (StepFailed, TimeoutError) as e:
            # left out (late JOIN, dead leader): if the others step, their version commits
            # extend ours and our next catch-up adopts them (rule 2)
            rec["error"] = f"group did not form: {e!r}"[:500]
            logger.info("outer step at version %d: %s", v, rec["error"])
            return
        self._mark(rec, "group")
        rec["peers"] = len(members)
        # the next period: the largest proposal of this group's members (every member read
        # their records, so every member takes the same)
        self.clock.heard([seen[m] for m in members if m in seen])
        if len(members) < cfg.min_peers:
            rec["status"] = "alone"
            return
        self._last_group = frozenset(members)
        t_ar = time.monotonic()
        pre: OuterState | None = None
        self._stage("exchange")
        delta = delta_job.result()
        if zero:  # exactly zero: rounding in the rebases must not look like a direction
            delta.zero_()
        with self._lock:  # the step is applied and hashed as the average lands
            landing = Landing(self._state, torch.empty_like(delta), lr=cfg.outer_lr,
                              momentum=cfg.outer_momentum)
        try:
            avg = self._transport.run(
                self._ar.exchange(delta, members, reduce_deadline=t0 + 0.55 * cfg.deadline_s,
                                  out=landing.avg, on_landed=landing.land),
                t0 + 0.7 * cfg.deadline_s - time.monotonic() + 1)
            t_ret = time.monotonic()
            rec["allreduce_seconds"] = round(t_ret - t_ar, 4)
        except (StepFailed, TimeoutError) as e:
            rec["error"] = repr(e)[:500]
        else:
            if not self._may_advance(set(self._ar.session.witnessed)):  # type: ignore[union-attr]
                rec["status"] = "minority"
                rec["error"] = "too few of the current version's contributors took part"
            else:
                pre = self._apply(landing, avg, snapshot, out=delta)
                rec["status"] = "ok"
        finally:  # record what the exchange did, also when it failed
            s = self._ar.session
            if s is not None:
                rec["bytes_sent"], rec["bytes_received"] = s.bytes_sent, s.bytes_received
                if "start" in s.marks:  # where the exchange's time went: s since its start
                    # (the last of each phase's events); the start on the wall clock lines
                    # up the peers' timelines (and a link trace) in a bench
                    marks = dict(s.marks, called=t_ar)
                    if "allreduce_seconds" in rec:
                        marks["returned"] = t_ret
                    rec["exchange_start_wall"] = time.time() - (time.monotonic()
                                                                 - s.marks["start"])
                    rec["exchange_marks"] = {k: round(t - s.marks["start"], 4)
                                             for k, t in sorted(marks.items(),
                                                                key=lambda kv: kv[1])}
                rec["excluded"] = dict(s.excluded)
                if s.bad_shards:
                    rec["bad_shards"] = dict(s.bad_shards)
                if s.clipped:
                    rec["clipped"] = list(s.clipped)
        self._mark(rec, "exchange")
        s = self._ar.session
        assert s is not None
        self._stage("commit")
        voters = set(s.witnessed) - set(s.bad_shards) - {self.peer_id}
        expect = (set(members) - s.suspects) & voters
        self._reconcile(rec, v, my_hash, pre, snapshot, voters, expect, members, nonce=s.nonce,
                        until=t0 + 0.9 * cfg.deadline_s, end=t0 + cfg.deadline_s)

    def _apply(self, landing: Landing, avg: torch.Tensor, snapshot: torch.Tensor, *,
               out: torch.Tensor) -> OuterState:
        """Apply the group's average: θ_global takes the outer step (as landed, or stepped
        now if our state changed since the landing began) and our params are rebased onto
        it (params <- θ_new + (params − snapshot), through the attempt's shift). Returns the
        state before, the one to roll back to. The new θ and the shift go into the buffers
        of ``out`` (our delta) and ``avg``, dead from here on."""
        cfg = self.config
        with self._lock:
            pre = self._state
            new = landing.state() if landing.base is pre else None
            self._state = new or pre.stepped(avg, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                                             out=out)
            self._rebase(onto=self._state.theta, base=snapshot, out=avg)
        return pre
