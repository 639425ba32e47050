"""Issue 17.6 reproduction attempt: does a stream handler that closes right after writing
its reply lose that reply (IncompleteReadError at the caller) over real p2pd?

Two p2pd daemons on loopback; the handler answers a 16-byte request with a 64-byte header
frame and closes at once (the old JOIN handler), optionally under CPU contention from
``--hogs`` busy processes. Counts replies lost out of ``--pairs`` request/reply pairs, run
``--concurrency`` at a time.

    PYTHONPATH=$PWD python bench/join_repro.py --pairs 400 --concurrency 8 --hogs 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from collectives._hivemind import P2P  # noqa: E402
from collectives.streams import recv_header, send_header  # noqa: E402


def _hog(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


async def main(args: argparse.Namespace) -> dict:
    a = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    b = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                         initial_peers=[str(m) for m in await a.get_visible_maddrs()])

    async def handler(_info, reader, writer) -> None:  # type: ignore[no-untyped-def]
        req = await recv_header(reader)
        await send_header(writer, {"ok": True, "members": ["x" * 40], "n": req.get("n")})
        writer.close()  # at once: the behaviour suspected of losing the reply

    await a.add_binary_stream_handler("/repro/join", handler)
    lost: list[str] = []
    ok = 0
    sem = asyncio.Semaphore(args.concurrency)

    async def one(n: int) -> None:
        nonlocal ok
        async with sem:
            try:
                _, reader, writer = await b.call_binary_stream_handler(a.peer_id, "/repro/join")
                try:
                    await send_header(writer, {"n": n})
                    reply = await asyncio.wait_for(recv_header(reader), 10)
                    ok += reply.get("n") == n
                finally:
                    writer.close()
            except Exception as e:  # noqa: BLE001 - what we count
                lost.append(type(e).__name__)

    t = time.monotonic()
    try:
        await asyncio.gather(*(one(n) for n in range(args.pairs)))
    finally:
        await b.shutdown()
        await a.shutdown()
    return {"pairs": args.pairs, "ok": ok, "lost": len(lost),
            "errors": sorted(set(lost)), "concurrency": args.concurrency, "hogs": args.hogs,
            "seconds": round(time.monotonic() - t, 2), "load": os.getloadavg()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--hogs", type=int, default=0, help="busy-loop processes meanwhile")
    args = ap.parse_args()
    hogs = [multiprocessing.Process(target=_hog, args=(time.time() + 600,), daemon=True)
            for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    try:
        print(json.dumps(asyncio.run(main(args))))
    finally:
        for h in hogs:
            h.terminate()
