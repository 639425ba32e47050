"""Do DiLoCo outer steps help or hurt SAPO learning? Arms of the outer optimizer, against no
averaging (issue 29).

Figure of merit: cumulative accuracy (sum over nodes and rounds of each node's accuracy on
its own local rollouts), each arm over the ``none`` arm with a 95% bootstrap interval over
seeds (``sapo_vs_isolated.bootstrap_ratio``: seeds resampled, paired), and the mean accuracy
of the last 20 rounds per node (``accuracy_last20``).

An arm is ``none`` (no averaging), ``default`` (what ``swarm-node local`` / ``make demo``
runs: ``node.local.LOCAL_DEFAULTS`` over ``OuterConfig()``), ``join`` (``OuterConfig()`` alone,
what ``swarm-node join`` runs), ``plain`` (lr 1, no momentum at the demo's H), ``diloco``
(DiLoCo's Nesterov lr 0.7, momentum 0.9 at the demo's H: the default before issue 29) or a
spec ``lr=0.7,mu=0.9,H=2`` (a spec starts with ``lr=``) with optional ``delay=D`` (learners: the step lands D rounds after its snapshot, the rounds
trained meanwhile rebased onto it, as a background step does), ``inner=keep|reset`` (the
inner AdamW moments at an applied step: kept, or cleared) and ``inner_lr=X`` (the trainer's
lr; with no averaging, a control for how far an amplified step moves the model).
Learners mode also takes ``codec=none|fp16|int8|sparse`` (every contribution and mean goes
through the wire codec per chunk, as between nodes), ``k=`` and ``beta=`` (sparse: values
per 4096, error-feedback decay) and ``ef=params|state`` (sparse: the unsent part kept in the
params, as nodes do, or in SparseLoCo's separate accumulator); the named arms ``fp32``,
``int8`` and ``sparse`` are ``plain`` through those codecs. Issue 31's parity run:

    PYTHONPATH=$PWD python bench/outer_learning.py --nodes 4 --rounds 80 --seeds 5 \\
        --arms none,plain,int8,sparse,... --name outer_parity_4n

Two modes:

- ``--mode learners`` (the default, and ``--quick``): N ``Learner``s round-robin in one
  process on a LoopbackHub (SAPO 4/4, every message signed and verified), one subprocess per
  (arm, seed), ``--jobs`` at a time, one torch thread each. Every H rounds each node's
  pseudo-gradient θ_global − θ_i is reduced shard by shard with the reducers' own robust
  mean (``collectives.reduce.reduce_shard``) and applied with ``OuterState.stepped``; every
  node then holds θ_new + the rounds it trained since its snapshot. Deterministic per seed;
  the wire (codec, meetings on a clock) is left out. It also records, per applied step, the
  norm of the applied update over the norm of the averaged pseudo-gradient (the outer
  optimizer's gain: 1 for the plain mean, up to lr/(1-mu) with momentum) and the cosine of
  consecutive averaged pseudo-gradients.
- ``--mode nodes``: a real ``swarm-node local`` per (arm, seed) (bootstrap + N ``join``
  nodes, the issue's setup: embedded model, ``[learner] slowdown_for_tests``), one at a
  time; only lr, mu, H and inner are taken from an arm (the meetings and overlap are the
  node's own).

    PYTHONPATH=$PWD python bench/outer_learning.py --quick        # learners, 3 arms x 3 seeds,
                                                                  # 60 rounds: ~6 min quiet
    PYTHONPATH=$PWD python bench/outer_learning.py                # learners, every arm
    PYTHONPATH=$PWD python bench/outer_learning.py --mode nodes --arms none,default,plain

Writes bench/results/<name>.json (``outer_learning_quick`` for --quick) and <name>.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from node.report import moving_average  # noqa: E402
from bench.sapo_vs_isolated import bootstrap_ratio  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NO_STEP = 1000
"""H of the ``none`` arm in nodes mode: no meeting within a run."""
QUICK_ARMS = "none,default,diloco"
FULL_ARMS = ("none,default,join,diloco,lr=0.7,mu=0.9,H=10,lr=1,mu=0.5,H=2,lr=0.7,mu=0,H=2,"
             "lr=1,mu=0,H=5,lr=1,mu=0,H=10,lr=1,mu=0,H=2,delay=1,lr=1,mu=0,H=2,inner=reset,"
             "lr=0.7,mu=0.9,H=2,inner=reset,H=0,inner_lr=0.0021")


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One outer-optimizer setting (see the module docstring)."""

    name: str
    every: int = 0
    """H: an outer step every ``every`` rounds; 0 = no averaging."""
    lr: float = 1.0
    mu: float = 0.0
    delay: int = 0
    inner: str = "keep"
    inner_lr: float | None = None
    codec: str = ""
    """Learners: the wire codec every contribution and mean goes through ("" = exact fp32
    means, as before issue 31; "none", "fp16", "int8" or "sparse" as OuterConfig.compression)."""
    k: int = 64
    """``sparse``: values kept per 4096."""
    beta: float = 0.95
    """``sparse``: error-feedback decay."""
    ef: str = "params"
    """``sparse``: where what the codec left out waits for the next step: ``params`` (what
    nodes do, collectives/feedback.py: the params are rebased onto θ_new − beta x the unsent
    part, so the next delta holds it) or ``state`` (SparseLoCo: an accumulator
    e <- beta e + delta is sent, e <- e − sent, the params go to θ_new)."""

    def toml(self, *, slowdown: float, seed: int) -> str:
        """The node config of this arm (nodes mode: no ``delay``, no ``inner=reset``)."""
        if self.delay or self.inner != "keep":
            raise SystemExit(f"arm {self.name!r}: delay and inner are learners-mode knobs")
        every = self.every or NO_STEP
        lr = f"[learner.trainer]\nlr = {self.inner_lr}\n" if self.inner_lr else ""
        return (f"[outer]\nevery_rounds = {every}\n"
                f"optimizer = {{ lr = {self.lr}, momentum = {self.mu} }}\n"
                f"schedule = {{ join_window_s = 3.0, deadline_s = 60.0, final_wait_s = 60.0 }}\n\n"
                f"[learner]\ncheckpoint_every = 0\nseed = {seed}\n"
                f"slowdown_for_tests = {slowdown}\n{lr}")


def parse_arms(text: str) -> list[Arm]:
    """``none``, ``default``, ``plain`` or ``lr=..,mu=..,H=..[,delay=..][,inner=..]``, joined
    by commas; a spec's keys run until the next ``lr=`` (or a named arm)."""
    import tomllib

    from collectives import OuterConfig
    from node.local import LOCAL_DEFAULTS

    j = OuterConfig()
    d = OuterConfig.from_dict({k: v for k, v in tomllib.loads(LOCAL_DEFAULTS)["outer"].items()
                               if k in ("every_rounds", "optimizer")})
    named = {"none": Arm(name="none"),
             "default": Arm(name="default", every=d.every_rounds, lr=d.optimizer.lr,
                            mu=d.optimizer.momentum),
             "join": Arm(name="join", every=j.every_rounds, lr=j.optimizer.lr,
                         mu=j.optimizer.momentum),
             "plain": Arm(name="plain", every=d.every_rounds),
             "fp32": Arm(name="fp32", every=d.every_rounds, codec="none"),
             "int8": Arm(name="int8", every=d.every_rounds, codec="int8"),
             "sparse": Arm(name="sparse", every=d.every_rounds, codec="sparse"),
             "diloco": Arm(name="diloco", every=d.every_rounds, lr=0.7, mu=0.9)}
    arms: list[Arm] = []
    spec: dict[str, str] = {}

    def flush() -> None:
        if spec:
            name = ",".join(f"{k}={v}" for k, v in spec.items())
            arms.append(Arm(name=name, every=int(spec.get("H", d.every_rounds)),
                            lr=float(spec.get("lr", 1.0)), mu=float(spec.get("mu", 0.0)),
                            delay=int(spec.get("delay", 0)), inner=spec.get("inner", "keep"),
                            inner_lr=float(spec["inner_lr"]) if "inner_lr" in spec else None,
                            codec=spec.get("codec", ""), k=int(spec.get("k", 64)),
                            beta=float(spec.get("beta", 0.95)), ef=spec.get("ef", "params")))
            spec.clear()

    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            flush()
            if part not in named:
                raise SystemExit(f"unknown arm {part!r}: {', '.join(named)} or k=v specs")
            arms.append(named[part])
            continue
        k, v = part.split("=", 1)
        if k not in ("lr", "mu", "H", "delay", "inner", "inner_lr", "codec", "k", "beta", "ef"):
            raise SystemExit(f"unknown arm key {k!r}")
        if k in spec or (k == "lr" and spec):
            flush()
        spec[k] = v
    flush()
    for a in arms:
        if a.inner not in ("keep", "reset") or a.ef not in ("state", "params") \
                or a.every < 0 or a.delay < 0:
            raise SystemExit(f"bad arm {a.name!r}")
    return arms


# --- learners mode ------------------------------------------------------------------------
class SyncOuter:
    """The outer step among in-process learners: snapshot, robust mean per shard, outer
    Nesterov step, rebase of the rounds trained since the snapshot (after ``arm.delay``)."""

    def __init__(self, arm: Arm, learners: list[Any]) -> None:
        import torch

        from collectives.state import OuterState, flatten

        self.arm, self.learners = arm, learners
        self.params = [list(lr.policy.model.parameters()) for lr in learners]
        theta = flatten(self.params[0])
        for p in self.params[1:]:
            if not torch.equal(flatten(p), theta):
                raise ValueError("learners must start from the same weights")
        self.state = OuterState(theta=theta, momentum=torch.zeros_like(theta))
        self.pending: tuple[int, Any, list[Any]] | None = None
        self.prev_avg: Any = None
        self.codec: Any = None
        self.accumulators: list[Any] = []
        """``ef=state``: SparseLoCo's error-feedback accumulator e per node (None: empty)."""
        if arm.codec:
            from collectives.codec import get_codec
            self.codec = get_codec(arm.codec, k=arm.k)
            if arm.codec == "sparse" and arm.ef == "state":
                self.accumulators = [None] * len(learners)
        self.steps: list[dict[str, Any]] = []

    def after_round(self, r: int) -> None:
        if self.arm.every and (r + 1) % self.arm.every == 0 and self.pending is None:
            self._start(r)
        if self.pending is not None and r >= self.pending[0]:
            self._land()

    def _start(self, r: int) -> None:
        import torch

        from collectives.reduce import Contribution, reduce_shard, shard_bounds
        from collectives.state import flatten

        snaps = [flatten(p) for p in self.params]
        deltas = [self.state.theta - s for s in snaps]
        n = len(deltas)
        sent = deltas
        up = down = 0
        if self.codec is not None:  # what the wire carries: each chunk through the codec
            from collectives.group import GroupInfo

            chunks = GroupInfo(step=0, members=tuple(f"{i:03d}" for i in range(n)),
                               nonce="").wire_chunks(deltas[0].numel())
            payloads = deltas
            if self.accumulators:  # e <- beta e + delta: the accumulator is what is sent
                payloads = [d if e is None else torch.add(d, e, alpha=self.arm.beta)
                            for d, e in zip(deltas, self.accumulators)]
            sent = [torch.empty_like(d) for d in deltas]
            for x, out in zip(payloads, sent):
                for a, b in chunks:
                    data = self.codec.encode(x[a:b])
                    up += len(data) * (n - 1) / n  # the others' shards go out
                    self.codec.decode_into(data, out[a:b])
        avg = torch.empty_like(deltas[0])
        for lo, hi in shard_bounds(avg.numel(), n):
            res = reduce_shard([Contribution(peer=f"{i:03d}", weight=1.0, values=d[lo:hi])
                                for i, d in enumerate(sent)], own="000", ref_rms=0.0,
                               max_weight=1000.0, max_norm=math.inf, max_norm_ratio=10.0)
            assert res.mean is not None
            avg[lo:hi] = res.mean
        if self.codec is not None:  # the reducers' means, encoded once, as every member has it
            down_codec = self.codec.for_mean(n)
            for a, b in chunks:
                data = down_codec.encode(avg[a:b])
                down += len(data) * (n - 1) / n
                down_codec.decode_into(data, avg[a:b])
            if self.accumulators:  # e <- e - decode(sent); the params go to θ_new
                self.accumulators = [p - x for p, x in zip(payloads, sent)]
            elif self.arm.codec == "sparse":  # ef=params: the params keep what was not sent
                # (collectives/feedback.py: params <- θ_new + since − beta (Δ − sent))
                snaps = [snap + self.arm.beta * (d - x) for snap, d, x in zip(snaps, deltas, sent)]
        new = self.state.stepped(avg, lr=self.arm.lr, momentum=self.arm.mu)
        gain = float((new.theta - self.state.theta).norm() / avg.norm().clamp_min(1e-12))
        cos = None if self.prev_avg is None else float(
            torch.nn.functional.cosine_similarity(avg, self.prev_avg, dim=0))
        self.prev_avg = avg
        numel = avg.numel()
        self.steps.append({"round": r, "gain": gain, "cos_prev": cos,
                           "up_bytes_per_param": up / n / numel,
                           "down_bytes_per_param": down / numel,
                           "feedback_norm": sum(float(e.norm()) for e in self.accumulators
                                                if e is not None) / n,
                           "avg_norm": float(avg.norm()),
                           "delta_norm": sum(float(d.norm()) for d in deltas) / len(deltas),
                           "update_norm": float((new.theta - self.state.theta).norm())})
        self.pending = (r + self.arm.delay, new, snaps)

    def _land(self) -> None:
        import torch

        assert self.pending is not None
        _, new, snaps = self.pending
        for learner, params, snap in zip(self.learners, self.params, snaps):
            with torch.no_grad():  # params <- θ_new + (params − snapshot), in place
                offset = 0
                for p in params:
                    n = p.numel()
                    p.view(-1).add_((new.theta[offset:offset + n] - snap[offset:offset + n])
                                    .to(p.dtype))
                    offset += n
            if self.arm.inner == "reset":
                learner.trainer.optimizer.state.clear()
            learner.engine.sync_weights()
        self.state, self.pending = new, None


def run_learners(arm: Arm, *, nodes: int, rounds: int, seed: int, base: Path) -> dict[str, Any]:
    """One arm, one seed: ``nodes`` learners round-robin on one shared hub (SAPO 4/4)."""
    from node.bridge import LoopbackHub
    from node.learner import LearnerConfig, PolicyConfig, TrainerConfig
    from node.learner.loop import Learner
    from protocol import Identity

    ids = [Identity.from_seed(bytes([seed % 256, i + 1]) * 16) for i in range(nodes)]
    hub = LoopbackHub(swarm_id="bench")
    bridges = [hub.bridge(i) for i in ids]
    trainer = TrainerConfig(lr=arm.inner_lr) if arm.inner_lr else TrainerConfig()
    root = Path(tempfile.mkdtemp(prefix="outer-bench-"))
    learners = []
    for k, ident in enumerate(ids):
        shutil.copytree(base, root / f"n{k}" / "base")
        cfg = LearnerConfig(data_dir=str(root / f"n{k}"), seed=seed * 1000 + k,
                            checkpoint_every=0, policy=PolicyConfig(device="cpu", threads=1),
                            trainer=trainer)
        learners.append(Learner(cfg, peer_id=ident.peer_id))
    outer = SyncOuter(arm, learners)
    acc: list[list[float]] = [[] for _ in range(nodes)]
    t0 = time.monotonic()
    for r in range(rounds):
        for k, (learner, bridge) in enumerate(zip(learners, bridges)):
            rec = learner.run_round(bridge)
            assert rec is not None
            learner.round += 1
            acc[k].append(rec["accuracy"])
        outer.after_round(r)
        if r % 20 == 0 or r == rounds - 1:
            print(f"[{arm.name} seed {seed}] round {r:4d} accuracy "
                  f"{sum(a[-1] for a in acc) / nodes:.3f} t={time.monotonic() - t0:.0f}s",
                  file=sys.stderr, flush=True)
    for learner in learners:
        learner.rescorer.close()
    shutil.rmtree(root, ignore_errors=True)
    return {"arm": arm.name, "seed": seed, "seconds": time.monotonic() - t0,
            "accuracy_per_node": acc, "outer_steps": outer.steps,
            "ok_steps_per_node": len(outer.steps)}


# --- nodes mode ---------------------------------------------------------------------------
def run_nodes(arm: Arm, *, nodes: int, rounds: int, seed: int, slowdown: float,
              keep: Path | None) -> dict[str, Any]:
    """One arm, one seed: a real ``swarm-node local`` of ``nodes`` nodes."""
    from node.local import LocalSwarm

    base = Path(tempfile.mkdtemp(prefix="outer-nodes-")) if keep is None else keep
    base.mkdir(parents=True, exist_ok=True)
    cfg = base / "arm.toml"
    cfg.write_text(arm.toml(slowdown=slowdown, seed=seed))
    t0 = time.monotonic()
    LocalSwarm(nodes=nodes, rounds=rounds, report=base / "swarm.json", base_dir=base / "swarm",
               config_file=str(cfg)).run()
    data = json.loads((base / "swarm.json").read_text())
    acc = [[r["accuracy"] for r in n.get("rounds", [])] for n in data["nodes"]]
    steps = [[s for s in n.get("outer_steps", []) if s.get("status") == "ok"]
             for n in data["nodes"]]
    if keep is None:
        shutil.rmtree(base, ignore_errors=True)
    return {"arm": arm.name, "seed": seed, "seconds": time.monotonic() - t0,
            "accuracy_per_node": acc, "ok_steps_per_node": [len(s) for s in steps],
            "overlap_rounds": [[s.get("overlap_rounds") for s in ns] for ns in steps],
            "swarm_ok": data.get("ok")}


# --- summary ------------------------------------------------------------------------------
def per_round_sum(acc: list[list[float]]) -> list[float]:
    """Accuracy summed over nodes per round (rounds every node reported)."""
    n = min(len(a) for a in acc)
    return [sum(a[r] for a in acc) for r in range(n)]


def summarize(runs: list[dict[str, Any]], arms: list[Arm], seeds: list[int]) -> dict[str, Any]:
    by = {(r["arm"], r["seed"]): r for r in runs}
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [by[arm.name, s] for s in seeds]
        cum = [sum(per_round_sum(r["accuracy_per_node"])) for r in mine]
        last20 = [sum(a[-20:]) / len(a[-20:]) for r in mine for a in r["accuracy_per_node"]]
        first10 = [sum(a[:10]) / len(a[:10]) for r in mine for a in r["accuracy_per_node"]]
        row: dict[str, Any] = {
            "cumulative_accuracy": cum, "mean_cumulative_accuracy": sum(cum) / len(cum),
            "accuracy_last20": sum(last20) / len(last20),
            "accuracy_last20_range": [min(last20), max(last20)],
            "accuracy_first10": sum(first10) / len(first10),
            "ok_steps_per_node": [r["ok_steps_per_node"] for r in mine]}
        gains = [s["gain"] for r in mine for s in r.get("outer_steps", [])]
        coss = [s["cos_prev"] for r in mine for s in r.get("outer_steps", [])
                if s["cos_prev"] is not None]
        if gains:
            row["outer_gain_mean"] = sum(gains) / len(gains)
            row["outer_gain_max"] = max(gains)
        if coss:
            row["cos_consecutive_mean"] = sum(coss) / len(coss)
        ups = [s["up_bytes_per_param"] for r in mine for s in r.get("outer_steps", [])
               if s.get("up_bytes_per_param")]
        if ups:  # a codec arm: what one member uploads per step, per parameter: its part of
            # the others' shards (reduce-scatter) and its shard's mean to them (all-gather)
            row["scatter_bytes_per_param"] = sum(ups) / len(ups)
            row["gather_bytes_per_param"] = sum(
                s["down_bytes_per_param"] for r in mine for s in r["outer_steps"]) / len(ups)
            row["upload_bytes_per_param"] = (row["scatter_bytes_per_param"]
                                             + row["gather_bytes_per_param"])
        row["last20_per_seed"] = [
            sum(sum(a[-20:]) / len(a[-20:]) for a in r["accuracy_per_node"])
            / len(r["accuracy_per_node"]) for r in mine]
        if arm.name != "none" and "none" in out:
            base = out["none"]["cumulative_accuracy"]
            row["ratio_vs_none"] = sum(cum) / max(sum(base), 1e-9)
            row["ci_vs_none"] = bootstrap_ratio(cum, base)
        out[arm.name] = row
    return out


def plot(runs: list[dict[str, Any]], arms: list[Arm], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, arm in enumerate(arms):
        curves = [per_round_sum(r["accuracy_per_node"]) for r in runs if r["arm"] == arm.name]
        n = min(len(c) for c in curves)
        nodes = len(next(r for r in runs if r["arm"] == arm.name)["accuracy_per_node"])
        mean = [sum(c[j] for c in curves) / len(curves) / nodes for j in range(n)]
        a.plot(moving_average(mean, 10), color=f"C{i % 10}", label=arm.name)
        b.plot(list(itertools.accumulate(m * nodes for m in mean)), color=f"C{i % 10}",
               label=arm.name)
    a.set_title("accuracy per node (moving average of 10 rounds, mean of seeds)")
    b.set_title("cumulative accuracy, summed over nodes (mean of seeds)")
    for ax in (a, b):
        ax.set_xlabel("round")
    b.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _job(args: argparse.Namespace, arm: Arm, seed: int, base: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--job", arm.name, str(seed), "--base", str(base),
           "--out", str(out), "--nodes", str(args.nodes), "--rounds", str(args.rounds)]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"learners: {QUICK_ARMS}, 3 nodes, 60 rounds, 3 seeds")
    ap.add_argument("--mode", choices=["learners", "nodes"], default="learners")
    ap.add_argument("--arms", default=None, help=f"comma-separated arms (default {FULL_ARMS})")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=None, help="default 60 quick, 80 else")
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds (0, 1, ...)")
    ap.add_argument("--jobs", type=int, default=2, help="learners: (arm, seed) runs at a time")
    ap.add_argument("--slowdown", type=float, default=10.0, help="nodes: slowdown_for_tests")
    ap.add_argument("--keep", type=Path, default=None, help="nodes: keep the data dirs here")
    ap.add_argument("--name", default=None)
    ap.add_argument("--job", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--base", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.job:
        arm = replace(parse_arms(args.job[0])[0], name=args.job[0])
        result = run_learners(arm, nodes=args.nodes, rounds=args.rounds,
                              seed=int(args.job[1]), base=args.base)
        args.out.write_text(json.dumps(result))
        return

    args.rounds = args.rounds or (60 if args.quick else 80)
    arms = parse_arms(args.arms or (QUICK_ARMS if args.quick else FULL_ARMS))
    if "none" in [a.name for a in arms]:  # the baseline first (the ratios are over it)
        arms.sort(key=lambda a: a.name != "none")
    seeds = list(range(args.seeds))
    name = args.name or ("outer_learning_quick" if args.quick else f"outer_learning_{args.mode}")
    t0, load0 = time.monotonic(), os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="outer-bench-"))
    jobs = [(arm, seed) for seed in seeds for arm in arms]
    if args.mode == "learners":
        from node.learner.tiny_model import ensure_embedded

        base = ensure_embedded(tmp / "base")

        def one(i: int) -> dict[str, Any]:
            arm, seed = jobs[i]
            return _job(args, arm, seed, base, tmp / f"job-{i}.json")

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(one, range(len(jobs))))
    else:
        runs = [run_nodes(arm, nodes=args.nodes, rounds=args.rounds, seed=seed,
                          slowdown=args.slowdown,
                          keep=args.keep / f"{arm.name}-{seed}" if args.keep else None)
                for arm, seed in jobs]
    shutil.rmtree(tmp, ignore_errors=True)
    per_arm = summarize(runs, arms, seeds)
    default = next((a for a in arms if a.name == "default"), None)
    head = per_arm.get("default", {})
    result = {
        "mode": args.mode, "arms": [a.__dict__ for a in arms], "seeds": seeds,
        "nodes": args.nodes, "rounds": args.rounds,
        "accuracy_last20": {a.name: per_arm[a.name]["accuracy_last20"] for a in arms},
        "ratio_default_vs_none": head.get("ratio_vs_none"),
        "ratio_default_vs_none_ci": head.get("ci_vs_none"),
        "default_arm": default.__dict__ if default else None, "per_arm": per_arm,
        "wall_seconds": round(time.monotonic() - t0, 1), "loadavg_start": load0,
        "loadavg_end": os.getloadavg(), "cpus": os.cpu_count(),
        "command": " ".join(["python", "bench/outer_learning.py", *sys.argv[1:]]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({**result, "runs": runs}))
    plot(runs, arms, RESULTS / f"{name}.png",
         title=f"{args.mode}: {args.nodes} nodes, {args.rounds} rounds, {len(seeds)} seeds")
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_arm", "arms")},
                     indent=1))
    for arm in arms:
        row = per_arm[arm.name]
        print(f"{arm.name:40s} last20 {row['accuracy_last20']:.3f} "
              f"ratio {row.get('ratio_vs_none', 1.0):.2f} ci {row.get('ci_vs_none')} "
              f"gain {row.get('outer_gain_mean')} cos {row.get('cos_consecutive_mean')}")


if __name__ == "__main__":
    main()
