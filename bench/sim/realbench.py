"""``bench/gossip_bench.py``'s rows for calibration, robust to a loaded machine.

Runs ``bench.gossip_bench.run`` unchanged except one setting of its test swarm: peers stay in
the table for 30 s instead of the tests' 6 s (``tests/swarm/conftest.py`` FAST). On the shared
2-core box at load average 30-60, announcements arrived later than 6 s, peers expired before
all N were known at once, and gossip_bench's discovery wait timed out (twice at 16 nodes); the
TTL touches no rollout traffic. Rows go to ``--out`` (atomically) with the load average.

    PYTHONPATH=$PWD python -m bench.sim.realbench --nodes 16 32 --out bench/sim/data/realbench.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import tests.swarm.conftest as swarm_conftest
from bench import gossip_bench
from protocol.files import atomic_write_bytes

log = logging.getLogger("bench.sim.realbench")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--modes", nargs="+", default=["flood", "feeds"], choices=["flood", "feeds"])
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--peer-ttl-s", type=float, default=30.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    swarm_conftest.FAST["peer_ttl_s"] = args.peer_ttl_s
    out = Path(args.out)
    rows = json.loads(out.read_text())["runs"] if out.exists() else []
    for n in args.nodes:
        for mode in args.modes:
            t0 = time.monotonic()
            try:
                row = gossip_bench.run(n, mode, batches=args.batches, interval_s=args.interval_s,
                                       rollouts=8, sources=4)
            except TimeoutError as e:  # a loaded machine: say so, keep the other rows
                log.warning("%s n=%d: %s", mode, n, str(e).splitlines()[0])
                continue
            row["peer_ttl_s"] = args.peer_ttl_s
            log.info("%s n=%d in %.0f s: %s", mode, n, time.monotonic() - t0, json.dumps(row))
            rows.append(row)
            doc = {"command": " ".join(sys.argv), "runs": rows}
            atomic_write_bytes(out, (json.dumps(doc, indent=1) + "\n").encode())


if __name__ == "__main__":
    main()
