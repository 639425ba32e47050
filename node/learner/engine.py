"""The inference engine: batched sampling of n completions per prompt.

A backend is a class registered in ``ENGINES`` under a name (``EngineConfig.backend``). Only
the transformers ``generate`` backend exists; a vLLM backend would register itself here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from node.learner.config import EngineConfig
from node.learner.errors import EngineError

__all__ = ["ENGINES", "Completion", "Engine", "TransformersEngine", "make_engine", "register_engine"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled completion; ``text`` ends with the stop string that ended it, if any."""

    text: str
    token_count: int


class Engine(Protocol):
    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Completion]]:
        """``n`` completions for each prompt, reproducible for a given ``seed``."""


ENGINES: dict[str, Callable[..., Engine]] = {}


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    def deco(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        ENGINES[name] = factory
        return factory
    return deco


def make_engine(config: EngineConfig, model: Any, tokenizer: Any) -> Engine:
    """Build the backend named by ``config.backend``."""
    try:
        factory = ENGINES[config.backend]
    except KeyError:
        raise EngineError(f"unknown engine backend {config.backend!r}; known: {sorted(ENGINES)}") from None
    return factory(config, model, tokenizer)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """Truncate ``text`` just after the earliest stop string (kept)."""
    best = len(text)
    for s in stop:
        i = text.find(s)
        if i >= 0:
            best = min(best, i + len(s))
    return text[:best]


@register_engine("transformers")
class TransformersEngine:
    """Sampling with ``model.generate``; single-token stop strings become extra eos ids."""

    def __init__(self, config: EngineConfig, model: Any, tokenizer: Any) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self._multi_token_stops: list[str] = []
        for s in config.stop:
            ids = tokenizer.encode(s, add_special_tokens=False)
            if len(ids) == 1:
                eos.append(ids[0])
            else:
                self._multi_token_stops.append(s)
        self._eos_ids = sorted(set(eos))
        self._special = set(tokenizer.all_special_ids)

    @torch.no_grad()
    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Completion]]:
        if n < 1 or not prompts:
            raise EngineError(f"need n >= 1 and at least one prompt (n={n}, {len(prompts)} prompts)")
        tok, cfg = self.tokenizer, self.config
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = {k: v.to(self.model.device) for k, v in batch.items()}
        kwargs: dict[str, Any] = dict(
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
            max_new_tokens=cfg.max_new_tokens, num_return_sequences=n,
            eos_token_id=self._eos_ids, pad_token_id=tok.pad_token_id)
        if self._multi_token_stops:
            kwargs.update(stop_strings=self._multi_token_stops, tokenizer=tok)
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[self.model.device] if self.model.device.type == "cuda" else []):
            torch.manual_seed(seed)
            out = self.model.generate(**batch, **kwargs)
        self.model.train(was_training)
        new = out[:, batch["input_ids"].shape[1]:].tolist()
        results: list[list[Completion]] = []
        for p in range(len(prompts)):
            group = []
            for ids in new[p * n:(p + 1) * n]:
                ids = self._until_eos(ids)
                text = tok.decode([i for i in ids if i not in self._special])
                group.append(Completion(text=cut_at_stop(text, cfg.stop), token_count=len(ids)))
            results.append(group)
        return results

    def _until_eos(self, ids: list[int]) -> list[int]:
        for i, t in enumerate(ids):
            if t in self._eos_ids:
                return ids[:i + 1]
        return ids
