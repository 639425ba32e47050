"""The learner's round loop: ``run_learner`` drives SAPO rounds against a ``Bridge``.

One round (each phase timed in the record's ``seconds``; ``stop`` is checked between them)::

    receive   take RolloutBatches from the bridge, re-score them, add them to the external pool
              (dedupe, reputation, zero-advantage filter, freshness, per-sender shares)
    plan      J = min(wanted, fresh usable), I = budget - J  (sapo.plan_round; wanted is
              adaptive with SapoConfig.adaptive_external)
    generate  I local questions x G completions with the inference engine (prompts rendered
              for this model: prompting.py; the wire carries the plain task prompt); with
              ``engine.staleness`` eta >= 1 the round instead takes the groups a generator
              process (generator.py) made meanwhile, and queues the requests of the rounds
              up to eta ahead: generation of the next rounds overlaps this round's training
    score     local verifier; fold the local rewards into our own per-family baseline
    publish   this round's local groups, in RolloutBatches sized to fit one message each
    train     GRPO on I local + J external groups, external ones anchored to our baseline

After every ``eval_every`` rounds, between rounds (outside the round's ``seconds``), the
policy is scored on the fixed held-out set (``heldout.py``): the record's ``heldout``.

The learner never imports libp2p; the bridge is its only way to the swarm.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import logging
import math
import os
import random
import threading
import time
from typing import Any, Callable

import torch

from node.bridge import Bridge
from node.learner.baseline import OwnBaseline
from node.learner.checkpoint import load_checkpoint
from node.learner.config import LearnerConfig
from node.learner.engine import Completion, Engine, make_engine
from node.learner.generator import Generator
from node.learner.grpo import GrpoTrainer, TrainingGroup, advantages
from node.learner.heldout import Evaluator
from node.learner.policy import Policy, load_policy
from node.learner.progress import PhaseCallback, PhaseReporter
from node.learner.prompting import PromptFormat, make_prompt_format, resolve_engine
from node.learner.report import summarize
from node.learner.rescore import RescoreResult, Rescorer, special_token_strings
from node.learner.sapo import ExternalPool, SignalTracker, Taken, plan_round
from node.learner.saver import CheckpointSaver
from node.learner.tasks import build_task, get_family
from node.report import node_report
from protocol import Rollout, TaskSpec, split_rollouts
from protocol.ipc import MAX_SOURCES
from protocol.records import RoundRecord

__all__ = ["Learner", "run_learner"]

log = logging.getLogger(__name__)


def _positive_mass(groups: list[TrainingGroup]) -> float:
    """Mean over groups of the sum of their positive advantages (0 for a group with none)."""
    total = 0.0
    for g in groups:
        adv = advantages(g)
        total += float(adv.clamp(min=0).sum()) if adv is not None else 0.0
    return total / len(groups)


def _signal_share(external: list[TrainingGroup], local: list[TrainingGroup]) -> float | None:
    """External groups' share of the advantage signal per group (sapo.RoundSignals.external_signal)."""
    if not external:
        return None
    ext = _positive_mass(external)
    loc = _positive_mass(local) if local else 0.0
    return ext / (ext + loc) if ext + loc > 0 else 0.5


def _derive_seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclasses.dataclass
class _Request:
    """A round's local generation, queued with the asynchronous generator."""

    round: int
    tasks: list[Any]
    submitted: bool


def _thread_split(config: LearnerConfig) -> tuple[int, int]:
    """(trainer threads, generator threads) with an asynchronous generator on a CPU: the
    generator takes ``engine.generation_threads`` (0: half the cores), the trainer
    ``policy.threads`` (0: the rest); both at least 1."""
    cores = os.cpu_count() or 1
    gen = config.engine.generation_threads or max(1, cores // 2)
    return config.policy.threads or max(1, cores - gen), gen


class Learner:
    """The learner's state: policy, engine, trainer, external pool and round counter."""

    def __init__(self, config: LearnerConfig, peer_id: str = "") -> None:
        self.config = config
        self.peer_id = peer_id
        asynchronous = config.engine.staleness > 0
        trainer_threads, generator_threads = _thread_split(config)
        if config.policy.threads:
            torch.set_num_threads(config.policy.threads)
        self.policy: Policy = load_policy(config.policy, config.data_dir)
        if asynchronous and not config.policy.threads and self.policy.model.device.type == "cpu":
            torch.set_num_threads(trainer_threads)
        self.prompts: PromptFormat = make_prompt_format(config.engine.prompt_format,
                                                        self.policy.tokenizer)
        self.engine_config = resolve_engine(config.engine, model=self.policy.model,
                                            embedded=config.policy.model == "embedded",
                                            prompt_format=self.prompts,
                                            completion_cap=config.trainer.max_completion_tokens)
        """``config.engine`` with the defaults for this model filled in."""
        self.engine: Engine = make_engine(self.engine_config, self.policy.model,
                                          self.policy.tokenizer, source=self.policy.source)
        ref = None
        if config.trainer.kl_coef > 0:
            ref = copy.deepcopy(self.policy.model).eval().requires_grad_(False)
        self.trainer = GrpoTrainer(config.trainer, self.policy.model, self.policy.tokenizer, ref,
                                   temperature=config.engine.temperature)
        self.pool = ExternalPool(config.sapo)
        tok = self.policy.tokenizer
        self.rescorer = Rescorer(
            config.tasks, config.sapo, verify=config.verify,
            max_completion_tokens=config.trainer.max_completion_tokens,
            count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)),
            special_tokens=special_token_strings(tok))
        self.baseline = OwnBaseline(momentum=config.sapo.baseline_momentum,
                                    group_size=config.sapo.completions_per_question)
        self.signals = SignalTracker()
        self.own_signal = 0
        """Our own local groups that carried signal so far: the feeds judge sources whose
        groups carry none against it (swarm.feed_standing)."""
        self.round = 0
        self.progress = PhaseReporter()
        """Phase/progress reports for the status view (run_learner's ``on_phase``)."""
        self.resumed_from: str | None = None
        self.last_heldout: dict[str, Any] | None = None
        """The newest held-out score (``heldout()``'s record; a resumed checkpoint's until
        the first of this run): what each checkpoint records as its ``heldout``."""
        ckpt = load_checkpoint(config.data_dir, model=self.policy.model,
                               optimizer=self.trainer.optimizer, fingerprint=self.policy.fingerprint)
        if ckpt is not None:
            self.round = ckpt.round
            self.resumed_from = str(ckpt.path)
            self.last_heldout = ckpt.heldout
            log.info("resumed from %s at round %d", ckpt.path, ckpt.round)
            self.engine.sync_weights()
        # an engine with its own copy of the weights (vLLM) gets them after every optimizer step
        self.trainer.optimizer.register_step_post_hook(lambda *_: self.engine.sync_weights())
        self.version = 0
        """The policy version: training rounds and outer steps that moved the weights so far
        in this run. Local groups carry the version that sampled them (``staleness``)."""
        self.generator: Generator | None = None
        self._requests: collections.deque[_Request] = collections.deque()
        self._open: dict[str, Any] = {}
        """Tasks submitted to the generator and not yet returned, by key (a kept partial
        rollout's task lives here until its group finishes or is dropped)."""
        self._next_request = self.round
        self.dropped_stale = 0
        """Local groups dropped for being more than ``staleness`` versions old, this run."""
        if asynchronous:
            device = config.engine.generation_device
            self.generator = Generator(
                model=self.policy.model, source=self.policy.source,
                device=str(self.policy.model.device) if device == "auto" else device,
                dtype=config.policy.dtype, threads=generator_threads, engine=self.engine_config,
                run_dir=f"{config.data_dir}/run")
            self.generator.push(self.policy.model, self.version)
            log.info("asynchronous generator started (staleness %d, %d generator / %d trainer "
                     "threads)", config.engine.staleness, generator_threads, torch.get_num_threads())
        for family in config.tasks.families:  # fail fast on a misconfigured family
            get_family(family).sample_spec(random.Random(0), config.tasks.family_config.get(family, {}))
        self.evaluator: Evaluator | None = None
        if config.eval_every:
            sapo = config.sapo
            self.evaluator = Evaluator(
                tasks=config.tasks, engine=self.engine, prompts=self.prompts,
                questions=config.eval_questions, samples=config.eval_samples,
                max_batch=sapo.questions_per_round * sapo.completions_per_question)

    def heldout(self) -> dict[str, Any] | None:
        """The held-out score of the policy as it is now, if this round count is due one
        (every ``eval_every`` rounds trained), as the record's ``heldout``; else None."""
        if self.evaluator is None or self.round % self.config.eval_every:
            return None
        self.progress.report("eval")
        score = self.evaluator.run()
        log.info("peer %s after %d rounds: held-out accuracy greedy %.3f sampled %.3f "
                 "(%d questions, %.2f s)", self.peer_id[:16], self.round, score.greedy_accuracy,
                 score.sampled_accuracy, score.questions, score.seconds)
        self.last_heldout = score.to_record(after_rounds=self.round)
        return self.last_heldout

    @property
    def fingerprint(self) -> str:
        return self.policy.fingerprint

    def weights_moved(self) -> None:
        """Something other than a training round moved the weights (an outer step): a new
        version, sampled from from now on."""
        self.version += 1
        self.engine.sync_weights()
        if self.generator is not None:
            self.generator.push(self.policy.model, self.version)

    def close(self) -> None:
        """Stop the generator process, if any (its in-flight requests are dropped)."""
        if self.generator is not None:
            self.generator.close()
            self.generator = None

    def run_round(self, bridge: Bridge, stop: threading.Event | None = None) -> dict[str, Any] | None:
        """Run one round; None if ``stop`` was set before it finished (nothing trained)."""
        cfg = self.config
        stopped = stop.is_set if stop is not None else (lambda: False)
        seconds: dict[str, float] = {}
        rng = random.Random(_derive_seed(cfg.seed, self.peer_id, self.round))
        cpu = time.thread_time()

        t = time.perf_counter()
        self.progress.report("receive")
        counters_before = collections.Counter(self.pool.counters)  # add/take count their drops
        received = bridge.receive("rollouts", max_items=cfg.sapo.max_receive)
        received_at = time.time()
        ingest = self.rescorer.rescore(received)
        self.pool.add(ingest.groups, now=self.round)
        book = self.pool.book  # the feeds keep who delivers (swarm.feed_standing)
        bridge.sources(book.delivered(MAX_SOURCES), book.valid(MAX_SOURCES),
                       own=self.own_signal)
        available = self.pool.available(self.round, baseline=self.baseline)
        n_local, n_external = plan_round(cfg.sapo, available, self.signals.signals())
        seconds["receive"] = time.perf_counter() - t
        if stopped():
            return None

        t = time.perf_counter()
        generator_seconds: float | None = None
        dropped_stale = 0
        if self.generator is None:
            tasks = [build_task(self._sample_spec(rng)) for _ in range(n_local)]
            # resolve_engine filled max_new_tokens in (make_engine refuses None): `or 0` is for mypy
            with self.progress.phase("generate", total=self.engine_config.max_new_tokens or 0,
                                     model=self.policy.model):
                completions = self.engine.generate(
                    [self.prompts.render(task.prompt) for task in tasks],
                    n=cfg.sapo.completions_per_question,
                    seed=_derive_seed(cfg.seed, self.peer_id, self.round, "gen")
                ) if tasks else []  # I = 0: a pure consumer round
            versions = [self.version] * len(tasks)
            resumed_tokens = 0
            seconds["generate"] = time.perf_counter() - t
        else:
            self.progress.report("generate")
            tasks, completions, versions, generator_seconds, resumed_tokens = \
                self._take_generated(n_local)
            fresh = [self.version - v <= cfg.engine.staleness for v in versions]
            dropped_stale = fresh.count(False)
            if dropped_stale:
                self.dropped_stale += dropped_stale
                log.info("round %d: %d local groups made at version %d dropped (now %d, "
                         "staleness %d)", self.round, dropped_stale, min(versions), self.version,
                         cfg.engine.staleness)
                keep = [i for i, ok in enumerate(fresh) if ok]
                tasks = [tasks[i] for i in keep]
                completions = [completions[i] for i in keep]
                versions = [versions[i] for i in keep]
            seconds["wait_generated"] = time.perf_counter() - t
        if stopped():
            return None

        t = time.perf_counter()
        self.progress.report("score")
        local = [TrainingGroup(prompt=task.prompt, completions=tuple(c.text for c in group),
                               rewards=tuple(task.score(c.text) for c in group),
                               completion_ids=(tuple(c.token_ids for c in group)
                                               if all(c.token_ids for c in group) else None),
                               behaviour_logp=tuple(c.logprobs for c in group), version=version)
                 for task, group, version in zip(tasks, completions, versions)]
        by_family: dict[str, list[tuple[float, ...]]] = collections.defaultdict(list)
        for task, g in zip(tasks, local):
            by_family[task.spec.family].append(g.rewards)
        for family, rewards in by_family.items():
            self.baseline.update(family, rewards)
        seconds["score"] = time.perf_counter() - t

        t = time.perf_counter()
        self.progress.report("publish")
        published = self._publish(bridge, tasks, local, completions)
        published_at = time.time()
        seconds["publish"] = time.perf_counter() - t
        if stopped():
            return None

        t = time.perf_counter()
        taken = self.pool.take(n_external, now=self.round, baseline=self.baseline)
        external = [x.group for x in taken]
        # from here on the groups carry the prompt as this model saw it (published ones did not)
        local, external = self._as_seen(local), self._as_seen(external)
        with self.progress.phase("train", total=self._train_passes(len(local) + len(external)),
                                 model=self.policy.model.base_model):  # trainer calls the trunk
            trained_at = self.version
            train = self.trainer.step(local + external, version=trained_at)
        if train.get("optimizer_steps"):
            self.version += 1
            if self.generator is not None:
                self.generator.push(self.policy.model, self.version)
        seconds["train"] = time.perf_counter() - t
        if cfg.slowdown_for_tests > 1:  # emulate a slower device: this round, stretched
            # by its compute on this thread, not its wall time: a CPU shared with other
            # processes stretches the wall time, and multiplying that by the slowdown turned
            # 5 s of contention into a 60 s round (e2e local swarm: a node's rounds fell a
            # minute behind its peers' and it ended at another state)
            extra = (cfg.slowdown_for_tests - 1) * min(time.thread_time() - cpu,
                                                       sum(seconds.values()))
            time.sleep(extra)
            seconds["slowdown"] = extra
        dropped = self.pool.counters - counters_before
        self.own_signal += sum(len(set(g.rewards)) > 1 for g in local)
        self.signals.observe(
            local_flat=sum(len(set(g.rewards)) == 1 for g in local) / len(local) if local else None,
            external_signal=_signal_share(external, local),
            mean_reward=(sum(sum(g.rewards) for g in local) / sum(len(g.rewards) for g in local)
                         if local else None))
        record = self._record(local=local, taken=taken, completions=completions, train=train,
                              published=published, ingest=ingest, seconds=seconds,
                              dropped=dropped, wanted=n_external, available=available)
        # wall clock, so records of different nodes can be ordered: rounds never wait for the
        # network, so what a round can have received depends on when the others published
        record["received_at"] = round(received_at, 3)
        record["published_at"] = round(published_at, 3)
        record["policy_version"] = self.version
        record["local_staleness"] = trained_at - min(versions) if local else None
        record["resumed_tokens"] = resumed_tokens
        wall = sum(seconds.values())
        record["trainer_busy"] = round(seconds["train"] / wall, 4) if wall > 0 else None
        gen = seconds.get("generate", generator_seconds)
        record["generator_busy"] = round(min(1.0, gen / wall), 4) if wall > 0 and gen is not None else None
        record["dropped_stale"] = dropped_stale
        if generator_seconds is not None:
            record["generator_seconds"] = round(generator_seconds, 4)
        return record

    def _take_generated(self, n_local: int) -> tuple[list[Any], list[list[Completion]], list[int], float, int]:
        """This round's local groups from the generator: (tasks, completions, the version
        that sampled each group (its oldest token's), the generator's seconds on them, the
        tokens of resumed partial rollouts among them). Queues the requests of rounds up to
        ``staleness`` ahead first (each with this round's planned I; with partial rollouts
        ``ceil(F x I)`` prompts, of which the worker starts what it has room for), so the
        generator works on them while this round trains."""
        assert self.generator is not None
        cfg = self.config
        over = cfg.engine.partial_rollouts or 1.0
        while self._next_request <= self.round + cfg.engine.staleness:
            k = self._next_request
            rng = random.Random(_derive_seed(cfg.seed, self.peer_id, k))
            tasks = [build_task(self._sample_spec(rng)) for _ in range(math.ceil(over * n_local))]
            if tasks:
                keys = [f"{k}:{i}" for i in range(len(tasks))]
                self._open.update(zip(keys, tasks))
                self.generator.submit(keys, [self.prompts.render(task.prompt) for task in tasks],
                                      n=cfg.sapo.completions_per_question, want=n_local,
                                      seed=_derive_seed(cfg.seed, self.peer_id, k, "gen"))
            self._requests.append(_Request(round=k, tasks=tasks, submitted=bool(tasks)))
            self._next_request += 1
        request = self._requests.popleft()
        if not request.submitted:
            return [], [], [], 0.0, 0
        reply = self.generator.take()
        for key in reply.unused + reply.dropped:
            self._open.pop(key, None)
        self.dropped_stale += len(reply.dropped)
        tasks = [self._open.pop(key) for key, _, _ in reply.groups]
        return (tasks, [c for _, _, c in reply.groups], [v for _, v, _ in reply.groups],
                reply.seconds, reply.resumed_tokens)

    def _as_seen(self, groups: list[TrainingGroup]) -> list[TrainingGroup]:
        """The groups with their prompts rendered for this model (``prompting.py``)."""
        return [dataclasses.replace(g, prompt=self.prompts.render(g.prompt)) for g in groups]

    def _train_passes(self, groups: int) -> int:
        """Forward passes of the policy in one trainer step (one per micro-batch and epoch),
        counting one micro-batch per ``minibatch_groups`` chunk: the token budget can split a
        chunk further and a chunk of zero-variance groups is skipped, so this is an estimate."""
        tc = self.config.trainer
        return -(-groups // tc.minibatch_groups) * tc.epochs

    def _record(self, *, local: list[TrainingGroup], taken: list[Taken],
                completions: list[Any], train: dict[str, float], published: int,
                ingest: RescoreResult, seconds: dict[str, float],
                dropped: collections.Counter[str], wanted: int, available: int) -> dict[str, Any]:
        """The per-round record (report.py lists the contract keys)."""
        external = [x.group for x in taken]
        local_rewards = [r for g in local for r in g.rewards]
        ext_rewards = [r for g in external for r in g.rewards]
        ages = [x.age for x in taken]
        return {
            "round": self.round,
            "mean_reward": sum(local_rewards) / max(1, len(local_rewards)),
            "accuracy": sum(r >= 1.0 for r in local_rewards) / max(1, len(local_rewards)),
            "mean_reward_external": sum(ext_rewards) / len(ext_rewards) if ext_rewards else None,
            "rollouts_published": published,
            "rollouts_received": ingest.rollouts,
            "batches_received": ingest.batches,
            "local_used": len(local),
            "external_used": len(external),
            "external_pool": len(self.pool),
            "external_planned": wanted,
            "external_available": available,
            "external_not_useful": dropped["not_useful"],
            "external_age_mean": sum(ages) / len(ages) if ages else None,
            "external_age_max": max(ages) if ages else None,
            "external_zero_advantage": dropped["zero_advantage"],
            "external_stale": dropped["stale"],
            "external_duplicate": dropped["duplicate"],
            "external_sender_capped": dropped["sender_capped"],
            "external_round_capped": dropped["round_capped"],
            "external_evicted_full": dropped["evicted_full"],
            "external_senders": len({x.sender for x in taken}),
            "external_sender_ids": sorted({x.sender for x in taken}),
            "rejected": sum(ingest.rejected.values()),
            "rejected_by_reason": dict(ingest.rejected),
            "tokens_generated": sum(c.token_count for group in completions for c in group),
            "skipped_zero_variance": int(train.get("skipped_zero_variance", 0)),
            "train": {k: v for k, v in train.items() if k != "skipped_zero_variance"},
            "seconds": seconds,
        }

    def _sample_spec(self, rng: random.Random) -> TaskSpec:
        families = self.config.tasks.families
        family = families[rng.randrange(len(families))]
        return get_family(family).sample_spec(rng, self.config.tasks.family_config.get(family, {}))

    def _publish(self, bridge: Bridge, tasks: list[Any], groups: list[TrainingGroup],
                 completions: list[Any]) -> int:
        rollouts = [Rollout(task=task.spec, prompt=task.prompt, completions=g.completions,
                            rewards=g.rewards, token_counts=tuple(c.token_count for c in comp))
                    for task, g, comp in zip(tasks, groups, completions)]
        # batches sized by encoded bytes against the wire's one limit (protocol.max_body_bytes)
        batches, too_large = split_rollouts(self.fingerprint, self.round, rollouts)
        if too_large:
            log.warning("round %d: %d rollouts exceed one gossip message on their own; "
                        "not published", self.round, len(too_large))
        for batch in batches:
            bridge.publish(batch)
        return len(rollouts) - len(too_large)


def run_learner(config: LearnerConfig, bridge: Bridge, *, rounds: int | None = None,
                stop: threading.Event | None = None,
                on_round: Callable[[RoundRecord], None] | None = None,
                outer: Callable[[torch.nn.Module, int], dict[str, Any] | None] | None = None,
                on_phase: PhaseCallback | None = None,
                on_checkpoint: Callable[[int, Any, float], None] | None = None,
                swarm_id: str | None = None,
                outer_state: Callable[[], Any] | None = None,
                finish: Callable[[], None] | None = None,
                ) -> dict[str, Any]:
    """Run ``rounds`` more SAPO rounds (None: until ``stop`` is set); return the node report.

    Each round record gets ``compute_utilisation``: the time spent in rounds so far ÷ the
    wall time since the loop started (what outer steps, checkpoints and callbacks cost).

    Resumes from the data dir's checkpoint if there is one (the round counter continues),
    announces the model fingerprint, calls ``on_round(record)`` and ``outer(model, round)``
    after every round, ``on_phase(name, done, total)`` within rounds, checkpoints every
    ``config.checkpoint_every`` rounds or ``checkpoint_every_s`` seconds (in the background,
    ``on_checkpoint(round, path, seconds)`` when written) and on exit, after ``finish()`` (the
    last outer steps of a run that ended by itself, not by ``stop``). Every checkpoint
    records its provenance (base model, ``swarm_id``, task families) and ``outer_state()``
    (the node's outer state, a copy, or None), which ``swarm-node export`` reads.
    """
    if rounds is None and stop is None:
        raise ValueError("run_learner needs rounds or a stop event (or both)")
    if rounds is not None and rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    learner = Learner(config, peer_id=bridge.peer_id)
    try:
        learner.progress = PhaseReporter(on_phase)
        bridge.announce(model=learner.fingerprint, capabilities=("learner", "sapo"))
        records: list[dict[str, Any]] = []
        outer_steps: list[dict[str, Any]] = []
        start_round = learner.round
        t_start, compute = time.monotonic(), 0.0
        saver = CheckpointSaver(data_dir=config.data_dir, model=learner.policy.model,
                                optimizer=learner.trainer.optimizer, fingerprint=learner.fingerprint,
                                every_rounds=config.checkpoint_every, every_s=config.checkpoint_every_s,
                                keep=config.keep_checkpoints, on_saved=on_checkpoint,
                                saved_round=learner.round if learner.resumed_from else None,
                                provenance={"model": config.policy.model, "swarm_id": swarm_id,
                                            "task_families": list(config.tasks.families),
                                            "family_config": config.tasks.family_config},
                                outer_state=outer_state, heldout=lambda: learner.last_heldout)
        while (rounds is None or learner.round < start_round + rounds) and not (stop and stop.is_set()):
            record = learner.run_round(bridge, stop)
            if record is None:
                break
            learner.round += 1
            compute += sum(record["seconds"].values())
            heldout = learner.heldout()  # between rounds: not in the round's seconds
            if heldout is not None:
                record["heldout"] = heldout
            record["compute_utilisation"] = round(compute / max(1e-9, time.monotonic() - t_start), 4)
            done = RoundRecord.from_dict(record)
            records.append(done.to_dict())
            log.info("peer %s round %d: reward %.3f, published %d, received %d, external %d, rejected %d",
                     learner.peer_id[:16], done.round, done.mean_reward, done.rollouts_published,
                     done.rollouts_received, done.external_used, done.rejected)
            if on_round is not None:
                on_round(done)
            if outer is not None:
                step = outer(learner.policy.model, done.round)
                if step is not None:  # the outer step may have moved the weights
                    learner.weights_moved()
                else:
                    learner.engine.sync_weights()
                if step is not None:
                    outer_steps.append(step)
            saver.after_round(learner.round)
        if finish is not None and not (stop and stop.is_set()):
            finish()  # the last outer steps: they may move the weights the final checkpoint keeps
        learner.progress.report("checkpoint")
        saver.final(learner.round)
        learner.rescorer.close()
    finally:
        learner.close()
    return node_report(peer_id=learner.peer_id, model=learner.fingerprint, rounds=records,
                       outer_steps=outer_steps, summary=summarize(records),
                       start_round=start_round, resumed_from=learner.resumed_from)
