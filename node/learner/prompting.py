"""What the model is shown for a task, and engine defaults sized for the model.

A task's ``prompt`` is what travels on the wire and what a receiver regenerates and compares
(``rescore``: ``prompt_mismatch``). It is plain text with no model-specific markup, so any
peer, whatever its model, can check it and train on it. Each node renders it for its own
model, here, at generation and at training time alike (the same rendering both times, so
the log-probabilities are those of what was sampled):

``raw``   the prompt as is (the embedded model; a base model without a chat template).
``chat``  the tokenizer's chat template: system = ``SYSTEM_PROMPT`` (ReasoningGYM's
          ``SYSTEM_PROMPTS["default"]``, which GenRL/RL Swarm use with ``system_prompt_id:
          default``), user = the question (the raw prompt without its ``RAW_ANSWER_CUE``),
          then the template's generation prompt.

``resolve_engine`` fills the ``None`` fields of ``EngineConfig`` for the loaded model.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

from node.learner.config import EngineConfig

__all__ = ["CHAT_MAX_NEW_TOKENS", "EMBEDDED_MAX_NEW_TOKENS", "FORMATS", "RAW_ANSWER_CUE",
           "SYSTEM_PROMPT", "ChatFormat", "PromptFormat", "RawFormat", "make_prompt_format",
           "resolve_engine"]

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """Given a problem, your task is to answer the question by thinking step-by-step in a clear and specific manner.
Once you have thought about the reasoning process, provide the answer in the following format:
<answer>answer here</answer>
Do not explain your reasoning inside the answer tags, provide only the final answer. When an example is provided, you should strictly follow the format of the output/answer in that example.
"""
"""``reasoning_gym.utils.SYSTEM_PROMPTS["default"]`` (0.1.x), GenRL's ``system_prompt_id``
default; a test pins that the two are equal."""
RAW_ANSWER_CUE = "\nAnswer: "
"""Ending of a ReasoningGYM task's raw prompt (``tasks/rgym.py``); the chat format drops it
(the system prompt asks for ``<answer>`` tags instead)."""
EMBEDDED_MAX_NEW_TOKENS = 6
"""The embedded model's tasks answer in a few characters plus the newline."""
CHAT_MAX_NEW_TOKENS = 256
"""Any other model: GenRL's ``max_new_tokens`` default; room for a short reasoning."""


class PromptFormat(Protocol):
    name: str

    def render(self, prompt: str) -> str:
        """The text the model is given for a task's wire ``prompt``."""


class RawFormat:
    """The prompt as is."""

    name = "raw"

    def render(self, prompt: str) -> str:
        return prompt


class ChatFormat:
    """The tokenizer's chat template with ``SYSTEM_PROMPT``."""

    name = "chat"

    def __init__(self, tokenizer: Any, system_prompt: str = SYSTEM_PROMPT) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the chat prompt format needs a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt

    def render(self, prompt: str) -> str:
        question = prompt.removesuffix(RAW_ANSWER_CUE)
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": question}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return str(text)


FORMATS = ("raw", "chat")


def make_prompt_format(name: str, tokenizer: Any) -> PromptFormat:
    """``raw``, ``chat`` or ``auto`` (chat when the tokenizer has a chat template)."""
    if name == "auto":
        name = "chat" if getattr(tokenizer, "chat_template", None) else "raw"
    if name == "raw":
        return RawFormat()
    if name == "chat":
        return ChatFormat(tokenizer)
    raise ValueError(f"unknown prompt format {name!r}; known: auto, {', '.join(FORMATS)}")


def resolve_engine(config: EngineConfig, *, model: Any, embedded: bool,
                   prompt_format: PromptFormat, completion_cap: int | None = None) -> EngineConfig:
    """``config`` with its ``None`` fields sized for the model (see ``EngineConfig``).

    ``completion_cap`` (the trainer's ``max_completion_tokens``) also caps the default: longer
    completions would be cut for training and refused by receivers (``rescore``: too_long)."""
    max_new = config.max_new_tokens
    if max_new is None:
        max_new = EMBEDDED_MAX_NEW_TOKENS if embedded else CHAT_MAX_NEW_TOKENS
        if completion_cap is not None:
            max_new = min(max_new, completion_cap)
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if isinstance(context, int) and context > 0:
            max_new = min(max_new, max(1, context // 2))  # leave half the context to the prompt
    stop = config.stop
    if stop is None:
        stop = () if prompt_format.name == "chat" else ("\n",)
    if completion_cap is not None and max_new > completion_cap:
        log.warning("engine max_new_tokens %d > trainer max_completion_tokens %d: longer "
                    "completions are cut for training and refused by peers", max_new, completion_cap)
    resolved = dataclasses.replace(config, max_new_tokens=max_new, stop=stop)
    log.info("engine %s: prompt format %s, max_new_tokens %d, stop %r", resolved.backend,
             prompt_format.name, max_new, stop)
    return resolved
