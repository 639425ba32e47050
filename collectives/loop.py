"""OuterLoop: the DiLoCo outer step as the trainer sees it (see collectives/__init__.py).

Two ways to drive it. ``after_round(round)`` after every inner round (the learner): never
blocks; at the first round boundary after a meeting opens on the clock (schedule.py) it
snapshots the params and starts an attempt on a background thread while inner rounds go on;
a later call applies the finished attempt and rebases the progress made meanwhile.
``outer_step()`` / ``maybe_outer_step(round)`` run one attempt and wait for it (benches).
``finish()`` (finish.py) is the last step of a run that ended: it waits for the peers'
last steps, so that nodes ending at different times still end at one state.

Who owns what: ``OuterLoop`` builds the collaborators and owns the attempts' thread and the
clock (schedule.py: read and written by both threads, under its lock); ``Holding``
(holding.py) owns θ_global, the momentum and the lineage; ``Progress`` (work.py) the live
params and the round counts, on the training thread; ``Attempt`` (attempt.py) runs one
attempt on the outer-step thread with ``Catchup``/``Fetcher`` (catchup.py), ``Rendezvous``
(rendezvous.py), ``AllReduce`` (allreduce.py, on the transport's asyncio thread: a
``Session`` per attempt, ``Matchmaker``, ``Member`` and ``ShardReducer``),
``Ballot`` (vote.py) and ``Farewell`` (finish.py), and reports a ``StepRecord`` or
``Passed`` (record.py).

One attempt (attempt.py), all under ``deadline_s`` from its start ``t0``:

    catch-up   walk the version commits that extend our lineage (a quorum of our witnesses
               signed each, consistency.py), after switching to the winning sibling if our
               version lost a fork; a joiner may adopt a trusted or anchored head;
               fetch the end state, verify its hash, adopt it by rebasing (below); everything
               else that claims a newer version is refused and counted, never fetched
    join       store <gid>/join/<version>[/<meeting>] = our state hash (signed); read the
               records that verify until every peer we expect (our version's witnesses,
               our last group) claims our hash, at most a window after the meeting opened
               (join_window_s after our record without a clock); the peers that claim our
               hash form the group. Until our period is one agreed with others, the
               meeting is the open one where peers at our state joined, if any
               (rendezvous.py);
               before the first attempt, the period of the head we would adopt is read
    group      the first of them in leader.py's order leads; JOIN / freeze -> GroupInfo
               (matchmaking.py); a leader that stalled us ranks last for a few attempts
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
become θ_new plus whatever changed since the delta was taken. An attempt never touches the
params: every rebase adds ``θ_new − θ_old`` to a shift of its own (``Work``), applied to
the live params on the caller's thread when the attempt is collected; the rounds trained
while it ran are kept by construction. ``discarded_rounds`` counts
rounds whose work was dropped anyway (only a non-finite local delta is: reducers exclude it,
and the rebase resets such params to θ_global).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import torch

from collectives.allreduce import AllReduce
from collectives.attempt import Attempt
from collectives.catchup import Catchup, Fetcher
from collectives.codec import get_codec
from collectives.feedback import ErrorFeedback
from collectives.config import OuterConfig
from collectives.consistency import CommitBook
from collectives.finish import Farewell
from collectives.holding import Holding
from collectives.record import Passed, Status, StepRecord
from collectives.rendezvous import Rendezvous
from collectives.schedule import Clock
from collectives.state import OuterState, flatten
from collectives.transport import Transport, sanitize_maddrs
from collectives.vote import Ballot
from collectives.work import Progress, Work
from protocol import Identity

__all__ = ["OuterLoop", "group_id"]

logger = logging.getLogger(__name__)

POLL_S = 0.05
"""How often a finished node looks at the clock for the next meeting (``finish``)."""


def _trust_nobody(_peer: str) -> bool:
    return False


_DONE: Future[None] = Future()
_DONE.set_result(None)


def _dht_time() -> float:
    from hivemind.utils import get_dht_time  # the DHT's clock (wall clock)

    return float(get_dht_time())


def group_id(group: str, config: OuterConfig) -> str:
    """The namespace of a model's outer steps (DHT keys, stream protocols): the model's
    fingerprint and the wire format, so that peers average only with peers whose frames
    they can read (a node with another codec, or another sparse k, meets its own kind)."""
    wire = config.compression + (f":k{config.sparse.k}" if config.compression == "sparse"
                                 else "")
    return hashlib.sha256(f"{group}\n{wire}".encode()).hexdigest()[:24]


class OuterLoop:
    """DiLoCo outer steps among the peers that share ``group`` (the model fingerprint).

    ``trust(peer_id)``: whether a joiner (no lineage beyond genesis) may adopt a state that
    peer signed; wire it to peers this node has exchanged valid rollouts with for a while.
    The default trusts nobody: a joiner then trains on its own state and averages only with
    peers at its own hash (see consistency.py).

    ``genesis``: θ of version 0, flat fp32 — the base model every peer of the group starts
    from (default: the params now; pass the base weights when the loop is created after the
    first inner rounds, or every node's genesis differs and none can group with another).

    Construction starts p2pd and the DHT (``Transport``): seconds, up to minutes on a loaded
    host. ``abort`` set by another thread abandons it (``StartCancelled``, nothing left
    running); ``start.Startup`` builds a loop that way off the training thread.
    """

    def __init__(self, config: OuterConfig, *, identity: Identity, group: str,
                 params: list[torch.nn.Parameter] | torch.nn.Module, data_dir: str,
                 discover: Callable[[], list[str]],
                 trust: Callable[[str], bool] = _trust_nobody,
                 genesis: torch.Tensor | None = None,
                 on_stage: Callable[[str], None] | None = None,
                 now: Callable[[], float] = _dht_time,
                 abort: threading.Event | None = None) -> None:
        if not group:
            raise ValueError("group must be a non-empty string")
        self.config = config
        self.group = group
        self.peer_id = identity.peer_id
        plist = list(params.parameters()) if isinstance(params, torch.nn.Module) \
            else list(params)
        theta = flatten(plist)
        if genesis is not None:
            if genesis.dim() != 1 or genesis.numel() != theta.numel():
                raise ValueError(f"genesis has {genesis.numel()} values, params {theta.numel()}")
            theta = genesis.detach().to("cpu", torch.float32).clone()
        self._progress = Progress(plist)
        """The live params and the round counts (the training thread's)."""
        self._holding = Holding(theta, peer_id=self.peer_id, momentum=config.optimizer.momentum,
                                minority_patience=config.group.minority_patience)
        self._discover = discover
        self._on_stage = on_stage
        """Told "rendezvous", "exchange" and "commit" as an attempt reaches them (status view)."""
        self._now = now
        """DHT time (the meetings' clock; injectable for tests)."""
        schedule = config.schedule
        self.clock = Clock(every_rounds=config.every_rounds, period_s=schedule.period_s,
                           min_period_s=schedule.min_period_s, max_period_s=schedule.max_period_s,
                           min_window_s=schedule.join_window_s, max_window_s=schedule.max_period_s)
        self._pending: tuple[Work, Future[StepRecord | Passed]] | None = None
        """The attempt running on the outer-step thread (only that thread touches its Work
        until it is collected)."""
        self._scout: Future[None] | None = None
        """The read of the agreed period before our first attempt (``_period_known``)."""
        self._last_round_end: float | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outer-step")
        gid = group_id(group, config)
        self._transport = Transport(config, identity=identity, data_dir=data_dir,
                                    initial_peers=self._safe_discover(), abort=abort)
        try:
            codec = get_codec(config.compression, k=config.sparse.k)
            self._ar = AllReduce(self._transport.p2p, config, codec,
                                 peer_id=self.peer_id, gid=gid,
                                 state_provider=self._holding.serve)
            self._transport.run(self._ar.start(), 10)
        except BaseException:
            self._transport.close()  # its p2pd and DHT would outlive us
            raise
        book = CommitBook(identity=identity, group=group, gid=gid, swarm_id=config.swarm_id)
        transport = self._transport
        self._catchup = Catchup(config=config, peer_id=self.peer_id, book=book,
                                transport=transport, trust=trust)
        self._farewell = Farewell(config=config, peer_id=self.peer_id, book=book,
                                  transport=transport)
        self._attempt = Attempt(
            config=config, peer_id=self.peer_id, holding=self._holding, clock=self.clock,
            transport=transport, ar=self._ar, book=book, catchup=self._catchup,
            fetcher=Fetcher(transport=transport, ar=self._ar, peer_id=self.peer_id,
                            numel=theta.numel()),
            rendezvous=Rendezvous(config=config, peer_id=self.peer_id, book=book,
                                  transport=transport, clock=self.clock, now=now),
            ballot=Ballot(config=config, peer_id=self.peer_id, book=book, transport=transport),
            farewell=self._farewell, discover=self._safe_discover, now=now,
            feedback=ErrorFeedback(codec, decay=config.sparse.error_decay)
            if config.compression == "sparse" else None,
            on_stage=self._stage)
        self._maddrs: list[str] | None = None

    # --- public ---------------------------------------------------------------------------
    def collective_addrs(self) -> list[str]:
        """This node's hivemind multiaddrs (with /p2p/<peer id>), to announce."""
        if self._maddrs is None:
            self._maddrs = self._transport.maddrs()
        return list(self._maddrs)

    def state_hash(self) -> str:
        return self._holding.hash()

    def state(self) -> OuterState:
        """A copy of the outer state (θ_global, momentum, version) with its hash recorded:
        what a checkpoint keeps of it (the copy costs 8 bytes per parameter)."""
        return self._holding.copy()

    @property
    def in_flight(self) -> bool:
        """Whether an attempt runs in the background."""
        return self._pending is not None

    def count_rounds(self, rounds: int) -> None:
        """Count ``rounds`` inner rounds trained before this loop was up (call on the thread
        that trains, before its first ``after_round``): the delta from genesis holds them,
        so they weigh in our next contribution like rounds counted by ``after_round``."""
        if rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {rounds}")
        self._progress.pending += rounds

    def after_round(self, round: int, *, seconds: float | None = None,
                    weight: float | None = None) -> StepRecord | None:
        """Call after every inner round, on the thread that trains; never blocks on the
        network. Collects a finished attempt (applies it, rebasing the rounds trained while
        it ran; returns its record), and at the first round boundary after a meeting opens
        on the clock starts the next one in the background. ``seconds``: how long this
        round took (default: the time since the previous call)."""
        del round  # the clock, not the round number, says when to meet
        now = time.monotonic()
        if seconds is None and self._last_round_end is not None:
            seconds = now - self._last_round_end
        self._last_round_end = now
        if seconds is not None:
            self.clock.observe_round(seconds)
        self._progress.pending += 1
        if self._pending is not None:
            self._pending[0].rounds_during += 1
        rec = self.collect()
        if self._pending is None and self.clock.round_s is not None \
                and self._period_known():  # a pace to propose
            # agreed period: start up to prepare_s before the meeting (the group is read
            # from its opening on, rendezvous.py); else among the meetings open now
            meet = self.clock.due(self._now(), lead=self.config.schedule.prepare_s
                                  if self.clock.agreed else 0.0)
            # with no peer known (none discovered, none met) nobody can come: no attempt
            if meet is not None and (self._holding.knows_peers() or self._safe_discover()):
                self.start(meet=meet, weight=weight)
        return rec

    def collect(self) -> StepRecord | None:
        """``poll()`` as the round loop needs it: the record of a finished attempt (applied
        to the params), None while it runs or if its meeting passed without a step."""
        got = self._poll()
        if got is None:
            return None
        # a meeting that opened while this attempt ran is let pass: its group was busy
        # too (members end together), so whoever went would go alone
        self.clock.skip_until(got.ended_at)
        return got if isinstance(got, StepRecord) else None

    def _period_known(self) -> bool:
        """Whether we may go to a meeting: not before the period of the version we would
        adopt has been read (once, in the background, when the first peer is known;
        ``_read_agreed``), so that a newcomer's first meeting is the others'."""
        if self._scout is None:
            if self.clock.agreed or not self._safe_discover():
                return True  # nobody to read it from yet
            self._scout = self._pool.submit(self._read_agreed)
        if not self._scout.done():
            return False
        if self._scout.exception() is not None:
            logger.warning("reading the agreed period failed: %r", self._scout.exception())
        self._scout = _DONE
        return True

    def _read_agreed(self) -> None:
        """Before our first attempt, on the outer-step thread: meet on the period of the
        head a joiner would adopt (catchup.py ``Catchup.agreed``)."""
        self._transport.add_dht_peers(self._safe_discover(),
                                      timeout=self.config.schedule.dht_op_timeout_s)
        agreed = self._catchup.agreed(self._holding.lineage())
        if agreed is not None:
            version, codes = agreed
            self.clock.adopt(list(codes))
            logger.info("meeting on the period of version %d (%.0f s) from the first attempt",
                        version, self.clock.period())

    def start(self, *, meet: float | None = None, weight: float | None = None,
              window: float | None = None) -> bool:
        """Snapshot the params and start an attempt in the background (False if one is
        still running). ``meet``: its meeting time on the clock (None: meet now, reading the
        group ``window`` (default ``join_window_s``) after our join record, or as soon as
        every peer we expect or discovered has joined)."""
        if self._pending is not None:
            return False
        self._submit(Work(snapshot=self._progress.snapshot(), rounds=self._progress.pending,
                          weight=weight, meet=meet, window=window))
        return True

    def _submit(self, work: Work) -> None:
        self._pending = (work, self._pool.submit(self._attempt.run, work))

    def poll(self, *, wait: float | None = 0.0) -> StepRecord | None:
        """The record of a finished attempt, after applying it to the params (on the
        caller's thread); None while it runs or if its meeting passed without a step
        (``wait``: seconds to wait, None = forever)."""
        got = self._poll(wait=wait)
        return got if isinstance(got, StepRecord) else None

    def _poll(self, *, wait: float | None = 0.0) -> StepRecord | Passed | None:
        if self._pending is None:
            return None
        work, fut = self._pending
        if wait is not None and wait <= 0 and not fut.done():
            return None
        try:
            got = fut.result(timeout=wait)
        except FutureTimeout:
            return None
        except Exception as e:  # noqa: BLE001 - a bug must not stop training: it is the
            # step's error; what it did to the state came with its rebases, applied below
            logger.exception("outer step crashed")
            got = StepRecord(step=self._holding.version(), status=Status.FAILED,
                             version=self._holding.version(), param_hash=self.state_hash(),
                             error=f"crashed: {e!r}"[:500], ended_at=self._now())
        self._pending = None
        counts = self._progress.collect(work, reset=self._holding.reset)
        return got.with_observed(**counts) if isinstance(got, StepRecord) else got

    def maybe_outer_step(self, round: int, *, weight: float | None = None,
                         ) -> StepRecord | None:
        """Count one inner round; after every ``every_rounds`` rounds run an outer step and
        wait for it; return its record, else None. ``weight``: this contribution's declared
        weight (default: ``config.bounds.weight`` x the rounds since our delta was last counted)."""
        self._progress.pending += 1
        if (round + 1) % self.config.every_rounds != 0:
            return None
        return self.outer_step(weight=weight)

    def outer_step(self, *, weight: float | None = None,
                   window: float | None = None) -> StepRecord:
        """One outer step attempt now, waited for (an attempt already running is collected
        first); never raises a CollectiveError, never blocks past ``deadline_s`` (plus the
        DHT/stream timeouts' slack). ``window``: see ``start``."""
        if self._pending is not None:
            earlier = self._poll(wait=None)
            logger.info("collected a background step first: %s", earlier)
        self.start(weight=weight, window=window)
        got = self._poll(wait=None)
        assert isinstance(got, StepRecord), got  # a meeting-less attempt always reports
        return got

    def finish(self, *, stop: threading.Event | None = None,
               on_record: Callable[[StepRecord], None] | None = None) -> StepRecord | None:
        """Our run ended: attend the meetings until the end (finish.py's docstring). Every
        step's record goes to ``on_record``; returns the last (None if none). Bounded by
        about ``2 × final_wait_s + deadline_s``; ``stop`` set (a signal) ends it within a
        meeting. A step still running is collected first."""
        last: StepRecord | None = None
        if self._pending is not None:
            last = self.poll(wait=None)
            if last is not None and on_record is not None:
                on_record(last)
        self.clock.finish()
        start = time.monotonic()
        cfg = self.config.schedule
        while not (stop is not None and stop.is_set()) \
                and time.monotonic() - start < 2 * cfg.final_wait_s + cfg.deadline_s:
            meet = self.clock.due(self._now())
            if meet is None:
                time.sleep(POLL_S)
                continue
            self._submit(Work(snapshot=self._progress.snapshot(),
                              rounds=self._progress.pending, weight=None, meet=meet,
                              final=True,
                              last_call=time.monotonic() - start > cfg.final_wait_s))
            got = self._poll(wait=None)
            if isinstance(got, Passed):
                if got.end:
                    break
                continue
            assert got is not None
            last = got
            if on_record is not None:
                on_record(got)
        logger.info("finished after %.1f s", time.monotonic() - start)
        return last

    def close(self) -> None:
        if self._pending is not None:
            try:
                self._poll(wait=min(self.config.schedule.deadline_s + 5, 30.0))
            except Exception as e:  # noqa: BLE001 - leaving anyway
                logger.warning("outer step still running at close: %s", e)
        self._farewell.say_left(self._holding.version())
        try:
            self._transport.run(self._ar.close(), 10)
        except Exception as e:  # noqa: BLE001 - leaving anyway
            logger.debug("all-reduce close: %s", e)
        self._pool.shutdown(wait=False)
        self._transport.close()

    # --- callbacks ------------------------------------------------------------------------
    def _stage(self, name: str) -> None:
        if self._on_stage is not None:
            try:
                self._on_stage(name)
            except Exception as e:  # noqa: BLE001 - the status view must never break a step
                logger.debug("on_stage(%s) failed: %s", name, e)

    def _safe_discover(self) -> list[str]:
        try:
            found = [a for a in self._discover() if isinstance(a, str)][:256]
            return sanitize_maddrs(found)
        except Exception as e:  # noqa: BLE001 - the caller's callback must not break us
            logger.warning("discover() failed: %s", e)
            return []
