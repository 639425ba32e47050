"""Signed state commits in the DHT, and the choice of the canonical state.

Channel: after attempt ``k`` every participant seals ``OuterStepCommit(group, step=k,
state_hash, peers)`` with its node identity (``protocol.seal``) and stores the bytes in the
hivemind DHT under ``<gid>/commit/<k>`` (subkey = its peer id) and under ``<gid>/head`` (its
latest commit; joiners and stragglers read it). Readers verify each value with
``protocol.open_envelope`` and drop values whose signer is not the subkey's peer id, whose
group or step differ, or that do not decode (counted in ``invalid``). The same bytes can be
mirrored on gossip unchanged.

Canonical state: the hash held by most commits; ties go to the lexicographically larger hash
(any deterministic rule works: all peers read the same commits once they have propagated).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from protocol import Identity, OuterStepCommit, ProtocolError, open_envelope, seal

__all__ = ["CommitBook", "canonical", "majority"]

logger = logging.getLogger(__name__)


def majority(hashes: dict[str, str]) -> tuple[str, list[str]]:
    """(hash, holders sorted) of the hash most peers hold (ties: the larger hash); not empty."""
    counts = Counter(hashes.values())
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return best, sorted(p for p, h in hashes.items() if h == best)


def canonical(commits: dict[str, OuterStepCommit]) -> tuple[str, list[str]] | None:
    """(hash, holders sorted) of the majority state among ``commits``, None if empty."""
    if not commits:
        return None
    return majority({p: c.state_hash for p, c in commits.items()})


@dataclass
class CommitBook:
    """Seal, store and read commits for one group."""

    identity: Identity
    group: str
    gid: str
    swarm_id: str
    invalid: int = 0

    def key(self, step: int) -> str:
        return f"{self.gid}/commit/{step}"

    @property
    def head_key(self) -> str:
        return f"{self.gid}/head"

    def seal(self, step: int, state_hash: str, peers: int) -> bytes:
        msg = OuterStepCommit(group=self.group, step=step, state_hash=state_hash, peers=peers)
        return seal(self.identity, msg, swarm_id=self.swarm_id)

    def verify(self, raw: dict[str, bytes], *, step: int | None) -> dict[str, OuterStepCommit]:
        """Peer id -> commit for the values that verify; others counted in ``invalid``."""
        out: dict[str, OuterStepCommit] = {}
        for peer, data in raw.items():
            try:
                env = open_envelope(data, swarm_id=self.swarm_id)
            except ProtocolError as e:
                self.invalid += 1
                logger.warning("invalid commit from %s: %s", peer, e)
                continue
            msg = env.message
            if not isinstance(msg, OuterStepCommit) or env.sender_peer_id != peer \
                    or msg.group != self.group or (step is not None and msg.step != step):
                self.invalid += 1
                logger.warning("commit under subkey %s does not match (signer %s)", peer,
                               env.sender_peer_id)
                continue
            out[peer] = msg
        return out
