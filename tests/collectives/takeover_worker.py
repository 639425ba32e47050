"""A hostile peer with a fresh identity that tries to take over the outer state.

Usage: python -m tests.collectives.takeover_worker --dir D --seed S

It serves an all-zero outer state at version 10**6 and, until D/stop exists, stores a signed
head commit for it (step 10**6, an unrelated parent) and, for every honest head it reads, a
version commit that claims to extend it (parent = the honest hash) with the zero state.
Every time an honest peer asks for its state it appends a line to D/out/attacker.served.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from collectives import OuterConfig, OuterLoop
from collectives.config import ScheduleConfig
from collectives.state import OuterState
from protocol import Identity, OuterVersion, atomic_write_bytes
from tests.collectives.peer_worker import discover, make_model

STEP = 10**6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s attacker %(name)s %(levelname)s %(message)s")
    root = Path(args.dir)
    (root / "addrs").mkdir(parents=True, exist_ok=True)
    (root / "out").mkdir(parents=True, exist_ok=True)
    model = make_model(None)
    # the victims' codec: the wire format is part of the outer steps' namespace (loop.group_id)
    cfg = OuterConfig(every_rounds=2, compression="none",
                      schedule=ScheduleConfig(deadline_s=14.0, join_window_s=2.0))
    loop = OuterLoop(cfg,
                     identity=Identity.from_seed(args.seed.to_bytes(32, "little")),
                     group="test-model", params=model, data_dir=str(root / "data" / "attacker"),
                     discover=lambda: discover(root / "addrs", "attacker"))
    numel = loop._holding.numel()
    zero = OuterState(theta=torch.zeros(numel), momentum=torch.zeros(numel), applied=STEP)
    loop._holding._state = zero  # an attacker's own node: it holds what it likes
    zero_hash = zero.hash()
    serve = loop._holding.serve

    def logged(want: str) -> bytes | None:
        with open(root / "out" / "attacker.served", "a") as f:
            f.write(want + "\n")
        return serve(want)

    loop._ar.state_provider = logged
    atomic_write_bytes(root / "addrs" / "attacker.txt", "\n".join(loop.collective_addrs()).encode())
    book, tp = loop._attempt.book, loop._transport
    me = loop.peer_id
    forged = 0
    while not (root / "stop").exists():
        tp.dht_store(book.head_key, me, book.version(STEP, zero_hash, parent="f" * 64,
                                                     members=[me], period=1),
                     ttl=600, timeout=5)
        heads = book.verify(tp.dht_get(book.head_key, timeout=5), OuterVersion, step=None)
        for peer, c in heads.items():
            if peer != me and c.state_hash != zero_hash:
                tp.dht_store(book.key(c.step + 1), me,
                             book.version(c.step + 1, zero_hash, parent=c.state_hash,
                                          members=[me], period=1), ttl=600, timeout=5)
                forged += 1
        atomic_write_bytes(root / "out" / "attacker.forged", str(forged).encode())
        time.sleep(1.0)
    loop.close()


if __name__ == "__main__":
    main()
