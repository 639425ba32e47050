"""The application messages carried inside a signed envelope.

Every field is checked on decode (``protocol.schema``). Fields with defaults are optional on
the wire; a receiver ignores fields it does not know. To add a field, give it a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.schema import Message, Spec, spec

U63 = 2**63 - 1
MAX_TEXT = 16 * 1024  # characters in one prompt or completion
MAX_BATCH_ROLLOUTS = 64  # rollouts in one RolloutBatch
ADDR = Spec(kind=str, max_len=256, min_len=1)  # one multiaddr


@dataclass(frozen=True, kw_only=True)
class TaskSpec(Message):
    """Identifies a task so that any peer can regenerate its question and verifier."""

    TYPE = "task_spec"
    family: str = spec(str, max_len=64, min_len=1)
    config: dict[str, Any] = spec("scalar_map", max_len=32, default=None)  # type: ignore[assignment]
    seed: int = spec(int, lo=0, hi=U63)
    index: int = spec(int, lo=0, hi=U63)

    def __post_init__(self) -> None:
        if self.config is None:
            object.__setattr__(self, "config", {})


@dataclass(frozen=True, kw_only=True)
class Rollout(Message):
    """One task group: a prompt and the completions a peer sampled for it."""

    TYPE = "rollout"
    task: TaskSpec = spec(TaskSpec)
    prompt: str = spec(str, max_len=MAX_TEXT)
    completions: tuple[str, ...] = spec(list, max_len=64, min_len=1, item=Spec(kind=str, max_len=MAX_TEXT))
    rewards: tuple[float, ...] = spec(list, max_len=64, item=Spec(kind=float, lo=-1e6, hi=1e6), default=())
    """The sender's own rewards: a hint only. Receivers re-score from ``task``."""
    token_counts: tuple[int, ...] = spec(list, max_len=64, item=Spec(kind=int, lo=0, hi=1 << 20), default=())

    def __post_init__(self) -> None:
        n = len(self.completions)
        if self.rewards and len(self.rewards) != n:
            raise ValueError(f"{len(self.rewards)} rewards for {n} completions")
        if self.token_counts and len(self.token_counts) != n:
            raise ValueError(f"{len(self.token_counts)} token counts for {n} completions")


@dataclass(frozen=True, kw_only=True)
class RolloutBatch(Message):
    """Several rollouts of one round, published together (never one rollout per message)."""

    TYPE = "rollouts"
    model: str = spec(str, max_len=128, min_len=1)
    """Model fingerprint of the policy that sampled the completions."""
    round: int = spec(int, lo=0, hi=U63)
    rollouts: tuple[Rollout, ...] = spec(list, max_len=MAX_BATCH_ROLLOUTS, min_len=1,
                                         item=Spec(kind=Rollout))


@dataclass(frozen=True, kw_only=True)
class PeerAnnouncement(Message):
    """Who a peer is and how to reach it; published periodically on the announcements topic."""

    TYPE = "announce"
    peer_id: str = spec(str, max_len=128, min_len=1)
    addrs: tuple[str, ...] = spec(list, max_len=16, item=ADDR)
    model: str = spec(str, max_len=128, default="")
    capabilities: tuple[str, ...] = spec(list, max_len=32, item=Spec(kind=str, max_len=64), default=())
    version: str = spec(str, max_len=32, default="")
    collective_addrs: tuple[str, ...] = spec(list, max_len=16, item=ADDR, default=())
    """Multiaddrs of the peer's hivemind p2pd, for DiLoCo outer steps."""
    bootstrap_only: bool = spec(bool, default=False)
    interval_s: float = spec(float, lo=0, hi=86_400, default=0.0)
    """Seconds until this peer's next announcement at the latest (its period grows with the
    swarm; receivers keep the entry that much longer: swarm/peers.py). 0: not stated."""


CLOCK_CODE_MAX = 2047
"""A clock code's largest value (collectives/schedule.py: the rungs of a period proposal and
of the period in force)."""


@dataclass(frozen=True, kw_only=True)
class OuterVersion(Message):
    """"At version ``step`` the outer state of ``group`` is ``state_hash``, made from
    ``parent`` by averaging the contributions of ``members``." Stored in the DHT under the
    version's key and the signer's head (collectives/consistency.py); never gossiped."""

    TYPE = "outer_version"
    group: str = spec(str, max_len=128, min_len=1)
    step: int = spec(int, lo=0, hi=U63)
    state_hash: str = spec(str, max_len=128, min_len=1)
    parent: str = spec(str, max_len=128, min_len=1)
    members: tuple[str, ...] = spec(list, max_len=64, item=Spec(kind=str, max_len=128))
    """Sorted peer ids whose contributions made this version."""
    period: int = spec(int, lo=1, hi=CLOCK_CODE_MAX)
    """The meeting period the group that made it agreed on (a clock code): a peer that
    adopts this version without that group goes to its meetings."""


@dataclass(frozen=True, kw_only=True)
class OuterVote(Message):
    """A member's result of one attempt from version ``step - 1`` at ``parent``: the new
    hash if it applied the group's average, ``parent`` if it did not. ``members``: the
    voters it counts (the peers its reducer accepted, and itself)."""

    TYPE = "outer_vote"
    group: str = spec(str, max_len=128, min_len=1)
    step: int = spec(int, lo=1, hi=U63)
    state_hash: str = spec(str, max_len=128, min_len=1)
    parent: str = spec(str, max_len=128, min_len=1)
    members: tuple[str, ...] = spec(list, max_len=64, item=Spec(kind=str, max_len=128))


@dataclass(frozen=True, kw_only=True)
class OuterJoin(Message):
    """"I hold ``state_hash`` at version ``step`` and want to average at this meeting":
    grouping only (a peer groups with those that claim its own hash)."""

    TYPE = "outer_join"
    group: str = spec(str, max_len=128, min_len=1)
    step: int = spec(int, lo=0, hi=U63)
    state_hash: str = spec(str, max_len=128, min_len=1)
    clock: int = spec(int, lo=1, hi=CLOCK_CODE_MAX)
    """The sender's period proposal and the period in force (a clock code)."""
    finished: bool = spec(bool, default=False)
    """Its run ended: it comes for one last step, asks for no period."""
    pending: bool = spec(bool, default=False)
    """Finished with rounds that no average counted yet."""


@dataclass(frozen=True, kw_only=True)
class OuterLeft(Message):
    """"I left at version ``step`` before my last step": peers waiting for that step stop
    waiting (it only ever shortens a bounded wait)."""

    TYPE = "outer_left"
    group: str = spec(str, max_len=128, min_len=1)
    step: int = spec(int, lo=0, hi=U63)


OuterRecord = OuterVersion | OuterVote | OuterJoin | OuterLeft
"""The signed records of the outer step, stored in the DHT (never gossiped)."""

GOSSIPED: tuple[type[Message], ...] = (RolloutBatch, PeerAnnouncement)
"""The message types that travel on gossip topics (swarm/topics.py)."""

MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (RolloutBatch, PeerAnnouncement, OuterVersion, OuterVote,
                              OuterJoin, OuterLeft)
}
