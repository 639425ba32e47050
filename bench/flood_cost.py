"""CPU of one swarm process while a hostile peer floods it, vs the same process idle.

    python bench/flood_cost.py --kind bad_pubsub_sig --rate 230 --seconds 10 [--victim-tree DIR]

Starts a victim swarm process (its code from ``--victim-tree``, default this checkout, so
``--victim-tree /work/main`` measures main) and the attacker of tests/swarm/attacker.py (this
checkout) connected to it. Measures the victim's CPU time (utime + stime from /proc) over
``--seconds`` idle, then over ``--seconds`` + 1 from the start of the flood (``rate`` RPCs/s
for ``seconds``, each one message of ``kind``: ``bad_pubsub_sig`` or ``unknown_key_bomb``;
``sent`` is how many the attacker got out before the victim cut it off). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from node.ipc_client import SocketBridge
from swarm.config import GossipConfig
from tests.swarm.procs import SwarmProc, short_tmpdir

TICK = os.sysconf("SC_CLK_TCK")


class NonDefaultConfig:
    """A GossipConfig that serialises only the keys it sets, so another checkout's swarm
    (which may not know this one's newer keys) reads it."""

    def __init__(self, config: GossipConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir

    def to_json(self) -> str:
        default = GossipConfig(data_dir=self.data_dir).to_dict()
        return json.dumps({"data_dir": self.data_dir,
                           **_changed(self.config.to_dict(), default)})


def _changed(table: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``table`` that differ from ``default``, a sub-table key by key."""
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            if sub := _changed(v, default[k]):
                out[k] = sub
        elif v != default[k]:
            out[k] = v
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("bad_pubsub_sig", "unknown_key_bomb"), required=True)
    ap.add_argument("--rate", type=float, default=230.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--victim-tree", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--profile", default="", help="write the victim's cProfile stats here")
    args = ap.parse_args()
    root = short_tmpdir()
    env = os.environ.copy()
    env["PYTHONPATH"] = args.victim_tree
    config = GossipConfig(data_dir=str(root / "victim"), listen=("/ip4/127.0.0.1/tcp/0",),
                          ipc_path=str(root / "victim.sock"))
    old_env = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)  # SwarmProc passes its environment on
    try:
        prof = ("-m", "cProfile", "-o", args.profile) if args.profile else ()
        victim = SwarmProc(NonDefaultConfig(config), "victim", python_args=prof,  # type: ignore[arg-type]
                           cwd=args.victim_tree).start(timeout_s=90)
    finally:
        os.environ.clear()
        os.environ.update(old_env)
    assert victim.proc is not None
    pid = victim.proc.pid
    attacker = None
    try:
        time.sleep(2.0)
        c0, t0 = cpu_s(pid), time.monotonic()
        time.sleep(args.seconds)
        idle = (cpu_s(pid) - c0) / (time.monotonic() - t0)
        count = int(args.rate * args.seconds)
        spec = {"data_dir": str(root / "attacker"), "victim": victim.addr,
                "swarm_id": config.swarm_id, "rate_burst": 0, "plan": "flood", "kind": args.kind,
                "count": count, "rate": args.rate}
        attacker = subprocess.Popen([sys.executable, "-m", "tests.swarm.attacker", json.dumps(spec)],
                                    stdout=subprocess.PIPE, text=True)
        assert attacker.stdout is not None
        line = attacker.stdout.readline()
        assert json.loads(line)["event"] == "flood_start", line
        c0, t0 = cpu_s(pid), time.monotonic()
        time.sleep(args.seconds + 1.0)  # the flood's planned length, plus 1 s to finish reading
        window = time.monotonic() - t0
        flood = (cpu_s(pid) - c0) / window
        done = json.loads(attacker.stdout.readline())
        attacker.wait(30)
        bridge = SocketBridge.connect(config.ipc_path or "")
        counted = {k: v for k, v in bridge.stats().items() if k.startswith(("rejected_", "dropped_"))}
        bridge.close()
        print(json.dumps({"victim_tree": args.victim_tree, "kind": args.kind,
                          "rate": args.rate, "planned": count, "sent": done["sent"][args.kind],
                          "window_s": round(window, 2),
                          "idle_cpu_pct": round(100 * idle, 1),
                          "flood_cpu_pct": round(100 * flood, 1),
                          "cpu_ms_per_planned_msg": round(1000 * (flood - idle) * window
                                                          / max(1, count), 3),
                          "victim_counters": counted}), flush=True)
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
        victim.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
