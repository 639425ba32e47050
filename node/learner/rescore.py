"""Re-scoring of received rollouts: the receiver's tasks and verifier, never the sender's claim.

``Rescorer.rescore`` takes the RolloutBatches a round received from the bridge. Each rollout
first passes cheap checks in this process, against the receiver's own configuration (a
failed check is counted under its reason in ``RescoreResult.rejected``):

    unvetted_family                    not a family whose verifier we vetted (unknown
                                       names included; no import to tell them apart)
    foreign_family                     not one of this node's ``tasks.families``
    bad_config / foreign_config        invalid, or not equal to this node's own config for
                                       the family once defaults are filled in
    group_size                         completions != ``sapo.completions_per_question``
    special_token                      a special-token literal of the local tokenizer in the
                                       prompt or a completion
    too_long                           a completion over ``trainer.max_completion_tokens``
                                       local tokens (characters checked first)
    heldout_seed                       a seed no training question has (tasks.base
                                       ``TRAINING_SEEDS``): the held-out set's, or forged;
                                       so no peer can make us train on our evaluation set

Only then is the task rebuilt (the prompt must equal the regenerated one: ``prompt_mismatch``)
and every completion scored, in the sandboxed worker (``verifier.py``), all rollouts of a
round in one call, senders interleaved so that a flood from one cannot use up the call's
time budget before the others are scored; its failures are counted as ``verify_timeout`` / ``verify_crashed`` /
``verify_memory`` / ``verify_bad_reply`` / ``verify_unavailable``. Because a remote config
must equal one of ours, a peer can make us build only datasets we build for ourselves.

What comes out is a list of ``ScoredGroup`` (who sent it, in which of its rounds, when it
arrived) for the external pool (``sapo.py``) to keep or drop.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from node.bridge import Received
from node.learner.config import SapoConfig, TaskConfig, TrainerConfig, VerifyConfig
from node.learner.errors import TaskError
from node.learner.tasks.base import TRAINING_SEEDS
from node.learner.grpo import TrainingGroup
from node.learner.tasks import FAMILIES, normalize_config
from node.learner.tasks.rgym import VETTED
from node.learner.verifier import VerifierClient
from protocol import Rollout, RolloutBatch

__all__ = ["MAX_CHARS_PER_TOKEN", "RescoreResult", "Rescorer", "ScoredGroup",
           "special_token_strings"]

log = logging.getLogger(__name__)
MAX_CHARS_PER_TOKEN = 64
"""A completion longer than ``max_completion_tokens`` times this many characters is rejected
without tokenising it (no tokenizer we know has longer tokens)."""


@dataclass(frozen=True, kw_only=True)
class ScoredGroup:
    """One received question group, re-scored locally, with where and when it came from."""

    sender: str
    """Peer id of the authenticated sender."""
    round: int
    """The sender's round number (from its RolloutBatch)."""
    received_ms: int
    """Wall-clock milliseconds when the swarm process accepted the message."""
    family: str
    group: TrainingGroup
    """Prompt, completions and the *locally computed* rewards (source ``external``)."""
    claimed: tuple[float, ...] = ()
    """The rewards the sender claimed (a hint, never used as rewards; reputation may compare)."""


@dataclass
class RescoreResult:
    """What one ``Rescorer.rescore`` call saw."""

    groups: list[ScoredGroup] = field(default_factory=list)
    batches: int = 0
    rollouts: int = 0
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)


def special_token_strings(tokenizer: Any) -> tuple[str, ...]:
    """The literal text of every special token of a Hugging Face tokenizer (pad, eos, chat
    markers such as ``<|im_start|>``, ...)."""
    names = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            names.add(str(token))
    return tuple(sorted(n for n in names if n))


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class Rescorer:
    """Checks and re-scores received rollouts for one learner (its own tasks and limits)."""

    def __init__(self, tasks: TaskConfig, sapo: SapoConfig, *,
                 max_completion_tokens: int = TrainerConfig().max_completion_tokens,
                 count_tokens: Callable[[str], int] = _utf8_bytes,
                 special_tokens: tuple[str, ...] = (),
                 verify: VerifyConfig | None = None) -> None:
        """``count_tokens`` is the local tokenizer's count (the learner passes it); the default,
        UTF-8 bytes, bounds the count of any byte-level or character tokenizer from above."""
        self.tasks = tasks
        self.sapo = sapo
        self.max_completion_tokens = max_completion_tokens
        self.count_tokens = count_tokens
        self.special_tokens = tuple(special_tokens)
        self._own = {f: normalize_config(f, tasks.family_config.get(f, {})) for f in tasks.families}
        self.verifier = VerifierClient(verify or VerifyConfig(),
                                       preload_rgym=any(f not in FAMILIES for f in tasks.families))

    def rescore(self, received: list[Received]) -> RescoreResult:
        """Check every rollout of every received RolloutBatch, re-score the ones that pass in
        the worker (one call), count what is rejected by reason."""
        out = RescoreResult()
        passed: list[tuple[Received, RolloutBatch, Rollout]] = []
        for item in received:
            msg = item.message
            if not isinstance(msg, RolloutBatch):
                out.rejected["not_rollouts"] += 1
                continue
            out.batches += 1
            for rollout in msg.rollouts:  # per-rollout logs at debug: counts go in the record
                out.rollouts += 1
                reason = self.check(rollout)
                if reason is None:
                    passed.append((item, msg, rollout))
                else:
                    out.rejected[reason] += 1
                    log.debug("rejected rollout of %s from %s (round %d): %s",
                             rollout.task.family[:32], item.sender[:16], msg.round, reason)
        if not passed:
            return out
        passed = _round_robin(passed)
        scores = self.verifier.score(
            [_item(r, self.tasks.family_config.get(r.task.family, {})) for _, _, r in passed])
        for (item, msg, rollout), score in zip(passed, scores):
            if isinstance(score, str):
                out.rejected[score] += 1
                log.debug("rejected rollout of %s from %s (round %d): %s",
                         rollout.task.family, item.sender[:16], msg.round, score)
                continue
            group = TrainingGroup(prompt=rollout.prompt, completions=tuple(rollout.completions),
                                  rewards=score, source="external")
            out.groups.append(ScoredGroup(sender=item.sender, round=msg.round,
                                          received_ms=item.received_ms, family=rollout.task.family,
                                          group=group, claimed=tuple(rollout.rewards)))
        return out

    def check(self, rollout: Rollout) -> str | None:
        """The reason this rollout is refused before re-scoring, or None if it may be scored."""
        spec = rollout.task
        if spec.family not in FAMILIES and spec.family not in VETTED:
            return "unvetted_family"
        if spec.family not in self._own:
            return "foreign_family"
        if spec.seed >= TRAINING_SEEDS:
            return "heldout_seed"
        try:
            config = normalize_config(spec.family, dict(spec.config))
        except TaskError as e:
            return e.reason
        if not _same_config(config, self._own[spec.family]):
            return "foreign_config"
        if len(rollout.completions) != self.sapo.completions_per_question:
            return "group_size"
        char_cap = self.max_completion_tokens * MAX_CHARS_PER_TOKEN
        if any(len(c) > char_cap for c in rollout.completions):
            return "too_long"
        if any(tok in text for tok in self.special_tokens
               for text in (rollout.prompt, *rollout.completions)):
            return "special_token"
        if any(self.count_tokens(c) > self.max_completion_tokens for c in rollout.completions):
            return "too_long"
        return None

    def close(self) -> None:
        """Kill the verifier worker."""
        self.verifier.close()


def _round_robin(passed: list[tuple[Received, RolloutBatch, Rollout]]
                 ) -> list[tuple[Received, RolloutBatch, Rollout]]:
    """Interleave senders (first rollout of each, then the second, ...) so that when the
    round's verification budget runs out, it is the biggest sender's tail that is cut."""
    by_sender: dict[str, list[tuple[Received, RolloutBatch, Rollout]]] = {}
    for entry in passed:
        by_sender.setdefault(entry[0].sender, []).append(entry)
    queues = list(by_sender.values())
    return [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]


def _same_config(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal keys, values and value types (``1 == 1.0 == True`` in Python, but a generator
    may fail or differ on a float where it expects an int)."""
    return a.keys() == b.keys() and all(type(a[k]) is type(b[k]) and a[k] == b[k] for k in a)


def _item(rollout: Rollout, own_config: dict[str, Any]) -> dict[str, Any]:
    """The worker's request item; the config is the receiver's own (equal to the spec's once
    defaults are filled), so the worker only ever builds datasets we configured."""
    spec = rollout.task
    return {"family": spec.family, "config": dict(own_config), "seed": spec.seed,
            "index": spec.index, "prompt": rollout.prompt, "completions": list(rollout.completions)}
