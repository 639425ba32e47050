"""Signed outer-step records in the DHT, and which states a node accepts: lineage, not votes.

Threat model. Identities are free: anyone can make any number of keys, store any signed
record in the DHT under its own key (the subkey is its peer id; a record under another
subkey is rejected and counted), read every record, claim any state hash, and serve any
bytes. It cannot forge another key's signature or find bytes for a hash it did not compute.
So nothing here counts keys: a record is only as good as the history of the key that signed
it *as seen by the reader*.

Records (protocol/messages.py, one type per meaning, sealed with the node identity via
``protocol.seal``):

- ``<gid>/join/<v>[/<meeting>]``  ``OuterJoin``: "I hold state ``state_hash`` at version v
  and want to average now (at this meeting of the clock, schedule.py)", with the sender's
  clock code (its period proposal and the period in force) and whether its run finished.
  Grouping only: a node groups with peers that claim *its own* hash. Without a meeting: a
  step now (``outer_step``) or a node's last step (``finish``, finish.py).
- ``<gid>/left``  ``OuterLeft``: "I left at version v before my last step": peers waiting
  for my last step stop waiting (only ever shortens a bounded wait).
- ``<gid>/vote/<v>/<nonce>``  ``OuterVote``: a member's result of one attempt from version v
  (the group's nonce names the attempt): the new hash if it applied the average, its
  unchanged hash if it failed. Members decide together.
- ``<gid>/commit/<v>`` and ``<gid>/head`` (the signer's latest)  ``OuterVersion``: "version v
  is ``state_hash``, made from ``parent`` by the contributions of ``members``", with the
  meeting period the group agreed on (``schedule.Clock.agreed_code``), which a peer that
  adopts the version takes as its own until its next meeting.

A record of another type under a key, or under another signer's subkey, is rejected and
counted (``CommitBook.invalid``).

Acceptance rules (``Lineage`` = the hash and version we hold, and its ``witnesses``: the
peers we saw contribute, through our own reducer, in the step that produced it):

1. **We took part.** After an attempt we contributed to, the members' votes are counted
   among the peers our reducer accepted a contribution from (and us); the hash with most
   such votes wins (ties: an advanced state, then the larger hash). A failed member adopts
   the winners' state (fetched, hash-checked); a member that applied but lost the vote rolls
   back. Fresh keys that contributed nothing to our shard have no vote.
2. **It extends ours.** A version commit for v+1 with ``parent`` = our hash is accepted
   when a strict majority of our witnesses (ourselves excluded) signed that hash; the new
   witnesses are the members every one of those signers lists (vouched for by all of them).
   Chains are walked one version at a time; only the end state is fetched.
   **Forks.** Two groups at the same version that met in different windows both advance:
   siblings with one parent. A sibling signed by a strict majority of the *parent's*
   witnesses wins (at most one can: each key signs one commit per version); the loser
   rebases onto it relative to the parent, so its own branch's update and later work stay in
   its local delta and join the next average.
3. **Joiners.** A node with no lineage beyond its genesis (version 0: the base model or a
   restart; it has no witnesses) accepts a head only if its hash is the operator-pinned
   ``anchor``, or it is signed by peers the node's ``trust`` predicate accepts (peers it
   has received valid rollouts from for a while, or that its operator pinned:
   ``[outer.catchup] trusted_peers``); the most trusted signers win. With the
   default (trust nobody, no anchor) a joiner keeps training on its own state and groups
   only with peers at its own hash: it averages with other joiners, never with an
   established group (documented limitation, not an error).

Anything else that claims a newer version — e.g. a fresh key's head at step 10**6 with the
hash of an all-zero state — is never fetched and is counted in ``rejected`` by reason:
"no_quorum" (extends our hash, too few of our witnesses signed), "unknown_parent" (does not
extend our lineage), "untrusted" (joiner: no anchor, no trusted signer).

What this bounds and what it does not: a takeover needs a strict majority of the peers that
actually contributed to the reader's last step; Sybils admitted into a group (they can claim
the group's hash and contribute bounded, robustly aggregated deltas) can become witnesses,
so a group whose contributors are mostly one adversary's keys is not protected — wire
``trust`` to restrict who can enter a joiner's lineage. A hostile leader can refuse or stall
a group: a liveness attack only (no state changes without the rules above), bounded by the
leader order and local blame of leader.py.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from collectives.schedule import FINISHED, PENDING, Clock
from protocol import (
    Identity,
    OuterJoin,
    OuterLeft,
    OuterRecord,
    OuterVersion,
    OuterVote,
    ProtocolError,
    open_envelope,
    seal,
)

__all__ = ["CommitBook", "Lineage", "Candidate", "decide_votes", "settled_vote", "extension",
           "sibling", "trusted_head", "head_rejections", "join_code"]

logger = logging.getLogger(__name__)

R = TypeVar("R", OuterVersion, OuterVote, OuterJoin, OuterLeft)


@dataclass(frozen=True)
class Lineage:
    """The state a node holds and the peers whose word can move it forward."""

    hash: str
    version: int
    witnesses: frozenset[str] = frozenset()
    parent: str = ""
    """Hash this version was made from ("" for genesis or when unknown)."""
    parent_witnesses: frozenset[str] = frozenset()
    """Witnesses of the parent: they settle forks between siblings."""

    @property
    def is_genesis(self) -> bool:
        return self.version == 0 and not self.witnesses


@dataclass(frozen=True)
class Candidate:
    """A state to adopt: its hash, version, members, and who holds it (to fetch from)."""

    hash: str
    version: int
    members: tuple[str, ...]
    holders: tuple[str, ...]


def _quorum(signers: set[str], witnesses: frozenset[str], me: str) -> bool:
    base = witnesses - {me}
    return bool(base) and 2 * len(signers & base) > len(base)


def _supported(commits: dict[str, OuterVersion], *, version: int, parent: str,
               witnesses: frozenset[str], me: str, exclude: str,
               children: dict[str, OuterVersion] | None = None) -> Candidate | None:
    groups: dict[str, set[str]] = {}
    for peer, c in commits.items():
        if c.step == version and c.parent == parent and c.state_hash not in (parent, exclude):
            groups.setdefault(c.state_hash, set()).add(peer)
    for h, signers in sorted(groups.items()):
        vouchers = {p for p, c in (children or {}).items()
                    if c.step == version + 1 and c.parent == h}
        if _quorum(signers | vouchers, witnesses, me):
            vouched = [set(commits[p].members) for p in sorted(signers & witnesses)]
            if not vouched:  # nobody we know says who made it
                continue
            members = set.intersection(*vouched)
            return Candidate(hash=h, version=version, members=tuple(sorted(members)),
                             holders=tuple(sorted(signers)))
    return None


def extension(commits: dict[str, OuterVersion], lineage: Lineage, me: str,
              children: dict[str, OuterVersion] | None = None) -> Candidate | None:
    """The version commit for ``lineage.version + 1`` that a quorum of our witnesses signed
    (rule 2), else None. At most one can have a strict majority. ``children``: the commits
    for the version after it, if read: a witness that signed a child of a commit (a version
    made from its hash) vouches for it as if it had signed it (it held that state and
    stepped from it). Without them, a version whose makers partly failed to sign it (a
    member that rolled back, died before its commit, or whose DHT store failed) was refused
    for good by every peer still at its parent, though the group went on from it."""
    return _supported(commits, version=lineage.version + 1, parent=lineage.hash,
                      witnesses=lineage.witnesses, me=me, exclude=lineage.hash,
                      children=children)


def sibling(commits: dict[str, OuterVersion], lineage: Lineage,
            me: str) -> Candidate | None:
    """A fork of our version (same parent, other hash) that a strict majority of the
    parent's witnesses signed, else None (rule 2, forks)."""
    if not lineage.parent:
        return None
    return _supported(commits, version=lineage.version, parent=lineage.parent,
                      witnesses=lineage.parent_witnesses, me=me, exclude=lineage.hash)


def decide_votes(votes: dict[str, OuterVote], *, mine: str, parent: str,
                 voters: set[str], me: str) -> str:
    """The hash a group's attempt from ``parent`` ends at (rule 1): most votes among
    ``voters`` (the peers our reducer accepted, and us with ``mine``); ties go to an advanced
    state (hash != parent), then the larger hash."""
    return _ranked(_tally(votes, mine=mine, parent=parent, voters=voters, me=me), parent)[0][0]


def settled_vote(votes: dict[str, OuterVote], *, mine: str, parent: str,
                 voters: set[str], me: str) -> str | None:
    """``decide_votes``' hash if no votes still missing from ``voters`` could change it,
    however they go, else None. A member may stop waiting then: it decides what it would
    decide with every vote in, so members that stop at different times still agree (a voter
    that died after its contribution, whose vote never comes, costs nobody the wait until
    the deadline). The worst case for the winner: every missing vote goes to one challenger,
    a hash already counted or one not seen yet (which could win a tie)."""
    tally = _tally(votes, mine=mine, parent=parent, voters=voters, me=me)
    missing = len(voters - set(votes) - {me})
    ranked = _ranked(tally, parent)
    (winner, count), rest = ranked[0], ranked[1:]
    if missing and count <= missing:  # an unseen hash with every missing vote
        return None
    key = _rank_key(parent)
    if any(key((h, c + missing)) > key((winner, count)) for h, c in rest):
        return None
    return winner


def _tally(votes: dict[str, OuterVote], *, mine: str, parent: str, voters: set[str],
           me: str) -> Counter[str]:
    tally: Counter[str] = Counter({mine: 1})
    for peer, c in votes.items():
        if peer != me and peer in voters and c.parent == parent:
            tally[c.state_hash] += 1
    return tally


def _ranked(tally: Counter[str], parent: str) -> list[tuple[str, int]]:
    return sorted(tally.items(), key=_rank_key(parent), reverse=True)


def _rank_key(parent: str) -> Callable[[tuple[str, int]], tuple[int, bool, str]]:
    """Most votes, then an advanced state (hash != parent), then the larger hash."""
    return lambda kv: (kv[1], kv[0] != parent, kv[0])


def trusted_head(heads: dict[str, OuterVersion], *, anchor: str,
                 trust: Callable[[str], bool], mine: str) -> Candidate | None:
    """A joiner's choice among version heads (rule 3): the anchor if someone holds it,
    else the (hash, version, members) signed by the most trusted peers (ties: the higher
    version, then the larger hash); None if no head qualifies."""
    versions = {p: c for p, c in heads.items() if c.state_hash != mine}
    if anchor:
        at = [c for c in versions.values() if c.state_hash == anchor]
        if at:
            c = max(at, key=lambda c: (c.step, tuple(c.members)))
            return Candidate(hash=anchor, version=c.step, members=tuple(c.members),
                             holders=tuple(sorted(p for p, x in versions.items()
                                                  if x.state_hash == anchor)))
    groups: dict[tuple[str, int], list[str]] = {}
    for peer, c in versions.items():
        if _safe_trust(trust, peer):
            groups.setdefault((c.state_hash, c.step), []).append(peer)
    if not groups:
        return None
    (h, step), signers = max(groups.items(), key=lambda kv: (len(kv[1]), kv[0][1], kv[0][0]))
    members = set.intersection(*(set(versions[p].members) for p in signers))
    return Candidate(hash=h, version=step, members=tuple(sorted(members)),
                     holders=tuple(sorted(signers)))


def _safe_trust(trust: Callable[[str], bool], peer: str) -> bool:
    try:
        return bool(trust(peer))
    except Exception as e:  # noqa: BLE001 - the caller's callback must not break us
        logger.warning("trust(%s) failed: %s", peer, e)
        return False


def head_rejections(heads: dict[str, OuterVersion], lineage: Lineage, *,
                    joiner: bool) -> Counter[str]:
    """Reasons for refusing the heads that claim a version newer than ``lineage``."""
    out: Counter[str] = Counter()
    for c in heads.values():
        if c.step <= lineage.version or c.state_hash == lineage.hash:
            continue
        if joiner:
            out["untrusted"] += 1
        elif c.parent == lineage.hash and c.step == lineage.version + 1:
            out["no_quorum"] += 1
        else:
            out["unknown_parent"] += 1
    return out


@dataclass
class CommitBook:
    """Seal, store and read the records of one group."""

    identity: Identity
    group: str
    gid: str
    swarm_id: str
    invalid: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    """Reason -> commits claiming a newer version that this node refused (never fetched)."""

    def key(self, step: int) -> str:
        """Key of the version commits for version ``step``."""
        return f"{self.gid}/commit/{step}"

    def join_key(self, version: int, *, meet: float | None = None) -> str:
        """Join records for ``version``; per meeting (its DHT time) on the clock."""
        if meet is None:
            return f"{self.gid}/join/{version}"
        return f"{self.gid}/join/{version}/{round(meet * 10)}"

    def vote_key(self, version: int, attempt: str) -> str:
        """``attempt``: the group's nonce (chosen by its leader at the freeze): the votes of
        an earlier attempt from the same version (a failed one: its members voted for the
        parent) must not be read as this one's (seen: a member that read two such stale
        votes before the new ones were stored rolled back a step the group applied)."""
        return f"{self.gid}/vote/{version}/{attempt}"

    @property
    def head_key(self) -> str:
        return f"{self.gid}/head"

    def version(self, step: int, state_hash: str, *, parent: str,
                members: tuple[str, ...] | list[str], period: int) -> bytes:
        """Our sealed ``OuterVersion``."""
        return self._seal(OuterVersion(group=self.group, step=step, state_hash=state_hash,
                                       parent=parent, members=tuple(members), period=period))

    def vote(self, step: int, state_hash: str, *, parent: str,
             members: tuple[str, ...] | list[str]) -> bytes:
        """Our sealed ``OuterVote`` for the attempt that leads to version ``step``."""
        return self._seal(OuterVote(group=self.group, step=step, state_hash=state_hash,
                                    parent=parent, members=tuple(members)))

    def join(self, step: int, state_hash: str, code: int) -> bytes:
        """Our sealed ``OuterJoin``; ``code``: our clock's (schedule.py ``Clock.code``)."""
        return self._seal(OuterJoin(group=self.group, step=step, state_hash=state_hash,
                                    clock=code % FINISHED, finished=Clock.finished(code),
                                    pending=Clock.pending(code)))

    def left(self, step: int) -> bytes:
        """Our sealed ``OuterLeft``."""
        return self._seal(OuterLeft(group=self.group, step=step))

    def _seal(self, msg: OuterRecord) -> bytes:
        return seal(self.identity, msg, swarm_id=self.swarm_id)

    def verify(self, raw: dict[str, bytes], kind: type[R], *, step: int | None) -> dict[str, R]:
        """Peer id -> record of type ``kind`` (at ``step`` unless None), for the values that
        verify and are that signer's own; others are counted in ``invalid``."""
        out: dict[str, R] = {}
        for peer, data in raw.items():
            try:
                env = open_envelope(data, swarm_id=self.swarm_id)
            except ProtocolError as e:
                self.invalid += 1
                logger.warning("invalid outer record from %s: %s", peer, e)
                continue
            msg = env.message
            if not isinstance(msg, kind) or env.sender_peer_id != peer \
                    or msg.group != self.group or (step is not None and msg.step != step):
                self.invalid += 1
                logger.warning("outer record under subkey %s does not match (a %s signed by "
                               "%s)", peer, msg.TYPE, env.sender_peer_id)
                continue
            out[peer] = msg
        return out


def join_code(record: OuterJoin) -> int:
    """The clock code (schedule.py) a join record carries, flags included."""
    return record.clock + (FINISHED if record.finished else 0) \
        + (PENDING if record.finished and record.pending else 0)
