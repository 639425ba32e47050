"""What ``OuterLoop``'s mixins share: the loop's attributes they read (loop.py creates them).

The mixins (adopt.py, attempt.py, commit.py, finish.py, join.py) each hold one concept of the outer
step; they inherit these annotations instead of repeating them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

import torch

from collectives.allreduce import AllReduce
from collectives.config import OuterConfig
from collectives.consistency import CommitBook, Lineage
from collectives.schedule import Clock
from collectives.state import OuterState
from collectives.transport import Transport

if TYPE_CHECKING:
    from collectives.background import Work

__all__ = ["LoopParts"]


class LoopParts:
    """The attributes of ``OuterLoop`` that more than one of its mixins reads."""

    config: OuterConfig
    peer_id: str
    clock: Clock
    _transport: Transport
    _ar: AllReduce
    _book: CommitBook
    _lock: threading.Lock
    _state: OuterState
    _lineage: Lineage
    _parent_theta: torch.Tensor | None
    _minority_streak: int
    _params: list[torch.nn.Parameter]
    _rounds_pending: int
    _last_group: frozenset[str]
    _work: Work | None
    _now: Callable[[], float]
    _rebase: Callable[..., None]
    _safe_discover: Callable[[], list[str]]
    _snapshot: Callable[[], torch.Tensor]
    _mark: Callable[[dict[str, Any], str], None]
