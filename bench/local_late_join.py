"""A node of ``swarm-node local`` that comes up after the others averaged: does it end with them?

On a loaded 2-core box one node's first round took 25 s longer than its siblings'; its
collective came up after they had made outer versions 1 and 2. A joiner adopts a version only
from peers it trusts, and trust from rollouts needs them in two of its rounds: the siblings
had finished theirs, so the late node refused their heads, trained alone and ended at version
0 while they ended at version 3 (fresh-clone CI, tests/e2e/test_local_swarm.py). Since then
``local`` pins its nodes to each other (``--trust-peer``). Here node-2 starts only once node-0
has made version 2 (``v2``), or once both others' rounds have ended (``end``: they are in
their last steps, ``collectives/finish.py``, and wait for their pinned sibling), deterministically:

    python -m bench.local_late_join pin   /tmp/late-pin   12 v2
    python -m bench.local_late_join nopin /tmp/late-nopin 12 v2   # as before the pin
    python -m bench.local_late_join pin   /tmp/late-end   12 end
    python -m bench.local_late_join pin   /tmp/late-end20 12 end+20   # 20 s after that

and prints each node's kept outer state (version, hash) and its outer-step records.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from node.local import LOCAL_DEFAULTS, LocalSwarm


V2 = "step 1 exchange"
"""node-0's log line when it made version 2 (step 1)."""


class LateSwarm(LocalSwarm):
    """node-2 starts once node-0's log says ``after`` (it made version 2), or both other
    nodes' logs (their last round ended); ``pin=False`` drops the nodes' pins on each
    other."""

    pin: bool = True
    after: str = V2
    extra_s: float = 0.0

    def _start_node(self, name: str, data_dir: Path, bootstrap: str) -> None:
        if not self.pin:
            self.peer_ids = {}
        if name == "node-2":
            logs = [Path(data_dir).parent / n / "node.log" for n in ("node-0", "node-1")]
            t = time.monotonic()
            while not all(self.after in (log.read_text() if log.exists() else "")
                          for log in logs[:1 if self.after == V2 else 2]):
                time.sleep(0.5)
            time.sleep(self.extra_s)
            print(f"node-2 starts {time.monotonic() - t:.0f} s late", flush=True)
        super()._start_node(name, data_dir, bootstrap)


def main(argv: list[str]) -> int:
    mode, base, rounds, when = argv[0], Path(argv[1]), int(argv[2]), argv[3]
    base.mkdir(parents=True, exist_ok=True)
    (base / "c.toml").write_text(LOCAL_DEFAULTS + "slowdown_for_tests = 10.0\n")
    swarm = LateSwarm(nodes=3, rounds=rounds, report=base / "r.json", base_dir=base / "swarm",
                      config_file=str(base / "c.toml"))
    swarm.pin = mode == "pin"
    when, _, extra = when.partition("+")
    swarm.after = {"v2": V2, "end": f" round {rounds - 1}: "}[when]
    swarm.extra_s = float(extra or 0)
    code = swarm.run()
    kept = set()
    for n in json.loads((base / "r.json").read_text())["nodes"]:
        latest = max((Path(n["data_dir"]) / "checkpoints").glob("round-*"))
        outer = json.loads((latest / "meta.json").read_text())["outer"]
        kept.add((outer["version"], outer["state_hash"]))
        print(n["name"], "kept version", outer["version"], outer["state_hash"][:12],
              [(s["step"], s["status"], s["peers"]) for s in n["outer_steps"]])
    print("one state" if len(kept) == 1 else f"{len(kept)} states")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
