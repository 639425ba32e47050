"""Real multi-process outer-loop swarms on loopback for the tests (see peer_worker.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


class Swarm:
    """Peers started as separate processes (each its own process group), in one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, seed: int, *, prefix: list[str] | None = None,
              module: str = "tests.collectives.peer_worker", **opts: object) -> None:
        """Start a peer; ``prefix`` wraps the command (e.g. ``ip netns exec NS``)."""
        cmd = [*(prefix or []), sys.executable, "-m", module, "--dir", str(self.root),
               "--seed", str(seed)]
        if module in ("tests.collectives.peer_worker", "tests.collectives.clock_worker"):
            cmd += ["--name", name]
        for k, v in opts.items():
            if v is True:
                cmd.append(f"--{k.replace('_', '-')}")
            elif v is not None and v is not False:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
        log = open(self.root / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=os.environ.copy())
        log.close()

    def wait_done(self, names: list[str], timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all((self.root / "out" / f"{n}.done").exists() for n in names):
                return
            dead = [n for n in names if self.procs[n].poll() is not None
                    and not (self.root / "out" / f"{n}.done").exists()]
            if dead:
                raise AssertionError(f"peers died: {dead}\n{self.logs(dead)}")
            time.sleep(0.2)
        raise AssertionError(f"timeout waiting for {names}\n{self.logs(names)}")

    def wait_exit(self, name: str, timeout: float) -> int:
        return self.procs[name].wait(timeout)

    def records(self, name: str) -> dict[int, dict]:
        path = self.root / "out" / f"{name}.jsonl"
        if not path.exists():
            return {}
        return {r["i"]: r for r in map(json.loads, path.read_text().splitlines())}

    def arrays(self, name: str, i: int) -> dict[str, np.ndarray]:
        with np.load(self.root / "out" / f"{name}-{i}.npz") as z:
            return {k: z[k] for k in z.files}

    def logs(self, names: list[str], tail: int = 4000) -> str:
        return "\n".join(f"--- {n}\n" + (self.root / f"{n}.log").read_text()[-tail:]
                         for n in names if (self.root / f"{n}.log").exists())

    def close(self) -> None:
        (self.root / "stop").touch()
        for name, p in self.procs.items():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                pass
            try:  # the worker's own session: python, its p2pd and its DHT child
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


def reference_theta(before: np.ndarray, deltas: list[np.ndarray], momentum: np.ndarray, *,
                    lr: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """θ_global after one outer Nesterov step on the true mean (float64), and the momentum."""
    g = np.mean(np.stack([d.astype(np.float64) for d in deltas]), axis=0)
    m = mu * momentum + g
    return before.astype(np.float64) - lr * (g + mu * m), m


def run_churn(swarm: Swarm, *, trials: int, seed: int, peers: int = 4,
              opts: dict[str, object] | None = None) -> list[dict]:
    """``trials`` kills: at step 2t a random live peer SIGKILLs its process group at a random
    point of the all-reduce (Fault.MEMBER / Fault.REDUCER, after a random number of
    exchanges); a fresh peer joins at step 2t+1. Returns one summary per trial."""
    import random

    rng = random.Random(seed)
    opts = {"deadline": 8.0, "join_window": 1.0, "compression": "int8", **(opts or {})}
    total = 2 * trials
    # plan: who dies when, with which fault; each process dies at most once
    live = [f"p{i}" for i in range(peers)]
    start = {n: 0 for n in live}
    fault: dict[str, tuple[str, int, int]] = {}
    plan = []
    for t in range(trials):
        victim = rng.choice(live)
        kind = rng.choice(["member", "reducer"])
        after = rng.randrange(0, peers - 1)
        fault[victim] = (kind, 2 * t, after)
        live = [n for n in live if n != victim]
        newcomer = f"j{t}"
        plan.append({"trial": t, "victim": victim, "fault": kind, "after": after,
                     "survivors": list(live), "joiner": newcomer})
        live.append(newcomer)
        start[newcomer] = 2 * t + 1
    seeds = {n: 1000 + k for k, n in enumerate(start)}

    def spawn(name: str) -> None:
        kind, step, after = fault.get(name, ("none", -1, 0))
        swarm.spawn(name, seeds[name], steps=total - start[name], start_step=start[name],
                    peers=peers, fault=kind, fault_step=step, fault_after=after, trust="all",
                    **opts)

    for n in [f"p{i}" for i in range(peers)]:
        spawn(n)
    for p in plan:
        spawn(p["joiner"])  # starts now, waits at its first barrier (step 2t+1)
        swarm.wait_exit(p["victim"], timeout=180)
    swarm.wait_done(live, timeout=180)
    ids = {f.stem: f.read_text().split()[0].rsplit("/p2p/", 1)[-1]
           for f in (swarm.root / "addrs").glob("*.txt") if f.read_text().split()}
    names = {pid: n for n, pid in ids.items()}
    results = []
    for p in plan:
        t = p["trial"]
        at_kill = {n: swarm.records(n).get(2 * t) for n in p["survivors"]}
        retry_names = p["survivors"] + [p["joiner"]]
        at_retry = {n: swarm.records(n).get(2 * t + 1) for n in retry_names}
        results.append({**p,
                        "kill_status": {n: r and r["status"] for n, r in at_kill.items()},
                        "kill_hashes": len({r and r["param_hash"] for r in at_kill.values()}),
                        "retry_status": {n: r and r["status"] for n, r in at_retry.items()},
                        "retry_hashes": len({r and r["param_hash"] for r in at_retry.values()}),
                        "retry_leaders": sorted({names.get((r or {}).get("leader"), "?")
                                                 for r in at_retry.values()}),
                        "retry_errors": {n: (r or {}).get("error") for n, r in at_retry.items()
                                         if (r or {}).get("error")},
                        "kill_seconds": max((r or {}).get("seconds", 0) for r in at_kill.values()),
                        "resync_bytes": sum((r or {}).get("resync_bytes", 0)
                                            for r in at_kill.values())})
    return results
