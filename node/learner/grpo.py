"""The GRPO update (no critic): group-normalised advantages and a clipped ratio loss.

Reads top to bottom like cleanrl's ``ppo.py``: ``group_advantages`` → ``build_rows`` /
``collate`` → ``token_logprobs`` (logprobs.py: chunked over the vocabulary, at the sampling
temperature) → ``grpo_loss`` (named intermediates ``pg_loss1``/``pg_loss2`` and the
diagnostics ``approx_kl`` and ``clipfrac``) → ``GrpoTrainer.step`` (token-budgeted
micro-batches and the out-of-memory guard, memory.py).

How off-policy data is handled (read this before changing the maths)
--------------------------------------------------------------------
A local completion is trained on the engine's own token ids (``TrainingGroup.completion_ids``:
including any special token the decoded text drops and the end-of-sequence token that ended
it, so the stop decision is trained too); an external one is re-tokenised from its text with
the local tokenizer. ``old_logp`` is the *current* policy's detached log-probability of those tokens, taken
from the first epoch's forward (before the round's first gradient step). So on the first epoch the ratio is exactly
1 and the loss gradient is the plain policy gradient ``-A ∇log π``; clipping only acts from
the second epoch on (``TrainerConfig.epochs > 1``), where it bounds how far this round's steps
move the policy away from where it started, as PPO intends.

Local completions made by an older policy (``engine.staleness`` >= 1: the generator ran
ahead while the trainer stepped) are trained on the engine's own token ids, and the engine
recorded each token's behaviour log-probability ``log pi_behav`` (engine.py's
``BehaviourRecorder``) and the policy version that sampled it. Such a row is *stale* when its
version is older than the trainer's. ``TrainerConfig.stale_correction = "decoupled"`` applies
AReaL's decoupled PPO: ``old_logp`` (the epoch-1 forward, i.e. ``pi_prox``, the current
policy) stays the trust-region centre, and each token's policy-gradient term is multiplied by
the behaviour weight ``w = exp(old_logp - log pi_behav)``, detached; a token with
``w > stale_weight_cap`` is masked (its term dropped, the denominator kept). Rows of the
current version weigh 1 exactly (there the behaviour policy *is* the current one, up to
float rounding: ``w`` is not computed, so with ``staleness = 0`` no weight enters the loss).
``off`` is naive PPO (no weight), the control.

We do not importance-weight external completions by ``π_local / π_sender``: the sender's
log-probabilities are not shared (and may come from another model and tokenizer), and the SAPO
paper likewise trains on shared completions as if they were the node's own samples. For local
completions the current policy *is* the sampling policy (no update happens between generation
and training): log-probs are those of ``softmax(logits / T)`` with the engine's temperature T. The consequence is a biased but low-variance
gradient for external data; the paper reports that this helps when the external groups are
filtered for signal (the zero-advantage filter in ``sapo.py``). ``TrainerConfig``'s
``external_correction`` bounds that bias (``offpolicy.py``): in the first epoch each external
completion's excess surprise under our policy (nats per token beyond our own entropy, a proxy
for the behaviour log-probs we do not have) is measured, and its policy-gradient term masked
or down-weighted (``row_scale`` in ``grpo_loss``) when it is above the bound.

External groups: advantages the sender cannot steer
----------------------------------------------------
GRPO (DeepSeekMath, eq. 3; the SAPO paper uses it unchanged) scores completion i of a group as
``A_i = (r_i - mean(r)) / std(r)``: relative to its companions. For local groups that is right
(the companions are our own samples). For an external group the *sender* chose the companions
(and, without a size check, how many): pair a wrong answer worth 0.3 with worse ones and it
gets the top advantage, ``sqrt(n - 1)``, however poor it is next to what we already produce.
So an external group carries an ``Anchor`` (the receiver's own running reward statistics for
that task family, ``baseline.py``) and is scored by ``anchored_advantages``::

    centre = max(mean(r), own_mean)          # the sender cannot lower the bar below ours
    scale  = max(std(r), own_std)            # nor inflate advantages with a tiny spread
    a_i    = clip((r_i - centre) / scale, -sqrt(G - 1), +sqrt(G - 1))
    P = sum of the positive a_i;  N = -(sum of the negative a_i)
    P == 0: no advantage at all (the group is skipped, like a zero-variance one)
    else:   A_i = a_i for a_i > 0,  A_i = a_i * min(1, P / N) for a_i < 0

where G is our own completions per question (``sqrt(G - 1)`` is the largest |A| a local group
of G samples can produce). Consequence, the property the tests pin: **an external completion
gets a positive advantage only if its re-scored reward beats both its group's mean and the
receiver's own expected reward for that family**, and a group whose completions all fall
short of that bar moves nothing. The rescaling keeps every external group's advantages
summing to at most zero (GRPO's groups sum to exactly zero): without it, a sender could fill
slots with groups that are all below our baseline, all-negative pushes whose gradients crowd
the clipped gradient norm (measured: honest reward 0.62 -> 0.27 on ``bench/steering_attack.py``).
When the sender's group is better than we are, ``centre`` is its own mean and the maths is
plain GRPO (we learn from its better half). Local groups carry no anchor: plain GRPO.

Every group weighs the same in the loss
---------------------------------------
The loss is a mean over groups of the token mean within each group (``Batch.row_weight`` is
``1 / tokens of the row's group``): DAPO's token-level mean inside a group, GRPO's equal weight
per question across groups. A 64-completion (or long-completion) group therefore weighs exactly
what a local group of 8 weighs, instead of 8x (rows) or more (tokens).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from node.learner.config import TrainerConfig
from node.learner.logprobs import check_head_matches, token_logprobs
from node.learner.memory import (PROMPT_ALLOWANCE, MemoryEstimate, chunk_tokens_for,
                                 estimate_step_memory, is_out_of_memory, plan_microbatches,
                                 release_cached_memory)
from node.learner.offpolicy import completion_weights, excess_surprise

__all__ = ["Anchor", "Batch", "GrpoTrainer", "Row", "TrainingGroup", "advantages", "anchored_advantages",
           "build_batch", "build_rows", "collate", "group_advantages", "grpo_loss", "token_logprobs"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Anchor:
    """The receiver's own reward statistics an external group is judged against."""

    mean: float
    """Our own expected reward for the group's task family (running mean of local rewards)."""
    std: float
    """Spread of our own rewards for that family (floor of the advantage scale)."""
    max_abs: float
    """Largest |advantage| allowed: ``sqrt(G - 1)`` for our own group size G."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.std) and self.std >= 0):
            raise ValueError(f"Anchor: mean and std must be finite, std >= 0 ({self.mean}, {self.std})")
        if not self.max_abs > 0:
            raise ValueError(f"Anchor.max_abs must be positive, got {self.max_abs}")


@dataclass(frozen=True, kw_only=True)
class TrainingGroup:
    """One question group for the update: prompt, completion texts and locally computed rewards."""

    prompt: str
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    source: str = "local"
    """``local`` or ``external`` (diagnostics; the maths follows ``anchor``)."""
    anchor: Anchor | None = None
    """None: plain GRPO advantages. Set (external groups): ``anchored_advantages``."""
    completion_ids: tuple[tuple[int, ...], ...] | None = None
    """The engine's token ids of each completion (local groups): trained as they are
    instead of re-tokenising the text. None: tokenise ``completions``."""
    behaviour_logp: tuple[tuple[float, ...], ...] | None = None
    """Each completion token's log-probability under the policy that sampled it (with
    ``completion_ids``; an empty tuple for a completion the engine gave none)."""
    version: int | None = None
    """The policy version that sampled the group (local groups); None: unknown (external)."""


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor | None:
    """(r - mean) / std within one group (population std); ``None`` if all rewards are equal."""
    if rewards.numel() < 2:
        return None
    std = rewards.std(unbiased=False)
    if float(std) <= eps:
        return None
    return (rewards - rewards.mean()) / (std + eps)


def anchored_advantages(rewards: torch.Tensor, anchor: Anchor, eps: float = 1e-6) -> torch.Tensor | None:
    """External group: centre ``max(mean, anchor.mean)``, scale ``max(std, anchor.std)``,
    clipped to ``±anchor.max_abs``, negatives shrunk to the positive mass (module docstring);
    ``None`` if all rewards are equal or none beats the centre."""
    if rewards.numel() < 2:
        return None
    std = float(rewards.std(unbiased=False))
    if std <= eps:
        return None
    centre = max(float(rewards.mean()), anchor.mean)
    scale = max(std, anchor.std)
    adv = ((rewards - centre) / (scale + eps)).clamp(-anchor.max_abs, anchor.max_abs)
    positive = float(adv.clamp(min=0).sum())
    if positive <= eps:
        return None
    negative = float(-adv.clamp(max=0).sum())
    if negative > positive:
        adv = torch.where(adv < 0, adv * (positive / negative), adv)
    return adv


def advantages(group: TrainingGroup) -> torch.Tensor | None:
    """The group's advantages: plain GRPO, or anchored when the group carries an ``Anchor``."""
    rewards = torch.tensor(group.rewards, dtype=torch.float32)
    if group.anchor is None:
        return group_advantages(rewards)
    return anchored_advantages(rewards, group.anchor)


@dataclass(frozen=True)
class Row:
    """One prompt+completion: its token ids, prompt length, advantage and loss weight."""

    ids: list[int]
    n_prompt: int
    advantage: float
    weight: float
    """1 / (completion tokens of the row's group): every group weighs the same."""
    external: bool = False
    """From another peer's group (``TrainingGroup.source``): ``external_correction`` applies."""
    behaviour: tuple[float, ...] | None = None
    """The behaviour log-prob of each completion token, when the row is stale (sampled by
    an older policy version) and the engine recorded them; None otherwise."""
    stale: bool = False
    """Sampled by an older policy version than the one it is trained at."""


@dataclass
class Batch:
    """Right-padded prompt+completion ids; ``loss_mask[b, t]`` marks completion token t+1;
    ``row_weight[b]`` = 1 / (completion tokens of row b's group): every group weighs the same."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    row_weight: torch.Tensor


def build_rows(groups: list[TrainingGroup], tokenizer: Any, *, max_completion_tokens: int,
               max_length: int | None = None, keep_flat: bool = False,
               version: int | None = None) -> tuple[list[Row], int]:
    """Tokenise the groups with non-zero variance; returns (rows, groups skipped).

    A group with ``completion_ids`` is trained on them (the engine's own tokens), others are
    tokenised from their text. Completions are cut to ``max_completion_tokens`` and every
    row to ``max_length`` tokens (the model's context); a row whose prompt alone fills the
    context is dropped. With ``keep_flat`` zero-variance groups stay in with advantage 0
    (they then only feed the entropy bonus); they are counted as skipped either way. A group
    whose ``version`` is older than ``version`` (the policy's now) gives stale rows.
    """
    rows: list[Row] = []
    skipped = 0
    for g in groups:
        adv = advantages(g)
        if adv is None:
            skipped += 1
            if not keep_flat:
                continue
            adv = torch.zeros(len(g.rewards))
        prompt_ids = tokenizer.encode(g.prompt, add_special_tokens=False)
        stale = g.version is not None and version is not None and g.version < version
        group_rows = []
        for k, (text, a) in enumerate(zip(g.completions, adv.tolist())):
            comp = (list(g.completion_ids[k]) if g.completion_ids is not None
                    else tokenizer.encode(text, add_special_tokens=False))[:max_completion_tokens]
            if max_length is not None:
                comp = comp[:max(0, max_length - len(prompt_ids))]
            behaviour = None
            if stale and g.behaviour_logp is not None and len(g.behaviour_logp[k]) >= len(comp):
                behaviour = tuple(g.behaviour_logp[k][:len(comp)])
            if comp and prompt_ids:
                group_rows.append((prompt_ids + comp, a, behaviour))
        tokens = sum(len(ids) - len(prompt_ids) for ids, _, _ in group_rows)
        external = g.source == "external"
        rows.extend(Row(ids, len(prompt_ids), a, 1.0 / tokens, external, behaviour, stale)
                    for ids, a, behaviour in group_rows)
    return rows, skipped


def collate(rows: list[Row], pad_id: int, device: torch.device) -> Batch:
    """Right-pad ``rows`` into one ``Batch``."""
    width = max(len(r.ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for b, r in enumerate(rows):
        input_ids[b, :len(r.ids)] = torch.tensor(r.ids)
        attention[b, :len(r.ids)] = 1
        loss_mask[b, r.n_prompt - 1:len(r.ids) - 1] = 1.0  # predictions of completion tokens
    row_adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    row_weight = torch.tensor([r.weight for r in rows], dtype=torch.float32)
    return Batch(input_ids.to(device), attention.to(device), loss_mask.to(device),
                 row_adv.to(device), row_weight.to(device))


def build_batch(groups: list[TrainingGroup], tokenizer: Any, *, max_completion_tokens: int,
                device: torch.device, max_length: int | None = None,
                keep_flat: bool = False) -> tuple[Batch | None, int]:
    """``build_rows`` then ``collate`` them all into one batch (None if no row is left)."""
    rows, skipped = build_rows(groups, tokenizer, max_completion_tokens=max_completion_tokens,
                               max_length=max_length, keep_flat=keep_flat)
    return (collate(rows, tokenizer.pad_token_id, device) if rows else None), skipped


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_low: float, clip_high: float,
              ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
              entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
              row_weight: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
              token_scale: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate, weighted mean over completion tokens, plus optional KL penalty and
    entropy bonus. Without ``row_weight`` the mean is DAPO's token-level one; with it each
    token of row b weighs ``row_weight[b]`` (``build_batch``: equal weight per group).
    ``row_scale[b]`` (offpolicy.py's completion weights) multiplies row b's policy-gradient
    term and leaves the denominator alone: a row scaled to 0 drops out of the sum, not out
    of the count. ``token_scale[b, t]`` (the behaviour weights of stale rows, 0 where
    masked) multiplies token t's term the same way."""
    if row_weight is not None:
        mask = mask * row_weight[:, None]
    logratio = logp - old_logp
    ratio = logratio.exp()
    adv = advantages[:, None]
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_loss_tok = torch.max(pg_loss1, pg_loss2)
    if row_scale is not None:
        pg_loss_tok = pg_loss_tok * row_scale[:, None]
    if token_scale is not None:
        pg_loss_tok = pg_loss_tok * token_scale
    n_tokens = mask.sum().clamp(min=1e-9)  # (weighted) token count
    pg_loss = (pg_loss_tok * mask).sum() / n_tokens
    loss = pg_loss
    kl = torch.zeros(())
    if ref_logp is not None and kl_coef > 0:
        d = ref_logp - logp  # k3 estimator of KL(π || π_ref), always >= 0
        kl = ((d.exp() - d - 1.0) * mask).sum() / n_tokens
        loss = loss + kl_coef * kl
    entropy_loss = torch.zeros(())
    if entropy is not None:
        entropy_loss = (entropy * mask).sum() / n_tokens
        loss = loss - entropy_coef * entropy_loss
    with torch.no_grad():
        approx_kl = (((ratio - 1.0) - logratio) * mask).sum() / n_tokens
        clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        clipfrac = (clipped.float() * mask).sum() / n_tokens
    return loss, {"pg_loss": pg_loss.item(), "approx_kl": approx_kl.item(),
                  "clipfrac": clipfrac.item(), "kl": kl.item(),
                  "entropy": entropy_loss.item()}




class GrpoTrainer:
    """Owns the optimizer (and the frozen reference model when ``kl_coef > 0``).

    Memory (memory.py): rows are packed into micro-batches of at most ``microbatch_tokens``
    padded tokens, log-probs go through the output head in chunks (logprobs.py), large
    models use gradient checkpointing, and an out-of-memory error during an epoch halves
    ``microbatch_tokens`` and redoes the epoch from zeroed gradients (the packing does not
    change the update). ``before_forward(padded_tokens)``, if set, is called before each
    micro-batch's forward: a seam for fault injection in tests.

    ``old_logp`` is the epoch-1 forward's own ``logp.detach()``: the weights do not change
    before the first optimizer step, so a separate no-grad pass would compute the same.
    """

    def __init__(self, config: TrainerConfig, model: Any, tokenizer: Any,
                 ref_model: Any | None = None, *, temperature: float = 1.0) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.ref_model = ref_model if config.kl_coef > 0 else None
        self.temperature = temperature
        """The engine's sampling temperature: log-probs are those of softmax(logits / T)."""
        self.microbatch_tokens = config.microbatch_tokens
        """Current micro-batch budget (halved by the out-of-memory guard, never raised again)."""
        self.before_forward: Callable[[int], None] | None = None
        self._max_length: int | None = getattr(model.config, "max_position_embeddings", None)
        self._chunk_tokens = chunk_tokens_for(model.config.vocab_size, config.logits_chunk_mb)
        self._n_params = sum(p.numel() for p in model.parameters())
        self.grad_checkpointing = self._n_params >= config.grad_checkpoint_min_params
        if self.grad_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        check_head_matches(model)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay)
        self.memory = self.estimate(config.max_completion_tokens + PROMPT_ALLOWANCE)
        log.info("training step memory for rows of up to %d tokens, %d-token micro-batches, "
                 "%d-position logit chunks%s: %s", config.max_completion_tokens + PROMPT_ALLOWANCE,
                 config.microbatch_tokens, self._chunk_tokens,
                 ", gradient checkpointing" if self.grad_checkpointing else "", self.memory.describe())

    def estimate(self, seq_len: int) -> MemoryEstimate:
        """Predicted peak of a step whose rows have at most ``seq_len`` tokens."""
        param_bytes = next(self.model.parameters()).element_size()
        return estimate_step_memory(self.model.config, self._n_params, self.config,
                                    param_bytes=param_bytes, seq_len=seq_len,
                                    grad_checkpointing=self.grad_checkpointing)

    def step(self, groups: list[TrainingGroup], *, version: int | None = None) -> dict[str, float]:
        """One round's update: ``epochs`` optimizer steps over all groups, at policy
        ``version`` (groups sampled by an older one are stale). Returns diagnostics."""
        cfg = self.config
        stats: dict[str, float] = {"groups": float(len(groups)), "skipped_zero_variance": 0.0,
                                   "optimizer_steps": 0.0, "oom_retries": 0.0}
        chunks: list[list[Row]] = []
        for i in range(0, len(groups), cfg.minibatch_groups):
            rows, skipped = build_rows(groups[i:i + cfg.minibatch_groups], self.tokenizer,
                                       max_completion_tokens=cfg.max_completion_tokens,
                                       max_length=self._max_length, keep_flat=cfg.entropy_coef > 0,
                                       version=version)
            stats["skipped_zero_variance"] += skipped
            if rows:
                chunks.append(rows)
        if not chunks:
            return stats
        rows = [r for chunk in chunks for r in chunk]
        total_weight = sum(r.weight * (len(r.ids) - r.n_prompt) for r in rows)
        old: dict[int, torch.Tensor] = {}  # row index -> its detached epoch-1 log-probs
        ref: dict[int, torch.Tensor] = {}
        judged: dict[int, tuple[float, float]] = {}  # row -> (excess surprise, weight)
        behave: dict[int, torch.Tensor] = {}  # stale row -> its tokens' behaviour weights
        self.model.train()
        for epoch in range(cfg.epochs):
            while True:
                plan = self._plan(chunks)
                try:
                    diag = self._epoch(rows, plan, old, ref, judged, behave, total_weight,
                                       first=epoch == 0)
                    break
                except Exception as e:  # only out-of-memory is retried
                    if not is_out_of_memory(e) or all(len(mb) == 1 for mb in plan):
                        raise
                    padded = max(len(mb) * max(len(rows[i].ids) for i in mb) for mb in plan)
                    self.microbatch_tokens = max(1, min(self.microbatch_tokens, padded) // 2)
                    log.warning("out of memory in a training micro-batch (%s); retrying the epoch "
                                "with %d-token micro-batches", type(e).__name__, self.microbatch_tokens)
                self.optimizer.zero_grad(set_to_none=True)
                release_cached_memory(self.model.device)
                stats["oom_retries"] += 1
            grad_norm = (torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                         if cfg.grad_clip > 0 else torch.zeros(()))
            self.optimizer.step()
            stats["optimizer_steps"] += 1
        self.optimizer.zero_grad(set_to_none=True)
        stats.update(diag)
        stats.update(_correction_stats(rows, judged))
        stats.update(_stale_stats(rows, behave))
        stats["grad_norm"] = float(grad_norm)
        stats["train_tokens"] = float(sum(len(r.ids) - r.n_prompt for r in rows))
        stats["microbatches"] = float(len(plan))
        stats["microbatch_tokens"] = float(self.microbatch_tokens)
        stats["predicted_step_mb"] = self.estimate(max(len(r.ids) for r in rows)).total / 2**20
        return stats

    def _plan(self, chunks: list[list[Row]]) -> list[list[int]]:
        """Micro-batches (row indices into the flattened chunks) under the token budget."""
        plan, offset = [], 0
        for chunk in chunks:
            for mb in plan_microbatches([len(r.ids) for r in chunk], self.microbatch_tokens):
                plan.append([offset + i for i in mb])
            offset += len(chunk)
        return plan

    def _epoch(self, rows: list[Row], plan: list[list[int]], old: dict[int, torch.Tensor],
               ref: dict[int, torch.Tensor], judged: dict[int, tuple[float, float]],
               behave: dict[int, torch.Tensor], total_weight: float, *,
               first: bool) -> dict[str, float]:
        """Accumulate the gradient of the whole loss over the micro-batches of ``plan``; the
        ``first`` epoch records each row's old (and reference) log-probs, with an
        ``external_correction`` each external row's excess surprise and weight, and with the
        ``decoupled`` stale correction each stale row's behaviour weights."""
        cfg = self.config
        correcting = cfg.external_correction != "off"
        decoupled = cfg.stale_correction == "decoupled"
        self.optimizer.zero_grad(set_to_none=True)
        diag = dict.fromkeys(("loss", "pg_loss", "approx_kl", "clipfrac", "kl", "entropy"), 0.0)
        for mb in plan:
            b = collate([rows[i] for i in mb], self.tokenizer.pad_token_id, self.model.device)
            if self.before_forward is not None:
                self.before_forward(b.input_ids.numel())
            positions = b.loss_mask.bool()
            logp, entropy = token_logprobs(self.model, b.input_ids, b.attention_mask,
                                           temperature=self.temperature, positions=positions,
                                           with_entropy=cfg.entropy_coef > 0 or (first and correcting),
                                           chunk_tokens=self._chunk_tokens)
            if first:
                self._remember(mb, rows, logp.detach(), old)
                if decoupled:
                    self._behaviour_weights(mb, rows, old, behave)
                if correcting and entropy is not None:
                    self._judge(mb, rows, logp, entropy, b.loss_mask, judged)
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref_logp, _ = token_logprobs(self.ref_model, b.input_ids, b.attention_mask,
                                                     temperature=self.temperature, positions=positions,
                                                     chunk_tokens=self._chunk_tokens)
                    self._remember(mb, rows, ref_logp, ref)
            old_logp = self._recall(mb, old, logp.shape)
            ref_logp = self._recall(mb, ref, logp.shape) if self.ref_model is not None else None
            loss, d = grpo_loss(logp, old_logp, b.advantages, b.loss_mask,
                                clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                ref_logp=ref_logp, kl_coef=cfg.kl_coef,
                                entropy=entropy if cfg.entropy_coef > 0 else None,
                                entropy_coef=cfg.entropy_coef, row_weight=b.row_weight,
                                row_scale=self._scale(mb, judged, b.advantages) if correcting else None,
                                token_scale=(self._token_scale(mb, behave, logp)
                                             if any(i in behave for i in mb) else None))
            weight = float((b.loss_mask * b.row_weight[:, None]).sum()) / total_weight
            (loss * weight).backward()
            diag["loss"] += loss.item() * weight
            for k, v in d.items():
                diag[k] += v * weight
        return diag

    def _judge(self, mb: list[int], rows: list[Row], logp: torch.Tensor, entropy: torch.Tensor,
               mask: torch.Tensor, judged: dict[int, tuple[float, float]]) -> None:
        """Record each row's (excess surprise, weight) (offpolicy.py); local rows weigh 1."""
        surprise = excess_surprise(logp, entropy, mask)
        weight = completion_weights(surprise, mode=self.config.external_correction,
                                    bound=self.config.external_surprise_bound)
        for b, i in enumerate(mb):
            judged[i] = (float(surprise[b]), float(weight[b]) if rows[i].external else 1.0)

    def _behaviour_weights(self, mb: list[int], rows: list[Row], old: dict[int, torch.Tensor],
                           behave: dict[int, torch.Tensor]) -> None:
        """For each stale row with behaviour log-probs: ``exp(old - behaviour)`` on its
        completion tokens (1 on the prompt), 0 where above ``stale_weight_cap`` or not finite."""
        for i in mb:
            r = rows[i]
            if r.behaviour is None:
                continue
            w = torch.ones_like(old[i])
            now = old[i][r.n_prompt - 1:]
            beh = torch.tensor(r.behaviour[:now.shape[0]], dtype=now.dtype, device=now.device)
            tok = (now[:beh.shape[0]] - beh).exp()
            tok = torch.where(torch.isfinite(tok) & (tok <= self.config.stale_weight_cap), tok,
                              torch.zeros_like(tok))
            w[r.n_prompt - 1:r.n_prompt - 1 + tok.shape[0]] = tok
            behave[i] = w

    @staticmethod
    def _token_scale(mb: list[int], behave: dict[int, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Per token of the micro-batch: its behaviour weight (1 for rows that are not stale)."""
        out = torch.ones(like.shape, dtype=torch.float32, device=like.device)
        for b, i in enumerate(mb):
            if i in behave:
                n = min(like.shape[1], behave[i].shape[0])
                out[b, :n] = behave[i][:n]
        return out

    @staticmethod
    def _scale(mb: list[int], judged: dict[int, tuple[float, float]], like: torch.Tensor) -> torch.Tensor:
        """Per row of the micro-batch: its completion weight (1 for local rows)."""
        return torch.tensor([judged[i][1] for i in mb],
                            dtype=like.dtype, device=like.device)

    @staticmethod
    def _remember(mb: list[int], rows: list[Row], logp: torch.Tensor,
                  store: dict[int, torch.Tensor]) -> None:
        for b, i in enumerate(mb):
            store[i] = logp[b, :len(rows[i].ids) - 1].clone()

    @staticmethod
    def _recall(mb: list[int], store: dict[int, torch.Tensor], shape: torch.Size) -> torch.Tensor:
        out = torch.zeros(shape, dtype=torch.float32, device=store[mb[0]].device)
        for b, i in enumerate(mb):
            n = min(shape[1], store[i].shape[0])
            out[b, :n] = store[i][:n]
        return out


def _stale_stats(rows: list[Row], behave: dict[int, torch.Tensor]) -> dict[str, float]:
    """The off-policy token share (completion tokens of stale rows over all trained) and, of
    the stale tokens the decoupled correction weighed, the mean weight and the share masked."""
    tokens = [len(r.ids) - r.n_prompt for r in rows]
    stale = sum(t for r, t in zip(rows, tokens) if r.stale)
    out = {"stale_rows": float(sum(r.stale for r in rows)),
           "stale_token_share": stale / max(1, sum(tokens))}
    weights = [behave[i][r.n_prompt - 1:] for i, r in enumerate(rows) if i in behave]
    if weights:
        flat = torch.cat(weights)
        out["stale_weight_mean"] = float(flat[flat > 0].mean()) if bool((flat > 0).any()) else 0.0
        out["stale_masked"] = float((flat == 0).float().mean())
    return out


def _correction_stats(rows: list[Row], judged: dict[int, tuple[float, float]]) -> dict[str, float]:
    """Diagnostics of ``external_correction`` (empty when it is off): the mean excess surprise
    of local rows (about 0: they are our own samples) and of external ones (all, and those
    with a positive advantage), the external rows' mean weight and the fraction of them
    weighted below 1."""
    groups = {
        "local_surprise": [s for i, (s, _) in judged.items() if not rows[i].external],
        "external_surprise": [s for i, (s, _) in judged.items() if rows[i].external],
        "external_surprise_pos": [s for i, (s, _) in judged.items()
                                  if rows[i].external and rows[i].advantage > 0],
        "external_weight": [w for i, (_, w) in judged.items() if rows[i].external],
    }
    out = {name: sum(xs) / len(xs) for name, xs in groups.items() if xs}
    if groups["external_weight"]:
        weights = groups["external_weight"]
        out["external_rows"] = float(len(weights))
        out["external_downweighted"] = sum(w < 1.0 for w in weights) / len(weights)
    return out
