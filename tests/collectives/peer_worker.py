"""One outer-loop peer in its own process, driven by tests/collectives and the bench.

Usage: python -m tests.collectives.peer_worker --dir D --name NAME --seed S [options]

Peers find each other through D/addrs/<name>.txt (their collective_addrs; ``--addrs-dir``:
another directory, e.g. one per peer holding the tunnelled addresses of NATed peers as that
peer reaches them, bench/wan/outer_nat.py), meet at a file
barrier D/barrier/<i>/ before each outer step, and write per step: D/out/<name>.jsonl (the
record) and D/out/<name>-<i>.npz (θ_global before, own pseudo-gradient, θ_global after).

``--clock`` (the bench, the churn trials): no barrier and no blocking step; the peer trains
like a node (``OuterLoop.after_round`` after every inner round of ``--round-s`` seconds) and
meets the others on the clock, see ``run_on_clock``. There a fault is ordered by writing
``KIND AFTER`` to D/fault/<name> (harness.py ``run_churn``): it strikes in the peer's next
all-reduce, and D/out/<name>.killed says at which meeting.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import faulthandler
import math
import signal
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from collectives import OuterConfig, OuterLoop
from collectives.config import ScheduleConfig, TransportConfig
from collectives.allreduce import LINGER_S, AllReduce
from collectives.member import Member
from collectives.reducer import ShardReducer
from collectives.rendezvous import Rendezvous
from collectives.vote import Ballot
from protocol import Identity, atomic_write_bytes

SHAPES = [(100, 50), (50,), (200, 30)]


class Fault(enum.Enum):
    """Where a peer crashes (SIGKILL to its whole process group: python, p2pd, DHT child)."""

    NONE = "none"
    MEMBER = "member"
    """After `after` completed member-side exchanges (0: before sending anything)."""
    REDUCER = "reducer"
    """After answering `after` members with its reduced shard (a partial all-gather)."""
    VOTE = "vote"
    """After a whole exchange, before its vote (`after` is ignored): every member's reducer
    accepted its contribution and ours answered every member (its mean and verdict sent),
    so every survivor completes the exchange and counts it among the voters."""


FAULT: dict[str, object] = {"kind": Fault.NONE, "after": 0, "n": 0, "loop": None,
                            "mark": None, "answering": 0}
"""The fault ordered (kind, after), the exchanges counted since, the clock path's loop, the
file that says at which meeting the fault struck, and how many members our reducer is
still answering (VOTE waits for none)."""

ANSWERED_WAIT_S = 10.0
"""VOTE: how long the vote waits for our reducer's last answers before the crash anyway."""


def crash() -> None:
    loop, mark = FAULT["loop"], FAULT["mark"]
    if isinstance(loop, OuterLoop) and isinstance(mark, Path):
        pending = loop._pending  # the attempt this fault interrupts
        work = pending[0] if pending is not None else None
        atomic_write_bytes(mark, json.dumps({"meet": work and work.meet}).encode())
    os.killpg(os.getpgid(0), signal.SIGKILL)


def install_faults() -> None:
    """Wrap AllReduce's member and reducer exchanges in this (test) process only, before
    the loop registers its stream handlers: a fault ordered in FAULT strikes in the next
    all-reduce (MEMBER: after ``after`` completed exchanges with reducers; REDUCER: after
    answering ``after`` members; VOTE: once the exchange is over, before the vote)."""
    for fault, owner, name in ((Fault.MEMBER, Member, "_exchange_with"),
                               (Fault.REDUCER, AllReduce, "_on_reduce")):
        original = getattr(owner, name)

        def wrap(fault: Fault = fault, original=original):  # type: ignore[no-untyped-def]
            async def wrapped(self, *a, **kw):  # type: ignore[no-untyped-def]
                armed = FAULT["kind"] is fault and getattr(self, "session", 0) is not None
                if armed and FAULT["after"] == 0:
                    crash()
                result = await original(self, *a, **kw)
                if armed:
                    FAULT["n"] = int(FAULT["n"]) + 1  # type: ignore[call-overload]
                    if FAULT["n"] >= FAULT["after"]:  # type: ignore[operator]
                        crash()
                return result
            return wrapped

        setattr(owner, name, wrap())
    on_reduce = AllReduce._on_reduce

    async def answering(self, peer, reader, writer):  # type: ignore[no-untyped-def]
        FAULT["answering"] = int(FAULT["answering"]) + 1  # type: ignore[call-overload]
        try:
            await on_reduce(self, peer, reader, writer)
            # answered once the member closed (it read our verdict), as _guard waits
            # (p2pd may still hold what we wrote)
            try:
                await asyncio.wait_for(reader.read(1), LINGER_S)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        finally:
            FAULT["answering"] = int(FAULT["answering"]) - 1  # type: ignore[call-overload]

    AllReduce._on_reduce = answering  # type: ignore[method-assign]
    settle = Ballot.settle

    def before_vote(self, *a, **kw):  # type: ignore[no-untyped-def]
        if FAULT["kind"] is Fault.VOTE:
            # our member side has every shard, but our reducer (on the transport's loop)
            # may still be sending a slower member our mean or verdict: killed then, that
            # member fails the exchange (a REDUCER fault) and adopts the others' state
            t = time.monotonic()
            while FAULT["answering"] and time.monotonic() < t + ANSWERED_WAIT_S:
                time.sleep(0.01)
            logging.getLogger(__name__).info("vote fault: %.2f s for the last answers",
                                             time.monotonic() - t)
            crash()
        return settle(self, *a, **kw)

    Ballot.settle = before_vote  # type: ignore[method-assign]


def late_joins(by: float, count: int) -> None:
    """The first ``count`` attempts on the clock join ``by`` seconds after their meeting
    opened (a slow newcomer's round boundary, a rendezvous over a WAN)."""
    if count <= 0:
        return
    original = Rendezvous.join
    left = [count]

    def join(self, work, *a, **kw):  # type: ignore[no-untyped-def]
        if work.meet is not None and left[0] > 0:
            left[0] -= 1
            time.sleep(max(0.0, work.meet + by - self._now()))
        return original(self, work, *a, **kw)

    Rendezvous.join = join  # type: ignore[method-assign]


def make_model(numel: int | None) -> torch.nn.ParameterList:
    g = torch.Generator().manual_seed(1234)  # the same initial weights on every peer
    shapes = SHAPES if numel is None else [(numel,)]
    return torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes])


def discover(addrs: Path, me: str) -> list[str]:
    out: list[str] = []
    for f in sorted(addrs.glob("*.txt")):
        if f.stem != me:
            out += [line for line in f.read_text().split() if line]
    return out


def poison_reducer(kind: str) -> None:
    """Our reducer's mean shard becomes NaN or 1e6 x after an honest reduction."""
    if kind == "none":
        return
    original = ShardReducer.encode_mean

    def wrapped(self, mean):  # type: ignore[no-untyped-def]
        return original(self, mean * 1e6 if kind == "huge" else torch.full_like(mean, math.nan))

    ShardReducer.encode_mean = wrapped  # type: ignore[method-assign]


def known_peer_ids(root: Path, names: str) -> set[str]:
    """Peer ids in D/addrs/<name>.txt for ``names`` (comma-separated, or "all")."""
    wanted = None if names == "all" else set(names.split(","))
    out = set()
    for f in (root / "addrs").glob("*.txt"):
        if wanted is None or f.stem in wanted:
            out |= {line.rsplit("/p2p/", 1)[-1] for line in f.read_text().split() if line}
    return out


def wait_for_record(root: Path, name: str, i: int, timeout: float) -> None:
    path = root / "out" / f"{name}.jsonl"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and any(json.loads(line)["i"] == i
                                 for line in path.read_text().splitlines()):
            return
        time.sleep(0.05)


def barrier(root: Path, i: int, me: str, n: int, timeout: float) -> None:
    d = root / "barrier" / str(i)
    d.mkdir(parents=True, exist_ok=True)
    (d / me).touch()
    end = time.monotonic() + timeout
    while len(list(d.iterdir())) < n and time.monotonic() < end:
        time.sleep(0.05)


def _barrier_size(args: argparse.Namespace, step: int) -> int:
    if args.peers_from:
        start, n = map(int, args.peers_from.split(":"))
        if step >= start:
            return n
    return int(args.peers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--start-step", type=int, default=0)
    ap.add_argument("--peers", type=int, default=4, help="barrier size")
    ap.add_argument("--peers-from", default="", help="STEP:N: from STEP on the barrier size "
                    "is N (the steps a joiner started with --start-step STEP takes part in)")
    ap.add_argument("--compression", default="fp16")
    ap.add_argument("--poison", choices=["none", "nan", "huge"], default="none")
    ap.add_argument("--numel", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=14.0)
    ap.add_argument("--join-window", type=float, default=2.0)
    ap.add_argument("--barrier-timeout", type=float, default=30.0)
    ap.add_argument("--host", default="/ip4/127.0.0.1/tcp/0", help="p2pd listen maddr")
    ap.add_argument("--addrs-dir", default="", help="where the peers' addresses are read "
                    "(<name>.txt each, ours included); default D/addrs, where ours is written")
    ap.add_argument("--no-save", action="store_true", help="skip the .npz arrays (bench)")
    ap.add_argument("--trust", default="", help="peer names to trust as a joiner, or 'all'")
    ap.add_argument("--skip-steps", default="", help="steps (comma-separated) whose outer "
                    "step this peer leaves out (it trains on and passes the barrier)")
    ap.add_argument("--solo-steps", type=int, default=0,
                    help="steps below this one do not wait for the other peers")
    ap.add_argument("--after", default="", help="NAME: before each solo step, wait until "
                    "NAME recorded it (so solo steps never overlap)")
    ap.add_argument("--weight", type=float, default=None, help="declared weight (hostile)")
    ap.add_argument("--poison-reducer", choices=["none", "nan", "huge"], default="none",
                    help="this peer's reducer returns a poisoned mean shard")
    ap.add_argument("--clock", action="store_true", help="meet on the clock (run_on_clock): "
                    "--steps grouped steps, then stop")
    ap.add_argument("--round-s", type=float, default=0.05, help="--clock: inner round time")
    ap.add_argument("--every-rounds", type=int, default=2)
    ap.add_argument("--period", type=float, default=0.0, help="--clock: period_s (0: adapt)")
    ap.add_argument("--min-period", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=300.0,
                    help="--clock: stop after this many seconds anyway")
    ap.add_argument("--late-by", type=float, default=0.0,
                    help="--clock: store the join record this many seconds after the meeting "
                    "opened, at the first --late-joins meetings")
    ap.add_argument("--late-joins", type=int, default=0)
    args = ap.parse_args()
    if args.clock:
        install_faults()
        late_joins(args.late_by, args.late_joins)
    poison_reducer(args.poison_reducer)
    skip = {int(x) for x in args.skip_steps.split(",") if x}
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(name)s %(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1)  # Swarm.wait_done: a hung peer's stacks
    root = Path(args.dir)
    (root / "out").mkdir(parents=True, exist_ok=True)
    (root / "addrs").mkdir(parents=True, exist_ok=True)
    view = Path(args.addrs_dir) if args.addrs_dir else root / "addrs"
    identity = Identity.from_seed(args.seed.to_bytes(32, "little"))
    model = make_model(args.numel)
    cfg = OuterConfig(every_rounds=args.every_rounds, compression=args.compression,
                      schedule=ScheduleConfig(deadline_s=args.deadline,
                                              join_window_s=args.join_window,
                                              period_s=args.period, min_period_s=args.min_period),
                      transport=TransportConfig(host_maddrs=(args.host,)))
    trust = (lambda p: p in known_peer_ids(root, args.trust)) if args.trust else None
    loop = OuterLoop(cfg, identity=identity, group="test-model", params=model,
                     data_dir=str(root / "data" / args.name),
                     discover=lambda: discover(view, args.name),
                     **({"trust": trust} if trust else {}))
    if args.clock:  # the drift is drawn before we say we are up (100M values take seconds)
        gen = torch.Generator().manual_seed(args.seed)
        noise = [torch.randn(p.shape, generator=gen) * 0.01 for p in model]
    atomic_write_bytes(root / "addrs" / f"{args.name}.txt",
                       "\n".join(loop.collective_addrs()).encode())
    if args.clock:
        run_on_clock(loop, model, noise, root, view, args)
        return
    gen = torch.Generator().manual_seed(args.seed)
    for i in range(args.start_step, args.start_step + args.steps):
        for r in range(2 * i, 2 * i + 2):
            with torch.no_grad():  # "inner training": a deterministic local drift
                for p in model:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.01)
                    if args.poison == "nan" and r % 2 == 1:
                        p.view(-1)[::500] = float("nan")  # hits every reducer's shard
                    if args.poison == "huge" and r % 2 == 1:
                        p.mul_(1e6)
            if r % 2 == 1:
                solo = i < args.solo_steps
                if solo and args.after:
                    wait_for_record(root, args.after, i, args.barrier_timeout)
                barrier(root, i, args.name, 1 if solo else _barrier_size(args, i),
                        args.barrier_timeout)
                if i in skip:
                    continue
            if r % 2 == 1 and not args.no_save:
                before = loop.state().theta.numpy()
                local = torch.cat([p.detach().reshape(-1) for p in model]).numpy().copy()
            rec = loop.maybe_outer_step(r, weight=args.weight)
            if rec is not None and not args.no_save:
                after = loop.state().theta.numpy()
                params = torch.cat([p.detach().reshape(-1) for p in model]).numpy().copy()
                np.savez(root / "out" / f"{args.name}-{i}.npz", before=before,
                         delta=before - local, after=after, local=local, params=params)
            if rec is not None:
                with open(root / "out" / f"{args.name}.jsonl", "a") as f:
                    f.write(json.dumps({**rec.to_dict(), "i": i}) + "\n")
    finish(loop, root, args.name)


def finish(loop: OuterLoop, root: Path, name: str) -> None:
    """Mark this peer done, stay reachable as a state holder until the test says stop."""
    (root / "out" / f"{name}.done").touch()
    end = time.monotonic() + 60
    while not (root / "stop").exists() and time.monotonic() < end:
        time.sleep(0.1)
    loop.close()


def run_on_clock(loop: OuterLoop, model: torch.nn.ParameterList, noise: list[torch.Tensor],
                 root: Path, view: Path, args: argparse.Namespace) -> None:
    """Train like a node and meet on the clock until ``--steps`` steps formed a group (or
    every other peer is done).

    Waits until ``--peers`` peers' addresses are in ``view``, then runs inner rounds: a sleep of
    ``--round-s``, ``collect`` (a finished attempt, as ``after_round`` collects it) and
    ``after_round`` (starts one at the first round boundary after a meeting opens); until
    D/stop exists. A fault ordered in D/fault/<name> is armed at the next round boundary. The params drift (``noise``, the
    same each time) after each collection, never while an attempt runs: every
    step averages a non-zero delta and the bench times the step, not contention with
    training. Every collected record gets, besides ``i``:

    - ``done_at``: DHT time at which the attempt finished (committed, its shift ready);
    - ``apply_s``: seconds ``poll`` took to apply it to the params (the rebase);
    - ``step_s``: ``done_at - meet + apply_s``: from the meeting opening to the applied
      result, without the wait for the next round boundary (training goes on meanwhile);
    - ``collected_at``: DHT time when ``poll`` returned it.
    """
    from hivemind.utils import get_dht_time

    while len(list(view.glob("*.txt"))) < args.peers:
        time.sleep(0.05)
    # every peer lets the same meetings pass: those before the last peer was up (+ 0.5 s)
    loop.clock.skip_until(max(f.stat().st_mtime for f in view.glob("*.txt")) + 0.5)
    out = root / "out" / f"{args.name}.jsonl"
    others = [f.stem for f in view.glob("*.txt") if f.stem != args.name]
    done_at: dict[int, float] = {}
    grouped = i = r = 0
    started = None  # the attempt whose end we note (one that was let pass writes no record)
    drift = True
    end = time.monotonic() + args.duration
    fault = root / "fault" / args.name
    FAULT.update(loop=loop, mark=root / "out" / f"{args.name}.killed")
    while grouped < args.steps and time.monotonic() < end and not (root / "stop").exists():
        if not loop.in_flight and all((root / "out" / f"{n}.done").exists() for n in others):
            break  # nobody left to meet
        if fault.exists():
            kind, after = fault.read_text().split()
            FAULT.update(kind=Fault(kind), after=int(after))
            fault.unlink()
        time.sleep(args.round_s)
        t = time.monotonic()
        got = loop.collect()  # what after_round does first; here so that we drift before the
        apply_s = time.monotonic() - t  # next attempt's snapshot, which it may take at once
        if got is not None:
            rec = got.to_dict()
            rec.update(i=i, done_at=done_at.pop(i, None), apply_s=round(apply_s, 4),
                       collected_at=get_dht_time())
            if rec.get("meet") is not None and rec["done_at"] is not None:
                rec["step_s"] = round(rec["done_at"] - rec["meet"] + apply_s, 4)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            grouped += rec["peers"] >= 2
            i += 1
            drift = True
        if drift and not loop.in_flight:
            with torch.no_grad():
                for p, z in zip(model, noise):
                    p.add_(z)
            drift = False
        loop.after_round(r, seconds=args.round_s)  # collects nothing: may start an attempt
        r += 1
        if loop.in_flight and loop._pending[1] is not started:  # type: ignore[index]
            started = loop._pending[1]  # type: ignore[index]  # an attempt started: note
            started.add_done_callback(  # when it ends
                lambda _f, k=i: done_at.__setitem__(k, get_dht_time()))
    finish(loop, root, args.name)


if __name__ == "__main__":
    main()
