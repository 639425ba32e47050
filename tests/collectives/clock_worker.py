"""A peer that trains on its own pace and meets on the clock (OuterLoop.after_round).

Usage: python -m tests.collectives.clock_worker --dir D --name NAME --seed S --round-s R
    [--peers N] [--duration T] [--delay X] [--numel K]

Waits until N peers wrote D/addrs/<name>.txt, sleeps ``--delay`` (drift), then runs inner
rounds of ``--round-s`` seconds each (a deterministic drift of the params, then a sleep for
the rest of the round) until ``--duration`` seconds after the last address appeared; calls
``after_round`` after every round and never waits for an outer step. Writes
D/out/<name>.jsonl (each collected record, with ``i``) and D/out/<name>-<i>.npz: the params
when the attempt started (``snapshot``), just before it was collected (``before``), right
after (``after``) and θ_global after (``theta``); D/out/<name>.json: compute seconds and wall
seconds of the round loop (and of ``--finish``: then ``OuterLoop.finish``, its steps recorded
like the others, and exit); ``--leave``: exit right away without it (close() says we left). ``--stall hold|refuse``: a
hostile leader (issue 32) that never joins a group and, asked to lead one, holds every JOIN
until its session's end or refuses it at once; otherwise a real outer loop (it holds and
claims the group's state, so it is among the peers a leader is chosen from). ``--stall
restore``: ``hold``, and it re-stores a join record claiming the longest period every
0.5 s. ``--stall member``: it JOINs like an honest peer and, admitted, never reduces its
shard nor sends its contribution.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import math
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from collectives import OuterConfig, OuterLoop, StepFailed
from collectives.allreduce import AllReduce
from collectives.config import ScheduleConfig
from collectives.matchmaking import Matchmaker
from collectives.member import Member
from collectives.schedule import RUNGS
from collectives.streams import send_header
from protocol import Identity, atomic_write_bytes
from tests.collectives.peer_worker import discover, make_model


def flat(model: torch.nn.ParameterList) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model]).numpy().copy()


def install_stall(mode: str) -> None:
    """Make this process the hostile of ``--stall`` (see the module docstring)."""
    if mode == "none":
        return
    if mode == "member":  # JOINs like anyone; admitted, it never reduces nor contributes
        async def never_reduce(self, peer, reader, writer):  # type: ignore[no-untyped-def]
            s = self.session
            await asyncio.sleep(s.remaining() if s is not None else 10.0)

        async def never_send(self, s, *args, **kwargs):  # type: ignore[no-untyped-def]
            await asyncio.sleep(s.remaining())
            raise StepFailed("a hostile member sends nothing")

        AllReduce._on_reduce = never_reduce  # type: ignore[method-assign]
        Member.exchange = never_send  # type: ignore[method-assign]
        return

    async def on_join(self, s, peer, req, writer):  # type: ignore[no-untyped-def]
        if mode in ("hold", "restore") and s is not None:
            await asyncio.sleep(s.remaining())
        await send_header(writer, {"ok": False, "reason": "no"})

    async def never_join(self, s, leader, reply_by):  # type: ignore[no-untyped-def]
        raise StepFailed("a staller joins nobody's group")

    Matchmaker.on_join = on_join  # type: ignore[method-assign]
    Matchmaker._join = never_join  # type: ignore[method-assign]


def keep_restoring(loop: OuterLoop, every_s: float = 0.5) -> None:
    """``--stall restore``: besides its own attempts, store a join record claiming the state
    it holds and the longest period at the open and the next meeting, every ``every_s``
    (issue 32's hostile that was 0 of 32: always a holder, its code stretching reads)."""
    att = loop._attempt
    book, transport, holding = att.rendezvous._book, att.transport, att.holding
    longest = 1 + (RUNGS - 1) + RUNGS * (RUNGS - 1)

    def run() -> None:
        while True:
            try:
                v, h, p = holding.version(), holding.hash(), loop.clock.period()
                meet = math.floor(loop._now() / p) * p
                transport.dht_store_many(
                    [(book.join_key(v, meet=m), loop.peer_id, book.join(v, h, longest))
                     for m in (meet, meet + p)], ttl=2 * p + 2, timeout=2.0)
            except Exception:  # noqa: BLE001 - a hostile keeps trying
                pass
            time.sleep(every_s)

    threading.Thread(target=run, daemon=True).start()


def dump_on_signal(loop: OuterLoop) -> None:
    """On SIGUSR1 (Swarm.wait_done, when a peer should have finished and has not), write to
    the log every thread's stack and every pending task of the transport's asyncio loop."""
    aio = loop._attempt.transport._loop

    def tasks() -> None:
        for task in asyncio.all_tasks(aio):
            task.print_stack(limit=12, file=sys.stderr)

    def on_signal(signum: int, frame: object) -> None:
        faulthandler.dump_traceback(all_threads=True)
        aio.call_soon_threadsafe(tasks)

    signal.signal(signal.SIGUSR1, on_signal)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--round-s", type=float, required=True)
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--duration", type=float, default=14.0)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--numel", type=int, default=None)
    ap.add_argument("--every-rounds", type=int, default=4)
    ap.add_argument("--min-period", type=float, default=2.0)
    ap.add_argument("--join-window", type=float, default=1.0)
    ap.add_argument("--deadline", type=float, default=12.0)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--trust", action="store_true", help="a joiner may adopt any peer's head")
    ap.add_argument("--no-save", action="store_true", help="skip the .npz arrays (bench)")
    ap.add_argument("--finish", action="store_true", help="end with OuterLoop.finish()")
    ap.add_argument("--leave", action="store_true", help="end with close() right away")
    ap.add_argument("--final-wait", type=float, default=30.0)
    ap.add_argument("--stall", choices=["none", "hold", "refuse", "restore", "member"],
                    default="none")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(name)s %(levelname)s %(message)s")
    root = Path(args.dir)
    (root / "out").mkdir(parents=True, exist_ok=True)
    (root / "addrs").mkdir(parents=True, exist_ok=True)
    install_stall(args.stall)
    model = make_model(args.numel)
    cfg = OuterConfig(every_rounds=args.every_rounds, compression=args.compression,
                      schedule=ScheduleConfig(deadline_s=args.deadline,
                                              join_window_s=args.join_window,
                                              min_period_s=args.min_period,
                                              final_wait_s=args.final_wait))
    loop = OuterLoop(cfg, identity=Identity.from_seed(args.seed.to_bytes(32, "little")),
                     group="test-model", params=model, data_dir=str(root / "data" / args.name),
                     discover=lambda: discover(root / "addrs", args.name),
                     **({"trust": lambda p: True} if args.trust else {}))
    if args.stall == "restore":
        keep_restoring(loop)
    dump_on_signal(loop)
    atomic_write_bytes(root / "addrs" / f"{args.name}.txt",
                       "\n".join(loop.collective_addrs()).encode())
    while len(list((root / "addrs").glob("*.txt"))) < args.peers:
        time.sleep(0.05)
    end = max(f.stat().st_mtime for f in (root / "addrs").glob("*.txt")) + args.duration
    time.sleep(args.delay)
    gen = torch.Generator().manual_seed(args.seed)
    out = root / "out" / f"{args.name}.jsonl"
    snapshot: np.ndarray | None = None
    compute = 0.0
    t_start = time.monotonic()
    i = r = 0

    def save(rec: dict, before: np.ndarray) -> None:
        nonlocal i
        rec["i"] = i
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if not args.no_save and snapshot is not None:
            np.savez(root / "out" / f"{args.name}-{i}.npz", snapshot=snapshot, before=before,
                     after=flat(model), theta=loop.state().theta.numpy())
        i += 1

    while time.time() < end and not (root / "stop").exists():  # (the test is over)
        t = time.monotonic()
        with torch.no_grad():  # "inner training": a deterministic local drift
            for p in model:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
        time.sleep(max(0.0, args.round_s - (time.monotonic() - t)))
        seconds = time.monotonic() - t
        compute += seconds
        before = flat(model)
        was = loop.in_flight
        rec = loop.after_round(r, seconds=seconds)
        if rec is not None:
            save(rec.to_dict(), before)
        if loop.in_flight and (not was or rec is not None):
            snapshot = loop._pending[0].snapshot.numpy().copy()  # type: ignore[index]
        r += 1
    wall = time.monotonic() - t_start
    before = flat(model)
    rec = loop.poll(wait=None)
    if rec is not None:
        save(rec.to_dict(), before)
    finish_s = None
    if args.finish:
        snapshot = flat(model)
        t = time.monotonic()
        loop.finish(on_record=lambda r: save(r.to_dict(), flat(model)))
        finish_s = time.monotonic() - t
    atomic_write_bytes(root / "out" / f"{args.name}.json", json.dumps(
        {"compute_s": compute, "wall_s": wall, "rounds": r, "finish_s": finish_s,
         "round_s": args.round_s, "period_s": loop.clock.period()}).encode())
    (root / "out" / f"{args.name}.done").touch()
    end = time.monotonic() + 60  # stay reachable as a state holder until told to stop
    while not (args.finish or args.leave) and not (root / "stop").exists() \
            and time.monotonic() < end:
        time.sleep(0.1)
    loop.close()


if __name__ == "__main__":
    main()
