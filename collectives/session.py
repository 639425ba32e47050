"""One outer-step attempt as the transport's asyncio thread sees it.

Opened by ``AllReduce.open_session`` at each attempt; read and written on the asyncio thread
only (the outer thread passes its deadlines in as arguments and reads ``AllReduce.report``).
The group it forms (``group``), our shard of the exchange (``ShardReducer``) and the member's
verdicts on the shards it received hang off it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from collectives.group import GroupInfo

if TYPE_CHECKING:
    from collectives.reducer import ShardReducer

__all__ = ["Session", "Traffic"]


@dataclass
class Traffic:
    """Bytes of one attempt's exchange, and where its time went: phase -> loop.time() (the
    last event of each: where the exchange's tail goes, in the step's record)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    gather_sent: int = 0
    """Of ``bytes_sent``, our reducer's means to the other members (the all-gather; the
    rest is our contribution to their reducers, the reduce-scatter)."""
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        self.marks[phase] = asyncio.get_running_loop().time()


@dataclass
class Session:
    step: int
    state_hash: str
    numel: int
    weight: float
    deadline: float
    """loop.time() by which everything of this attempt is over."""
    group: asyncio.Future[GroupInfo]
    """Set at the leader's freeze (``Matchmaker``); failed when no group formed."""
    joins: set[str] = field(default_factory=set)
    """As leader: the peers whose JOIN came before the freeze."""
    connected: set[str] = field(default_factory=set)
    """The peers our p2pd was connected to when the session opened (the reducer's watch)."""
    traffic: Traffic = field(default_factory=Traffic)
    shard: ShardReducer | None = None
    """Our reducer's shard, set up by whichever comes first: our exchange or a member's."""
    suspects: set[str] = field(default_factory=set)
    """Members whose shard or contribution never came: their votes are not awaited."""
    bad_shards: dict[str, str] = field(default_factory=dict)
    """Reducer -> why the shard it returned was rejected ("non_finite", "norm")."""

    def remaining(self) -> float:
        return max(0.0, self.deadline - asyncio.get_running_loop().time())
