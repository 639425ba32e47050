"""Answer extraction: which part of a completion a verifier scores.

Chat models are asked (``prompting.SYSTEM_PROMPT``, ReasoningGYM's and GenRL's) to think
first and put the final answer in ``<answer>...</answer>``; ReasoningGYM's
``utils.extract_answer`` takes the last such block and its verifiers score that. Raw-prompt
models (the embedded one) answer right after the prompt. One rule serves both, and it is
applied by ``tasks.build_task`` to every family, so the sender's scoring and the receiver's
re-scoring (``verifier_worker`` rebuilds the task the same way) cannot differ:

- a completion with at least one ``<answer>...</answer>`` block is scored on the content of
  the last block, stripped: the same block ``reasoning_gym.utils.extract_answer`` returns
  (non-overlapping matches, left to right, each ending at the first ``</answer>`` after
  its ``<answer>``), found with ``str.find`` in linear time (the regex backtracks: quadratic
  on hostile text);
- a completion without one is scored whole (ReasoningGYM would give it 0: that is the one
  difference, and it only matters for text that never used the tag).

There is no format reward (the SAPO paper's runs had none).
"""

from __future__ import annotations

__all__ = ["ANSWER_CLOSE", "ANSWER_OPEN", "extract_answer", "scored_text"]

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


def extract_answer(text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` block, None if there is none."""
    last: tuple[int, int] | None = None
    pos = 0
    while True:
        start = text.find(ANSWER_OPEN, pos)
        if start < 0:
            break
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break
        last = (start + len(ANSWER_OPEN), end)
        pos = end + len(ANSWER_CLOSE)
    return None if last is None else text[last[0]:last[1]].strip()


def scored_text(completion: str) -> str:
    """What a verifier scores: the last answer block if there is one, else the completion."""
    answer = extract_answer(completion)
    return completion if answer is None else answer
