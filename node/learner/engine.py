"""The inference engine: batched sampling of n completions per prompt.

A backend is a class registered in ``ENGINES`` under a name (``EngineConfig.backend``):

``transformers``  ``model.generate`` on the policy itself (always available; what the tests run).
``vllm``          vLLM on the same GPU (``vllm_engine.py``; the optional ``vllm`` extra and CUDA).

Every backend takes prompts already rendered for the model (``prompting.py``) and the engine
config already resolved (no ``None`` fields). ``sync_weights`` makes it sample from the
policy's current weights: the learner calls it after every optimizer step and every outer
step (a no-op for ``transformers``, which samples from the live model).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from node.learner.config import EngineConfig
from node.learner.errors import EngineError

__all__ = ["ENGINES", "BehaviourRecorder", "Completion", "Engine", "TransformersEngine", "cut_at_stop",
           "end_of_sequence_ids", "make_engine", "register_engine"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled completion; ``text`` ends with the stop string that ended it, if any."""

    text: str
    token_count: int
    token_ids: tuple[int, ...] = ()
    """The engine's own token ids (up to and including the end-of-sequence or stop token):
    what the trainer trains local rows on. Empty: the backend does not report them."""
    logprobs: tuple[float, ...] = ()
    """The behaviour log-probability of each of ``token_ids`` under the distribution it was
    sampled from (``log_softmax(logits / T)``, as ``logprobs.py`` computes them). Empty: the
    backend does not report them (the trainer then assumes the current policy made them)."""


class Engine(Protocol):
    def generate(self, prompts: list[str], *, n: int, seed: int,
                 greedy: bool = False) -> list[list[Completion]]:
        """``n`` completions for each prompt, reproducible for a given ``seed``; ``greedy``:
        the most likely token at every step instead of sampling (the held-out score)."""

    def sync_weights(self) -> None:
        """Sample from the policy's current weights from now on."""


ENGINES: dict[str, Callable[..., Engine]] = {}
"""Backend name -> factory ``(config, model, tokenizer, *, source) -> Engine``."""


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    def deco(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        ENGINES[name] = factory
        return factory
    return deco


def make_engine(config: EngineConfig, model: Any, tokenizer: Any, *, source: str | None = None) -> Engine:
    """Build the backend named by ``config.backend`` (``source``: where the policy was loaded
    from, for backends that load their own copy of the model)."""
    if config.max_new_tokens is None or config.stop is None:
        raise EngineError("engine config is not resolved (prompting.resolve_engine)")
    try:
        factory = ENGINES[config.backend]
    except KeyError:
        raise EngineError(f"unknown engine backend {config.backend!r}; known: {sorted(ENGINES)}") from None
    return factory(config, model, tokenizer, source=source)


@register_engine("vllm")
def _vllm(config: EngineConfig, model: Any, tokenizer: Any, *, source: str | None = None) -> Engine:
    from node.learner.vllm_engine import VllmEngine  # imports vllm itself only when built

    return VllmEngine(config, model, tokenizer, source=source)


def end_of_sequence_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokenizer's eos and the model's ``generation_config.eos_token_id`` (one id or a
    list: Qwen2.5 ends a chat turn with ``<|im_end|>`` and a document with ``<|endoftext|>``)."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in (gen if isinstance(gen, (list, tuple)) else [gen]):
        if isinstance(i, int):
            ids.append(i)
    return sorted(set(ids))


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """Truncate ``text`` just after the earliest stop string (kept)."""
    best = len(text)
    for s in stop:
        i = text.find(s)
        if i >= 0:
            best = min(best, i + len(s))
    return text[:best]


class BehaviourRecorder:
    """Records the log-probability of every sampled token under ``softmax(logits / T)``.

    ``generate`` calls a logits processor with the scores of step t and, at step t + 1, with
    the ids that include the token sampled at t: so each call gathers the previous step's
    log-softmax at the newest token, and ``finish`` gathers the last one. Only one step's
    log-softmax (batch x vocabulary) is alive at a time. A custom processor runs before the
    temperature and top-p warpers ``generate`` adds itself (transformers'
    ``_get_logits_processor``; any callable of ``(input_ids, scores)`` is one), so it sees
    the raw logits and divides by T itself; with
    ``top_p < 1`` these are the untruncated tempered log-probs, as the trainer's.
    """

    def __init__(self, temperature: float) -> None:
        self.inv_temp = 1.0 / temperature
        self._last: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._last is not None:
            self.steps.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        self._last = torch.log_softmax(scores.float() * self.inv_temp, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, new tokens)`` log-probs, given the ids sampled at the last step."""
        if self._last is not None:
            self.steps.append(self._last.gather(1, last_tokens[:, None]).squeeze(1))
            self._last = None
        if not self.steps:
            return torch.zeros((last_tokens.shape[0], 0))
        return torch.stack(self.steps, dim=1).cpu()


@register_engine("transformers")
class TransformersEngine:
    """Sampling with ``model.generate``; single-token stop strings become extra eos ids."""

    def __init__(self, config: EngineConfig, model: Any, tokenizer: Any, *,
                 source: str | None = None) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        eos = end_of_sequence_ids(model, tokenizer)
        self._multi_token_stops: list[str] = []
        self._stop = tuple(config.stop or ())
        for s in self._stop:
            ids = tokenizer.encode(s, add_special_tokens=False)
            if len(ids) == 1:
                eos.append(ids[0])
            else:
                self._multi_token_stops.append(s)
        self._eos_ids = sorted(set(eos))
        self._special = set(tokenizer.all_special_ids)

    def sync_weights(self) -> None:
        """Nothing to do: ``generate`` samples from the live policy."""

    @torch.no_grad()
    def generate(self, prompts: list[str], *, n: int, seed: int,
                 greedy: bool = False) -> list[list[Completion]]:
        if n < 1 or not prompts:
            raise EngineError(f"need n >= 1 and at least one prompt (n={n}, {len(prompts)} prompts)")
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        new, logprobs = self._sample(batch["input_ids"], batch["attention_mask"], n=n,
                                     max_new_tokens=self.config.max_new_tokens or 1, seed=seed,
                                     greedy=greedy)
        results: list[list[Completion]] = []
        for p in range(len(prompts)):
            group = []
            for k in range(p * n, (p + 1) * n):
                ids = self._until_eos(new[k])
                group.append(self.completion(ids, logprobs[k][:len(ids)]))
            results.append(group)
        return results

    def completion(self, ids: list[int], logprobs: list[float]) -> Completion:
        """The completion of these sampled token ids (text: special tokens dropped, cut after
        the first stop string)."""
        text = self.tokenizer.decode([i for i in ids if i not in self._special])
        return Completion(text=cut_at_stop(text, self._stop), token_count=len(ids),
                          token_ids=tuple(ids), logprobs=tuple(logprobs))

    @torch.no_grad()
    def continue_ids(self, prefixes: list[list[int]], *, prompt_lengths: list[int],
                     max_new_tokens: int, seed: int) -> list[tuple[list[int], list[float], bool]]:
        """Sample up to ``max_new_tokens`` more tokens after each prefix (prompt ids followed
        by a completion so far; ``prompt_lengths``: where each completion starts): per prefix,
        the new ids, their behaviour log-probs and whether the completion is finished (an
        end-of-sequence or stop, or ``config.max_new_tokens`` tokens in all). The prefix is
        prefilled afresh under the current weights (partial rollouts, ``generator.py``)."""
        if not prefixes:
            return []
        width = max(len(p) for p in prefixes)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(prefixes), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prefixes), width), dtype=torch.long)
        for b, p in enumerate(prefixes):  # left padding, as the tokenizer pads prompts
            input_ids[b, width - len(p):] = torch.tensor(p)
            attention[b, width - len(p):] = 1
        new, logprobs = self._sample(input_ids, attention, n=1, max_new_tokens=max_new_tokens,
                                     seed=seed, greedy=False)
        cap = self.config.max_new_tokens or 1
        out = []
        for p, start, ids, lps in zip(prefixes, prompt_lengths, new, logprobs):
            done_before = len(p) - start
            ids = self._until_eos(ids)[:max(0, cap - done_before)]
            whole = p[start:] + ids
            finished = ((bool(ids) and ids[-1] in self._eos_ids) or len(whole) >= cap
                        or any(stop in self.tokenizer.decode(whole) for stop in self._multi_token_stops))
            out.append((ids, lps[:len(ids)], finished))
        return out

    def _sample(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, n: int,
                max_new_tokens: int, seed: int, greedy: bool) -> tuple[list[list[int]], list[list[float]]]:
        """``model.generate`` on a left-padded batch: the new ids of each of its ``n`` samples
        per row and their behaviour log-probs (``BehaviourRecorder``)."""
        tok, cfg = self.tokenizer, self.config
        sampling: dict[str, Any] = (dict(do_sample=False, temperature=None, top_p=None, top_k=None)
                                    if greedy else
                                    dict(do_sample=True, temperature=cfg.temperature,
                                         top_p=cfg.top_p, top_k=0))
        kwargs: dict[str, Any] = dict(
            **sampling, max_new_tokens=max_new_tokens, num_return_sequences=n,
            eos_token_id=self._eos_ids, pad_token_id=tok.pad_token_id)
        if self._multi_token_stops:
            kwargs.update(stop_strings=self._multi_token_stops, tokenizer=tok)
        recorder = BehaviourRecorder(cfg.temperature)
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[self.model.device] if self.model.device.type == "cuda" else []):
            torch.manual_seed(seed)
            out = self.model.generate(input_ids=input_ids.to(self.model.device),
                                      attention_mask=attention_mask.to(self.model.device),
                                      **kwargs, logits_processor=[recorder])
        self.model.train(was_training)
        new_ids = out[:, input_ids.shape[1]:]
        logprobs = recorder.finish(new_ids[:, -1]).tolist() if new_ids.shape[1] else [[]] * len(new_ids)
        return new_ids.tolist(), logprobs

    def _until_eos(self, ids: list[int]) -> list[int]:
        for i, t in enumerate(ids):
            if t in self._eos_ids:
                return ids[:i + 1]
        return ids
