"""Real multi-process outer-loop swarms on loopback for the tests (see peer_worker.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from protocol import atomic_write_bytes

WORKERS = ("tests.collectives.peer_worker", "tests.collectives.clock_worker")
"""The worker modules that take ``--name`` and dump their stacks on SIGUSR1."""


class Swarm:
    """Peers started as separate processes (each its own process group), in one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.modules: dict[str, str] = {}

    def spawn(self, name: str, seed: int, *, prefix: list[str] | None = None,
              module: str = "tests.collectives.peer_worker", **opts: object) -> None:
        """Start a peer; ``prefix`` wraps the command (e.g. ``ip netns exec NS``)."""
        cmd = [*(prefix or []), sys.executable, "-m", module, "--dir", str(self.root),
               "--seed", str(seed)]
        if module in WORKERS:
            cmd += ["--name", name]
        for k, v in opts.items():
            if v is True:
                cmd.append(f"--{k.replace('_', '-')}")
            elif v is not None and v is not False:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
        self.modules[name] = module
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
        self.dump_stacks([n for n in names if self.modules.get(n) in WORKERS])
        raise AssertionError(f"timeout waiting for {names}\n{self.logs(names, tail=12000)}")

    def dump_stacks(self, names: list[str]) -> None:
        """Each live worker that has not finished writes its threads' stacks to its log
        (peer_worker and clock_worker register faulthandler on SIGUSR1): where it hangs."""
        for n in names:
            if self.procs[n].poll() is None and not (self.root / "out" / f"{n}.done").exists():
                try:
                    os.kill(self.procs[n].pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        time.sleep(1.0)

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


def by_meet(swarm: Swarm, name: str) -> dict[float, dict]:
    """A clock peer's records (peer_worker ``run_on_clock``) by meeting."""
    return {r["meet"]: r for r in swarm.records(name).values() if r.get("meet") is not None}


def _until(cond: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def run_churn(swarm: Swarm, *, trials: int, seed: int, peers: int = 4,
              opts: dict[str, object] | None = None, timeout: float = 90.0,
              kinds: tuple[str, ...] = ("member", "reducer"),
              after: int | None = None) -> list[dict]:
    """``trials`` kills on the path nodes use (peer_worker ``--clock``: ``after_round`` /
    ``collect``, meetings on the clock). Each trial: a random live peer that has grouped
    SIGKILLs its process group at a random point of its next all-reduce (one of ``kinds``:
    Fault.MEMBER / Fault.REDUCER after a random number of exchanges, or ``after`` of them;
    Fault.VOTE), a fresh peer (new identity) starts right after and takes part from a later
    meeting; the next trial starts once it grouped.

    Per trial: the survivors' records at the kill meeting (``kill_*``), at the next meeting
    any of them attended (the retry, ``retry_*``: the joiner's too if it was there), and
    the joiner's first grouped step. ``kill_ok``: one state hash among the survivors at
    the kill meeting (every one stepped, or every one failed with its state untouched);
    ``retry_ok``: every survivor there stepped (status ok, >= 2 peers), at least two, all
    records there at one hash."""
    import random

    rng = random.Random(seed)
    opts = {"deadline": 8.0, "join_window": 1.0, "compression": "int8", "round_s": 0.05,
            "every_rounds": 2, **(opts or {})}
    (swarm.root / "fault").mkdir(parents=True, exist_ok=True)

    def spawn(name: str, k: int, wait_for: int) -> None:
        swarm.spawn(name, 1000 + k, clock=True, steps=10**6, duration=24 * 3600,
                    peers=wait_for, trust="all", no_save=True, **opts)

    def grouped(name: str) -> bool:
        return any(r["status"] == "ok" and r["peers"] >= 2
                   for r in swarm.records(name).values())

    live = [f"p{i}" for i in range(peers)]
    for k, n in enumerate(live):
        spawn(n, k, peers)
    if not _until(lambda: all(grouped(n) for n in live), timeout):
        raise AssertionError(f"the first peers never grouped\n{swarm.logs(live)}")
    results = []
    for t in range(trials):
        victim = rng.choice([n for n in live if grouped(n)])
        kind, k = rng.choice(kinds), rng.randrange(0, peers - 1)
        k = k if after is None else after
        atomic_write_bytes(swarm.root / "fault" / victim, f"{kind} {k}".encode())
        survivors = [n for n in live if n != victim]
        r: dict = {"trial": t, "victim": victim, "fault": kind, "after": k,
                   "survivors": survivors}
        results.append(r)
        try:
            swarm.wait_exit(victim, timeout)
        except subprocess.TimeoutExpired:
            r["error"] = "the victim never reached an all-reduce"
            break
        t_kill = time.monotonic()
        # a departed peer drops out of discovery (a node's peer list forgets it)
        (swarm.root / "addrs" / f"{victim}.txt").unlink(missing_ok=True)
        killed = swarm.root / "out" / f"{victim}.killed"
        kill_meet = json.loads(killed.read_text())["meet"] if killed.exists() else None
        joiner = f"j{t}"
        spawn(joiner, peers + t, 1)
        if kill_meet is None:
            r["error"] = "the fault struck outside an attempt"
            break
        _until(lambda: all(any(m > kill_meet for m in by_meet(swarm, n)) for n in survivors),
               timeout)
        at_kill = {n: by_meet(swarm, n).get(kill_meet) for n in survivors}
        later = sorted({m for n in survivors for m in by_meet(swarm, n) if m > kill_meet})
        retry_meet = later[0] if later else None
        r["joiner_grouped"] = _until(lambda: grouped(joiner), timeout)
        r["joiner_s"] = round(time.monotonic() - t_kill, 1)
        at_retry = {n: by_meet(swarm, n).get(retry_meet) for n in survivors + [joiner]}
        present = {n: x for n, x in at_retry.items() if x is not None}
        first = next((x for x in sorted(swarm.records(joiner).values(), key=lambda x: x["i"])
                      if x["status"] == "ok" and x["peers"] >= 2), None)
        stepped = [x for n, x in present.items() if n != joiner
                   and (x["status"], x["peers"] >= 2) == ("ok", True)]
        r.update(
            kill_meet=kill_meet, retry_meet=retry_meet,
            kill_status={n: x and x["status"] for n, x in at_kill.items()},
            kill_hashes=len({x["param_hash"] for x in at_kill.values() if x}),
            retry_status={n: x["status"] for n, x in present.items()},
            retry_peers={n: x["peers"] for n, x in present.items()},
            retry_hashes=len({x["param_hash"] for x in present.values()}),
            retry_errors={n: x["error"] for n, x in present.items() if x.get("error")},
            joiner_first_meet=first and first["meet"],
            joiner_status=[x["status"] for x in sorted(swarm.records(joiner).values(),
                                                       key=lambda x: x["i"])][:4],
            kill_seconds=max((x or {}).get("seconds", 0) for x in at_kill.values()))
        r["kill_ok"] = r["kill_hashes"] == 1
        r["retry_ok"] = (r["retry_hashes"] == 1 and len(stepped) >= 2
                         and len(stepped) == sum(n != joiner for n in present))
        live = survivors + [joiner]
    return results
