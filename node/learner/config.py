"""Configuration of the learner: one frozen dataclass per component, composed in LearnerConfig.

Every field has a docstring and is validated in ``__post_init__`` (``TableError``, a
``ValueError``, naming the field). ``LearnerConfig.to_dict()`` / ``from_dict()`` give a
JSON-able form so a supervisor can hand the config to a child process. Imports no torch: the
supervisor checks a node's ``[learner]`` table with it before any child starts
(node/preflight.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from protocol.tables import TableError, build_table, non_negative, positive

__all__ = [
    "ENGINE_BACKENDS",
    "EXTERNAL_CORRECTIONS",
    "EngineConfig",
    "LearnerConfig",
    "PROMPT_FORMATS",
    "PolicyConfig",
    "SapoConfig",
    "TaskConfig",
    "TrainerConfig",
    "VerifyConfig",
]


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Which causal LM the node trains and where it runs."""

    model: str = "embedded"
    """``"embedded"`` (tiny built-in model + char tokenizer), a hub id, a local path, or
    ``"auto"``: the model for the device's memory (``node.learner.fit.MODEL_TABLE``). Every
    model's training step is checked against the device's available memory before any
    weights are loaded (``node.learner.fit``): one that does not fit stops the node."""
    device: str = "auto"
    """``"auto"`` (cuda if available, else cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``."""
    dtype: str = "auto"
    """Parameter dtype: ``auto`` (``bfloat16`` on a CUDA device that supports it, else
    ``float32``), ``float32``, ``bfloat16`` or ``float16``. It is part of the fingerprint
    (peers in different dtypes are different groups). bfloat16 halves weights, gradients and
    AdamW state, but an update smaller than ~1/256 of a weight rounds away: with a very small
    ``lr`` prefer ``float32`` where memory allows."""
    threads: int = 0
    """torch intra-op threads for this process; 0 leaves torch's default."""

    def __post_init__(self) -> None:
        if not self.model:
            raise TableError("model", "must be non-empty")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise TableError("dtype", f"must be auto/float32/bfloat16/float16, got {self.dtype!r}")
        if not (self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps")):
            raise TableError("device", f"unknown device {self.device!r}")
        non_negative(self, "threads")


EXTERNAL_CORRECTIONS = ("off", "mask", "weight")
"""Values ``TrainerConfig.external_correction`` may take (``node.learner.offpolicy``)."""
STALE_CORRECTIONS = ("decoupled", "off")
"""Values ``TrainerConfig.stale_correction`` may take (``node.learner.grpo``)."""

ENGINE_BACKENDS = ("transformers", "vllm")
"""Inference backends ``EngineConfig.backend`` may name (``node.learner.engine.ENGINES``)."""
PROMPT_FORMATS = ("auto", "raw", "chat")
"""Prompt formats ``EngineConfig.prompt_format`` may name (``node.learner.prompting``)."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How completions are sampled. ``None`` fields are sized for the model when the learner
    loads it (``node.learner.prompting.resolve_engine``); a value set here always wins."""

    backend: str = "transformers"
    """Inference backend: ``transformers`` (``model.generate`` on the policy itself) or
    ``vllm`` (needs ``pip install 'swarm-node[vllm]'`` and a CUDA GPU; weights are pushed to
    it after every optimizer step and every outer step)."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens. None: 6 for the embedded model (its tasks answer in a
    few characters), 256 for any other model (GenRL's default; a ReasoningGYM answer after a
    short reasoning), capped by the model's context and ``trainer.max_completion_tokens``."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    stop: tuple[str, ...] | None = None
    """Stop strings; a completion ends after the first one (which is kept in its text).
    None: ``("\\n",)`` with the raw prompt format (an answer is one line), none with the chat
    format (the end-of-turn token ends a completion)."""
    prompt_format: str = "auto"
    """``raw``: the task's prompt as is; ``chat``: the tokenizer's chat template with the
    ReasoningGYM/GenRL system prompt (answer in ``<answer>...</answer>``); ``auto``: chat
    when the tokenizer has a chat template, else raw (the embedded model)."""
    gpu_memory_utilization: float = 0.35
    """vllm only: fraction of the GPU's memory vLLM may take for its copy of the weights and
    its KV cache; the rest is left to training, which runs on the same GPU."""
    staleness: int = 0
    """The staleness bound eta, in policy versions (a version is one training round or one
    outer step that moved the weights). 0: each round generates, then trains (the generator
    idles while the trainer steps, and the other way round). eta >= 1: a generator process
    (``node.learner.generator``, transformers backend) with its own copy of the weights keeps
    producing the next rounds' local groups while the trainer steps; the weights reach it
    at step boundaries, and a group made more than eta versions before the one it would be
    trained at is dropped and counted (``dropped_stale``). Needs memory for a second copy
    of the weights on ``generation_device``."""
    generation_device: str = "auto"
    """With ``staleness`` >= 1: the generator process's device (``cpu``, ``cuda:1``, ...);
    ``auto``: the policy's. On a CPU the generator and the trainer split the cores
    (``generation_threads``)."""
    generation_threads: int = 0
    """With ``staleness`` >= 1 on a CPU: the generator's torch threads; 0: half the cores
    (at least 1), the trainer keeps the rest unless ``policy.threads`` says otherwise."""
    partial_rollouts: float = 0.0
    """With ``staleness`` >= 2: APRIL's partial rollouts. 0: off (every round's groups are
    sampled to the end in one batch, whose longest completion sets its time). F >= 1: the
    generator keeps up to F x I groups going, ``partial_segment_tokens`` at a time, hands the
    round the first I that finish, and resumes the unfinished ones next round (their tokens
    keep the version that sampled them; a group more than ``staleness`` versions old is
    dropped)."""
    partial_segment_tokens: int = 8
    """With ``partial_rollouts``: tokens sampled per segment (between segments the generator
    takes the newest weights and checks which groups finished)."""

    def __post_init__(self) -> None:
        if self.stop is not None:
            object.__setattr__(self, "stop", tuple(self.stop))
            if any(not s for s in self.stop):
                raise TableError("stop", "must not contain empty strings")
        if self.max_new_tokens is not None:
            positive(self, "max_new_tokens")
        positive(self, "temperature", "top_p")
        if self.top_p > 1:
            raise TableError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.backend not in ENGINE_BACKENDS:
            raise TableError("backend", f"must be one of {ENGINE_BACKENDS}, "
                             f"got {self.backend!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise TableError("prompt_format", f"must be one of {PROMPT_FORMATS}, "
                             f"got {self.prompt_format!r}")
        if not 0 < self.gpu_memory_utilization < 1:
            raise TableError("gpu_memory_utilization", f"must be in (0, 1), "
                             f"got {self.gpu_memory_utilization}")
        non_negative(self, "staleness", "generation_threads")
        positive(self, "partial_segment_tokens")
        if self.partial_rollouts and not (self.partial_rollouts >= 1 and math.isfinite(self.partial_rollouts)):
            raise TableError("partial_rollouts", f"must be 0 (off) or >= 1, got {self.partial_rollouts}")
        if self.partial_rollouts and self.staleness < 2:
            raise TableError("partial_rollouts", "a resumed group is at least 2 policy versions "
                             "old when trained (it started while the round before trained): set "
                             "staleness >= 2 with partial rollouts")
        if self.staleness and self.backend != "transformers":
            raise TableError("staleness", f"the asynchronous generator runs the transformers "
                             f"backend only; set staleness = 0 with backend {self.backend!r}")
        if not (self.generation_device == "auto"
                or self.generation_device.split(":")[0] in ("cpu", "cuda", "mps")):
            raise TableError("generation_device", f"unknown device {self.generation_device!r}")


_DEFAULT_FAMILIES = ("letter_sort",)


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """Where questions come from."""

    families: tuple[str, ...] = _DEFAULT_FAMILIES
    """Task families drawn uniformly per question: built-in (``letter_sort``: 0/1 correctness,
    the SAPO paper's regime; ``tiny_add``: graded reward) or a ReasoningGYM dataset whose
    verifier is vetted (``node.learner.tasks.rgym.VETTED``: ``basic_arithmetic``,
    ``base_conversion``, ...). Received rollouts are accepted only for these families."""
    family_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-family generator config (difficulty), e.g. ``{"basic_arithmetic": {"max_terms": 2}}``.
    Values must be scalars: they travel inside TaskSpec."""
    preset: str = ""
    """A named family set (``node.learner.tasks.presets.PRESETS``), e.g. ``sapo_paper``: the
    SAPO paper's nine ReasoningGYM families. It sets ``families`` (leave that at its default
    or give the same families)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "families", tuple(self.families))
        if self.preset:
            from node.learner.errors import TaskError
            from node.learner.tasks.presets import preset_families

            try:
                wanted = preset_families(self.preset)
            except TaskError as e:
                raise TableError("preset", str(e)) from None
            if self.families not in (_DEFAULT_FAMILIES, wanted):
                raise TableError("families", f"preset {self.preset!r} sets the families; do "
                                             f"not give families={list(self.families)} as well")
            object.__setattr__(self, "families", wanted)
        if not self.families:
            raise TableError("families", "must name at least one family")
        from node.learner.errors import TaskError
        from node.learner.tasks import check_family

        for fam in self.families:
            try:
                check_family(fam)
            except TaskError as e:
                raise TableError("families", str(e)) from None
        for fam, cfg in self.family_config.items():
            if not isinstance(cfg, dict):
                raise TableError("family_config", f"[{fam!r}] must be a table")
            for k, v in cfg.items():
                if not isinstance(v, (str, int, float, bool)):
                    raise TableError("family_config", f"[{fam!r}][{k!r}] must be a scalar")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The GRPO update."""

    lr: float = 3e-4
    """Adam learning rate. The SAPO paper states 1e-3 (Qwen2.5-0.5B); on the embedded model and
    its default task 1e-3 and 6e-4 drive sampled accuracy down within ~25 rounds, 3e-4 learns
    (bench/sapo_vs_isolated.py)."""
    clip_low: float = 0.2
    """Lower clip of the probability ratio: 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip of the ratio: 1 + clip_high (DAPO clip-higher)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the base model (0 disables it and keeps no reference copy)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus on completion tokens (0 = plain GRPO). Counters the
    collapse into one deterministic answer per prompt, after which every group has zero
    variance and GRPO stops learning; zero-variance groups then still feed this term."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    epochs: int = 1
    """Gradient steps per round over the same training set (ratio departs from 1 after the first)."""
    minibatch_groups: int = 8
    """Most question groups per gradient-accumulation micro-batch; ``microbatch_tokens``
    splits further (memory knobs, not maths knobs: every split gives the same update)."""
    max_completion_tokens: int = 256
    """Completions (local or external) are truncated to this many tokens for training."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    microbatch_tokens: int = 4096
    """Most padded tokens (rows x longest row) in one forward/backward micro-batch: with
    ``logits_chunk_mb`` it bounds a step's activations whatever peers send (memory.py). A row
    longer than this is a micro-batch of its own. Halved by the out-of-memory guard."""
    logits_chunk_mb: float = 64.0
    """MiB of fp32 logits the output head produces at a time (logprobs.py): positions per
    chunk = this / (4 bytes x vocabulary)."""
    grad_checkpoint_min_params: int = 200_000_000
    """Models with at least this many parameters recompute each layer's activations in
    backward (gradient checkpointing: ~1/3 more compute, activations / layers); 0: always."""
    external_correction: str = "weight"
    """How far off our policy an external (other peer's) completion may be and still count
    (``node.learner.offpolicy``): ``off`` trains on every one as if we had sampled it (the
    SAPO paper; nothing extra computed); ``mask`` drops the policy-gradient term of a
    completion whose excess surprise under our policy (nats per token beyond our own
    entropy) is above ``external_surprise_bound``; ``weight`` (the default) scales it by
    ``min(1, exp(bound - surprise))``. Costs one more pass of the output head over the
    batch in a round's first epoch (the entropy). Why the default: in the SAPO bench's full
    preset (8 nodes, 400 rounds, 3 seeds, ``bench/results/sapo_vs_isolated.json``) 4/4 with
    ``weight`` at bound 0 gets 1.26x [1.25, 1.27] the isolated nodes' (8/0) cumulative
    accuracy, ``off`` 0.96x [0.91, 1.00]; over 1000 rounds (4 nodes, 4 seeds) ``off`` fell
    to 0.75x (``sapo_vs_isolated_quick_1000_4seeds.json``)."""
    external_surprise_bound: float = 0.0
    """The bound of ``external_correction``, in nats per token (>= 0). 0 (the default) keeps
    at full weight only external completions at least as likely as our own typical sample
    and weighs the others by ``exp(-surprise)``."""
    stale_correction: str = "decoupled"
    """How our own completions sampled by an older policy version are trained (they exist
    only with ``engine.staleness`` >= 1): ``decoupled`` (AReaL's decoupled PPO) multiplies
    each token's policy-gradient term by ``pi_now / pi_behaviour`` (the current policy's
    probability of the token over the sampling policy's, recorded by the engine) and masks
    the token when that weight is above ``stale_weight_cap``; ``off`` trains on them as if
    the current policy had sampled them (naive PPO: the control that collapses at large
    staleness in AReaL's ablation). Completions of the current version weigh 1 either way."""
    stale_weight_cap: float = 5.0
    """Largest ``pi_now / pi_behaviour`` a stale token is trained with (> 1; AReaL's
    default); a token above it is masked (its term dropped, the denominator kept)."""

    def __post_init__(self) -> None:
        positive(self, "lr", "epochs", "minibatch_groups", "max_completion_tokens",
                  "microbatch_tokens", "logits_chunk_mb")
        non_negative(self, "grad_checkpoint_min_params")
        non_negative(self, "clip_low", "clip_high", "kl_coef", "entropy_coef", "grad_clip",
                      "weight_decay")
        if self.clip_low >= 1:
            raise TableError("clip_low", f"must be < 1, got {self.clip_low}")
        if self.external_correction not in EXTERNAL_CORRECTIONS:
            raise TableError("external_correction", f"must be one of {EXTERNAL_CORRECTIONS}, "
                             f"got {self.external_correction!r}")
        non_negative(self, "external_surprise_bound")
        if not math.isfinite(self.external_surprise_bound):
            raise TableError("external_surprise_bound", "must be finite")
        if self.stale_correction not in STALE_CORRECTIONS:
            raise TableError("stale_correction", f"must be one of {STALE_CORRECTIONS}, "
                             f"got {self.stale_correction!r}")
        if not (self.stale_weight_cap > 1 and math.isfinite(self.stale_weight_cap)):
            raise TableError("stale_weight_cap", f"must be finite and > 1, got {self.stale_weight_cap}")


@dataclass(frozen=True, kw_only=True)
class SapoConfig:
    """How a round's training set is built (SAPO's I local + J external question groups)."""

    questions_per_round: int = 8
    """Question-group budget per round (I + J), equal in every configuration, as the paper."""
    completions_per_question: int = 8
    """Completions sampled per local question (the paper's L = 8)."""
    external: int = 4
    """J: external question groups wanted per round; the rest of the budget (I =
    ``questions_per_round`` - J, and any shortfall of J) is generated locally.
    ``external = 0`` is plain single-node RL."""
    filter_zero_advantage: bool = True
    """Discard external groups whose re-scored rewards are all equal before sampling (paper)."""
    pool_capacity: int = 256
    """Most valid external groups kept waiting between rounds (oldest dropped first)."""
    max_receive: int = 256
    """Most RolloutBatch messages taken from the bridge per round."""
    max_age_rounds: int = 2
    """Freshness bound: a group is used only while its age is at most this many rounds, where
    age = max(our rounds since it arrived, its sender's newest round - the group's round);
    older groups are dropped (``external_stale``). 0: only this round's arrivals."""
    per_sender_round: int = 2
    """Most external groups from one trusted sender in one round's training set."""
    newcomer_round: int = 2
    """Most external groups from all untrusted senders together in one round (one budget
    shared by every fresh identity: twenty Sybils get what one gets)."""
    sender_pool_share: float = 0.25
    """Largest fraction of ``pool_capacity`` one trusted sender may hold, and all untrusted
    senders together; above it the bucket's oldest group is evicted (``external_sender_capped``)."""
    trust_after: int = 4
    """A sender becomes trusted (a share of its own) after this many of its groups proved
    useful in training (a completion beat our own baseline), while ``trust_min`` holds."""
    trust_min: float = 0.5
    """A trusted sender keeps at least this fraction of useful used groups and of groups whose
    claimed rewards match ours (Beta(1, 1) posterior means, reputation.py)."""
    max_senders: int = 1024
    """Most sender records kept (least recently seen untrusted ones forgotten first)."""
    dedupe_window: int = 8192
    """How many recent group contents (prompt + completions) are remembered to drop repeats."""
    baseline_momentum: float = 0.7
    """EMA momentum of our own per-family reward baseline (the anchor of external advantages)."""
    adaptive_external: bool = False
    """Pick J each round in [min_external, external] from measured signals (sapo.plan_round)
    instead of always wanting ``external``."""
    min_external: int = 0
    """Lower bound of the adaptive J (only with ``adaptive_external``)."""

    def __post_init__(self) -> None:
        positive(self, "questions_per_round", "completions_per_question", "pool_capacity",
                  "max_receive", "per_sender_round", "max_senders", "dedupe_window")
        non_negative(self, "external", "max_age_rounds", "newcomer_round",
                      "trust_after", "trust_min", "min_external", "baseline_momentum")
        if self.external > self.questions_per_round:
            raise TableError("external", f"must be <= questions_per_round "
                                         f"({self.questions_per_round}), got {self.external}")
        if not 0 < self.sender_pool_share <= 1:
            raise TableError("sender_pool_share", f"must be in (0, 1], got {self.sender_pool_share}")
        if self.trust_min > 1:
            raise TableError("trust_min", f"must be in [0, 1], got {self.trust_min}")
        if self.baseline_momentum >= 1:
            raise TableError("baseline_momentum", f"must be < 1, got {self.baseline_momentum}")
        if self.min_external > self.external:
            raise TableError("min_external", f"({self.min_external}) must be <= external "
                                             f"({self.external})")
        if self.completions_per_question < 2:
            raise TableError("completions_per_question", "must be >= 2 (group advantages)")


@dataclass(frozen=True, kw_only=True)
class VerifyConfig:
    """The sandboxed worker process that re-scores received rollouts (``verifier.py``)."""

    memory_mb: int = 1536
    """Address-space limit of the worker (RLIMIT_AS, MiB); 0 leaves it unlimited. The worker
    needs ~200 MiB of address space for Python + reasoning_gym."""
    cpu_s: int = 30
    """CPU seconds the worker may spend per call (RLIMIT_CPU, raised before every call)."""
    rollout_timeout_s: float = 5.0
    """Wall-clock budget for re-scoring one rollout; on overrun the worker is killed and the
    rollout rejected as ``verify_timeout``."""
    call_timeout_s: float = 30.0
    """Wall-clock budget for all rollouts of one round; what is left then is rejected."""
    start_timeout_s: float = 60.0
    """How long a (re)started worker may take to import its modules and say it is ready
    (within the round's ``call_timeout_s``)."""
    max_restarts: int = 3
    """Worker restarts allowed per round; after that the round's remaining rollouts are
    rejected (``verify_unavailable``)."""

    def __post_init__(self) -> None:
        non_negative(self, "memory_mb", "max_restarts")
        positive(self, "cpu_s", "rollout_timeout_s", "call_timeout_s", "start_timeout_s")
        if 0 < self.memory_mb < 256:
            raise TableError("memory_mb", f"must be 0 or >= 256, got {self.memory_mb}")


@dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """Everything one learner process needs."""

    data_dir: str
    """Directory for the base model, fingerprint and checkpoints (created if absent)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The model."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Sampling."""
    tasks: TaskConfig = field(default_factory=TaskConfig)
    """Task source."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """GRPO update."""
    sapo: SapoConfig = field(default_factory=SapoConfig)
    """Rollout sharing."""
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    """Sandboxed re-scoring of received rollouts."""
    checkpoint_every: int = 10
    """Save a checkpoint every N rounds (and always on stop); 0 saves only on stop."""
    checkpoint_every_s: float = 120.0
    """Also save when this many seconds passed since the last save (0 disables), so a kill
    loses at most about this much work plus one round. Written in a background thread."""
    keep_checkpoints: int = 2
    """How many good checkpoints to keep (>= 1; the previous one is the fallback)."""
    seed: int = 0
    """Seeds task sampling and generation (mixed with the round number)."""
    eval_every: int = 25
    """Score the policy on the fixed held-out set (``heldout.py``: questions no training round
    uses) after every N rounds; 0 = off. Runs between rounds, outside the round's time; the
    result is the round record's ``heldout``. One score costs about one round on the embedded
    model (two generate calls of ``eval_questions`` sequences: bench/heldout_curve.py cost), so
    25 keeps it near 4-5 % of round time. ``swarm-node eval`` scores a data dir or an exported
    model the same way."""
    eval_questions: int = 32
    """Questions in the held-out set, dealt round-robin over ``tasks.families``."""
    eval_samples: int = 1
    """Sampled completions per held-out question (besides the greedy one)."""
    slowdown_for_tests: float = 1.0
    """Tests and benches only: every round is stretched to this multiple of its compute (a
    sleep after training, counted as round time: emulates a slower device). Its compute is
    the training thread's CPU time, not its wall time, so other processes on the CPU do not
    stretch it this many times over. 1 = off."""

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise TableError("data_dir", "must be non-empty")
        non_negative(self, "checkpoint_every", "checkpoint_every_s", "seed", "eval_every")
        positive(self, "keep_checkpoints", "eval_questions", "eval_samples")
        if self.eval_questions > 10_000:
            raise TableError("eval_questions", f"must be <= 10000, got {self.eval_questions}")
        if self.eval_samples > 64:
            raise TableError("eval_samples", f"must be <= 64, got {self.eval_samples}")
        if not math.isfinite(self.checkpoint_every_s):
            raise TableError("checkpoint_every_s", "must be finite")
        if not (1.0 <= self.slowdown_for_tests <= 100.0):
            raise TableError("slowdown_for_tests", "must be in [1, 100]")
        if not math.isfinite(self.seed):
            raise TableError("seed", "must be finite")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (tuples become lists)."""
        return _jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LearnerConfig:
        """Inverse of ``to_dict``. Unknown keys, wrong types and values out of range raise
        ``protocol.tables.TableError`` (a ValueError) naming the key, dotted within a sub-table
        (``sapo.external``)."""
        return build_table(cls, data)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
