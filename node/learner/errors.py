"""Errors of the learner.

::

    LearnerError
     ├── PolicyError        the model or tokenizer cannot be loaded
     │    ├── ModelDoesNotFit   its training step's memory estimate exceeds the device's
     │    │                     available memory (the message says what would fit)
     │    └── EmbeddedWeightsMismatch   the embedded model's weights are not the pinned bytes
     │                                  (the message names the file and the expected sha256)
     ├── EngineError        unknown inference backend, bad sampling request
     ├── TaskError          a TaskSpec cannot be regenerated (unknown family, bad config,
     │                      prompt mismatch); received rollouts raising it are rejected
     └── CheckpointError    no readable checkpoint (message names the file)
"""

from __future__ import annotations

__all__ = ["CheckpointError", "EmbeddedWeightsMismatch", "EngineError", "LearnerError",
           "ModelDoesNotFit", "PolicyError", "TaskError"]


class LearnerError(Exception):
    """Base of every learner error."""


class PolicyError(LearnerError):
    """The model or tokenizer cannot be loaded."""


class ModelDoesNotFit(PolicyError):
    """The model's training step would not fit the device's memory (``node.learner.fit``);
    raised before any weights are loaded. The message is one line: the estimate, the memory
    available and the settings that would fit (``problem``; ``fix``)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        """The estimate against the memory available."""
        self.fix = fix
        """The settings that would make it fit."""


class EmbeddedWeightsMismatch(PolicyError):
    """The embedded model's weights (shipped in the package, or a data dir's copy) are not the
    bytes ``node.learner.tiny_model.EMBEDDED_SHA256`` pins: refused, never loaded."""


class EngineError(LearnerError):
    """Unknown backend or bad sampling request."""


class TaskError(LearnerError):
    """A task spec cannot be turned into a question and verifier."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        """Short label for counters: unknown_family, bad_config, prompt_mismatch, ..."""


class CheckpointError(LearnerError):
    """No usable checkpoint; the message names the file that failed."""
