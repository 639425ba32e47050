"""The outer step's arithmetic from the members' params to their params, in-process (issue 29).

Each member is an ``OuterLoop``'s ``Progress`` and ``Holding`` (snapshot, rebase, collect: no
DHT); the
pseudo-gradients θ_global − θ_i go through the real exchange over p2pd daemons on loopback
(allreduce.py, the reducers' robust mean, codec "none"), the step lands range by range
(landing.py) and is applied as an attempt applies it (``Holding.apply``). Values are
small dyadic fractions, so every fp32 sum, mean and difference below is exact and the checks
are bit for bit: with 4 members each weight is 1/4 (a reducer sums w_i/W · x_i).
"""

from __future__ import annotations

import asyncio
import gc

import pytest
import torch

from collectives import OuterConfig
from collectives.config import OptimizerConfig
from collectives.holding import Holding
from collectives.state import OuterState, flatten
from collectives.work import Progress, Work
from tests.collectives.test_exchange import _group, _members

# the daemons' client connections of a finished exchange are finalized after the loop closed
# (as in test_endpoints.py): collected here under these filters, not in a later test
pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]
NUMEL = 3000
PLAIN = OuterConfig(optimizer=OptimizerConfig(lr=1.0, momentum=0.0))


def _dyadic(g: torch.Generator, scale: int = 8) -> torch.Tensor:
    """Values k/scale, |k| <= 2*scale: exact in fp32, and so are their sums and means."""
    return torch.randint(-2 * scale, 2 * scale + 1, (NUMEL,), generator=g).float() / scale


class Member:
    """One node's side of the outer step without the network: the live params and round
    counts (``Progress``), θ_global (``Holding``), the attempt in flight."""

    def __init__(self, theta: torch.Tensor, config: OuterConfig) -> None:
        self.config = config
        self.params = [torch.nn.Parameter(theta.clone().view(30, 100))]
        self.progress = Progress(self.params)
        self.holding = Holding(flatten(self.params), peer_id="m",
                               momentum=config.optimizer.momentum, minority_patience=3)
        self.work: Work | None = None

    @property
    def state(self) -> OuterState:
        return self.holding.copy()


def _members_at(theta: torch.Tensor, n: int, config: OuterConfig) -> list[Member]:
    """``n`` members whose θ_global and params are ``theta`` (a fresh swarm at genesis)."""
    return [Member(theta, config) for _ in range(n)]


def _train(loop: Member, work: torch.Tensor, rounds: int = 1) -> None:
    """``rounds`` inner rounds that moved the params by ``work``."""
    with torch.no_grad():
        loop.params[0].view(-1).add_(work)
    loop.progress.pending += rounds
    if loop.work is not None:
        loop.work.rounds_during += rounds


def _begin(loops: list[Member]) -> list[Work]:
    """Every member snapshots its params for an attempt (as ``OuterLoop.start``)."""
    works = []
    for loop in loops:
        loop.work = Work(snapshot=loop.progress.snapshot().clone(),
                         rounds=loop.progress.pending, weight=None)
        works.append(loop.work)
    return works


def _exchange_and_apply(loops: list[Member], works: list[Work]) -> torch.Tensor:
    """The group's exchange and apply on every member (on its attempt's thread in a node);
    returns the average they all applied. Not collected yet: see ``_collect``."""

    async def main() -> list[torch.Tensor]:
        p2ps = await _group(len(loops))
        try:
            ars, group = await _members(p2ps, "none", NUMEL, loops[0].config)
            landings, deltas = [], []
            starts = [loop.holding.start(work) for loop, work in zip(loops, works)]
            for loop, start in zip(loops, starts):
                deltas.append(start.delta.result())
                landings.append(loop.holding.landing(deltas[-1], lr=loop.config.optimizer.lr))
            aloop = asyncio.get_running_loop()
            avgs = await asyncio.gather(*(
                ar.exchange(d, group, reduce_deadline=aloop.time() + 50, out=la.avg,
                            on_landed=la.land) for ar, d, la in zip(ars, deltas, landings)))
            for ar in ars:
                assert ar.session.shard.verdict == "ok" and not ar.session.shard.excluded
            for loop, work, la, avg, d, start in zip(loops, works, landings, avgs, deltas,
                                                     starts):
                loop.holding.apply(la, avg.clone(), start.snapshot, work,
                                   lr=loop.config.optimizer.lr, out=d)
                work.counted = True  # the group's votes agreed (attempt.py sets it)
            return [la.avg for la in landings]
        finally:
            for p in reversed(p2ps):
                await p.shutdown()

    avgs = asyncio.run(main())
    gc.collect()
    for avg in avgs[1:]:
        assert torch.equal(avg, avgs[0])
    return avgs[0]


def _collect(loops: list[Member], works: list[Work]) -> list[dict]:
    recs = []
    for loop, work in zip(loops, works):
        loop.work = None
        recs.append(loop.progress.collect(work, reset=loop.holding.reset))
    return recs


def _theta(loop: Member) -> torch.Tensor:
    return flatten(loop.params)


def test_plain_averaging_leaves_every_member_at_exactly_the_mean_of_their_params() -> None:
    """lr 1, no momentum: θ_global − mean(θ_global − θ_i) = mean(θ_i), on every member,
    bit for bit (and θ_global is it too)."""
    g = torch.Generator().manual_seed(29)
    theta0 = _dyadic(g)
    loops = _members_at(theta0, 4, PLAIN)
    for loop in loops:
        _train(loop, _dyadic(g), rounds=2)
    trained = [_theta(loop) for loop in loops]
    works = _begin(loops)
    avg = _exchange_and_apply(loops, works)
    recs = _collect(loops, works)
    mean = torch.stack(trained).sum(0) / 4
    for loop, rec in zip(loops, recs):
        assert torch.equal(_theta(loop), mean)
        assert torch.equal(loop.state.theta, mean)
        assert torch.equal(loop.state.momentum, avg)  # unused: the last step's size
        assert (rec["rounds_pending"], rec["discarded_rounds"]) == (0, 0)
    assert len({loop.state.hash() for loop in loops}) == 1


def test_a_step_among_identical_peers_changes_nothing() -> None:
    """Members that trained the same: the plain mean is what each holds (averaging costs
    nothing); members that did not train (zero deltas, zero momentum) keep θ under any
    lr and momentum, only the version advances."""
    g = torch.Generator().manual_seed(7)
    theta0 = _dyadic(g)
    same = _dyadic(g)
    loops = _members_at(theta0, 4, PLAIN)
    for loop in loops:
        _train(loop, same)
    works = _begin(loops)
    avg = _exchange_and_apply(loops, works)
    _collect(loops, works)
    assert torch.equal(avg, -same)
    for loop in loops:
        assert torch.equal(_theta(loop), theta0 + same)
    nesterov = OuterConfig(optimizer=OptimizerConfig(lr=0.7, momentum=0.9))
    idle = _members_at(theta0, 3, nesterov)
    before = {loop.state.hash() for loop in idle}
    works = _begin(idle)
    _exchange_and_apply(idle, works)
    _collect(idle, works)
    for loop in idle:
        assert torch.equal(_theta(loop), theta0) and torch.equal(loop.state.theta, theta0)
        assert loop.state.version == 1
    assert len({loop.state.hash() for loop in idle}) == 1
    assert {loop.state.hash() for loop in idle} != before  # the version is in the hash


def test_rounds_trained_during_a_background_step_count_once_in_the_next() -> None:
    """Members trained u_i, snapshot, then trained w_i while the step ran. The step averages
    the u_i only; after it each holds θ_1 + w_i; the next step's pseudo-gradient is exactly
    −w_i: the overlap counted once, neither dropped nor counted again. With the plain mean
    the two steps end at θ_0 + mean(u_i + w_i); with Nesterov the second average is the
    same mean(w) (the optimizer sees each round's work once)."""
    for config in (PLAIN, OuterConfig(optimizer=OptimizerConfig(lr=0.5, momentum=0.5))):
        g = torch.Generator().manual_seed(3)
        theta0 = _dyadic(g)
        loops = _members_at(theta0, 4, config)
        u = [_dyadic(g) for _ in loops]
        w = [_dyadic(g) for _ in loops]
        for loop, ui in zip(loops, u):
            _train(loop, ui, rounds=3)
        works = _begin(loops)
        for loop, wi in zip(loops, w):  # the step runs in the background meanwhile
            _train(loop, wi, rounds=2)
        avg1 = _exchange_and_apply(loops, works)
        recs = _collect(loops, works)
        assert torch.equal(avg1, -torch.stack(u).sum(0) / 4)
        theta1 = loops[0].state.theta.clone()
        for loop, wi, rec in zip(loops, w, recs):
            assert torch.equal(_theta(loop), theta1 + wi)
            assert (rec["rounds_pending"], rec["overlap_rounds"]) == (2, 2)
        works = _begin(loops)
        assert [wk.rounds for wk in works] == [2] * 4
        avg2 = _exchange_and_apply(loops, works)
        recs = _collect(loops, works)
        assert torch.equal(avg2, -torch.stack(w).sum(0) / 4)
        for loop, rec in zip(loops, recs):
            assert torch.equal(_theta(loop), loop.state.theta)
            assert (rec["rounds_pending"], rec["discarded_rounds"]) == (0, 0)
        if config is PLAIN:
            total = torch.stack([ui + wi for ui, wi in zip(u, w)]).sum(0) / 4
            assert torch.equal(loops[0].state.theta, theta0 + total)
