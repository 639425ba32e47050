"""One attempt's group, as its leader froze it: who, in which order, under which nonce.

Frozen once the leader answers (``Matchmaker.form_group``); every stream of the attempt's
exchange carries ``digest`` so a stream of another attempt, or of another group at the same
version, is refused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from collectives.codec import chunk_bounds
from collectives.reduce import shard_bounds

__all__ = ["GroupInfo", "members_digest"]


def members_digest(members: tuple[str, ...] | list[str], nonce: str = "") -> str:
    return hashlib.sha256("\n".join([nonce, *members]).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class GroupInfo:
    """``members``: sorted peer ids; ``nonce``: chosen by the leader at its freeze."""

    step: int
    members: tuple[str, ...]
    nonce: str

    def __post_init__(self) -> None:
        if list(self.members) != sorted(set(self.members)):
            raise ValueError("a group's members are distinct and sorted")

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def digest(self) -> str:
        return members_digest(self.members, self.nonce)

    def shards(self, numel: int) -> list[tuple[int, int]]:
        """Member i reduces ``[lo, hi)`` of a flat vector of ``numel`` values."""
        return shard_bounds(numel, len(self.members))

    def wire_chunks(self, numel: int) -> list[tuple[int, int]]:
        """Every chunk a codec encodes in this group's exchange of a ``numel`` vector: each
        shard's chunks (``codec.chunk_bounds``), as global [a, b) ranges."""
        return [(lo + a, lo + b) for lo, hi in self.shards(numel)
                for a, b in chunk_bounds(hi - lo) if b > a]
