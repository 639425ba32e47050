"""Signed outer-step records and which states a node accepts (consistency.py): pure."""

from __future__ import annotations

import itertools
import random

import pytest

from collectives.consistency import (Candidate, CommitBook, Lineage, decide_votes, extension,
                                     head_rejections, join_code, settled_vote, sibling,
                                     trusted_head)
from collectives.schedule import FINISHED, PENDING, Clock
from protocol import Identity, OuterJoin, OuterLeft, OuterVersion, OuterVote


def test_records_verify_signer_group_type_and_step() -> None:
    ids = [Identity.generate() for _ in range(4)]
    books = [CommitBook(identity=i, group="g", gid="x", swarm_id="s") for i in ids]
    raw = {i.peer_id: b.version(3, "aa", parent="p0", members=["m1", "m2"], period=33)
           for i, b in zip(ids, books)}
    reader = CommitBook(identity=ids[0], group="g", gid="x", swarm_id="s")
    got = reader.verify(raw, OuterVersion, step=3)
    assert len(got) == 4 and got[ids[1].peer_id].members == ("m1", "m2")
    assert got[ids[1].peer_id].parent == "p0" and got[ids[1].peer_id].period == 33
    forged = {ids[1].peer_id: books[0].version(3, "cc", parent="p0", members=[], period=1)}
    other_group = {ids[2].peer_id: CommitBook(identity=ids[2], group="h", gid="x",
                                              swarm_id="s").version(3, "aa", parent="p0",
                                                                    members=[], period=1)}
    assert reader.verify({**forged, **other_group, ids[3].peer_id: b"junk"}, OuterVersion,
                         step=3) == {}
    assert reader.verify(raw, OuterVersion, step=4) == {}
    # another type under the key is not read as this one (a vote is no version commit)
    assert reader.verify(raw, OuterVote, step=3) == {}
    assert reader.invalid == 11


def test_join_and_left_records_carry_what_they_say() -> None:
    me = Identity.generate()
    book = CommitBook(identity=me, group="g", gid="x", swarm_id="s")
    for code in (1, 1 + 3 + 32 * 2, 1 + FINISHED, 33 + FINISHED + PENDING):
        got = book.verify({me.peer_id: book.join(7, "aa", code)}, OuterJoin, step=7)
        rec = got[me.peer_id]
        assert join_code(rec) == code and rec.state_hash == "aa"
        assert rec.finished == Clock.finished(code) and rec.pending == Clock.pending(code)
    left = {me.peer_id: book.left(9)}
    assert set(book.verify(left, OuterLeft, step=None)) == {me.peer_id}
    assert book.verify(left, OuterJoin, step=None) == {}  # "left" is no join record
    assert book.invalid == 1


def _c(step: int, h: str, *, parent: str = "p", members: tuple[str, ...] = ()) -> OuterVersion:
    return OuterVersion(group="g", step=step, state_hash=h, parent=parent, members=members,
                        period=1)


def _v(step: int, h: str, *, parent: str) -> OuterVote:
    return OuterVote(group="g", step=step, state_hash=h, parent=parent, members=())


def test_lineage_extension_needs_a_quorum_of_our_witnesses() -> None:
    lin = Lineage(hash="h1", version=1, witnesses=frozenset({"me", "a", "b", "c"}))
    nxt = _c(2, "h2", parent="h1", members=("a", "b", "me"))
    # fresh keys (not witnesses) never make a quorum, however many
    assert extension({f"sybil{i}": nxt for i in range(20)}, lin, "me") is None
    assert extension({"a": nxt}, lin, "me") is None  # 1 of 3 witnesses
    got = extension({"a": nxt, "b": nxt, "x": nxt}, lin, "me")
    assert got == Candidate(hash="h2", version=2, members=("a", "b", "me"),
                            holders=("a", "b", "x"))
    # wrong parent or version: not an extension even with every witness
    wrong = _c(2, "h2", parent="other", members=("a",))
    assert extension({"a": wrong, "b": wrong, "c": wrong}, lin, "me") is None
    far = _c(10**6, "zero", parent="h1")
    assert extension({"a": far, "b": far, "c": far}, lin, "me") is None
    # a group of two: the other witness alone is the quorum; genesis has none
    pair = Lineage(hash="h1", version=1, witnesses=frozenset({"me", "a"}))
    assert extension({"a": nxt}, pair, "me") is not None
    assert extension({"a": _c(1, "h2", parent="g0")}, Lineage("g0", 0), "me") is None



def test_witnesses_that_stepped_from_a_version_vouch_for_it() -> None:
    """Churn trial 15 of churn_clock_100_votes.json: version 42 was made by j10, j11 and j12
    from version 41 (witnesses j10, j11, j12, j14), but only j10 and j12 signed it (j11 rolled
    back); all three then made version 43 from it. A joiner at version 41 refused 42 as
    no_quorum at every meeting for the rest of the run."""
    lin = Lineage(hash="h41", version=41, witnesses=frozenset({"j10", "j11", "j12", "j14"}))
    v42 = _c(42, "h42", parent="h41", members=("j10", "j11", "j12"))
    v43 = _c(43, "h43", parent="h42", members=("j10", "j11", "j12"))
    signed = {"j10": v42, "j12": v42}
    assert extension(signed, lin, "me") is None  # 2 of 4
    got = extension(signed, lin, "me", children={"j10": v43, "j11": v43, "j12": v43})
    assert got == Candidate(hash="h42", version=42, members=("j10", "j11", "j12"),
                            holders=("j10", "j12"))
    # a child of another hash, or at another version, vouches for nothing
    other = _c(43, "x43", parent="x42")
    far = _c(44, "h44", parent="h42")
    assert extension(signed, lin, "me", children={"j11": other, "j14": far}) is None
    # fresh keys' children count no more than their commits
    sybils = {f"s{i}": v43 for i in range(20)}
    assert extension(signed, lin, "me", children=sybils) is None
    # children alone, with no signer of the version among our witnesses: nobody we know
    # says who made it, so it is not followed
    assert extension({"s1": v42}, lin, "me",
                     children={"j10": v43, "j11": v43, "j12": v43}) is None

def test_a_fork_is_settled_by_the_parents_witnesses() -> None:
    # we (me, d) made "ours" from "p" while a, b, c made "theirs" from "p" in another window
    mine = Lineage(hash="ours", version=5, witnesses=frozenset({"me", "d"}), parent="p",
                   parent_witnesses=frozenset({"me", "a", "b", "c", "d"}))
    theirs = _c(5, "theirs", parent="p", members=("a", "b", "c"))
    got = sibling({"a": theirs, "b": theirs, "c": theirs, "d": _c(5, "ours", parent="p")},
                  mine, "me")
    assert got is not None and got.hash == "theirs" and got.members == ("a", "b", "c")
    # the other side never switches to the minority fork
    them = Lineage(hash="theirs", version=5, witnesses=frozenset({"a", "b", "c"}), parent="p",
                   parent_witnesses=mine.parent_witnesses)
    assert sibling({"me": _c(5, "ours", parent="p"), "d": _c(5, "ours", parent="p")}, them,
                   "a") is None
    assert sibling({f"s{i}": theirs for i in range(9)}, mine, "me") is None  # fresh keys


def test_votes_count_only_peers_we_saw_contribute() -> None:
    up, down = _v(5, "new", parent="old"), _v(5, "old", parent="old")
    sybils = {f"s{i}": _v(5, "evil", parent="old") for i in range(10)}
    assert decide_votes({**sybils, "a": up}, mine="new", parent="old", voters={"a", "b"},
                        me="me") == "new"
    assert decide_votes({"a": down, "b": down}, mine="new", parent="old", voters={"a", "b"},
                        me="me") == "old"  # we applied, they did not: roll back
    assert decide_votes({"a": up}, mine="old", parent="old", voters={"a"}, me="me") == "new"



def test_a_vote_is_settled_only_when_the_missing_votes_cannot_change_it() -> None:
    up, down = _v(5, "new", parent="old"), _v(5, "old", parent="old")

    def settled(votes: dict, mine: str, voters: set[str]) -> str | None:
        return settled_vote(votes, mine=mine, parent="old", voters=voters, me="me")

    # three survivors applied, the fourth member died before its vote: 3 - 0 > 1 missing
    assert settled({"a": up, "b": up}, "new", {"a", "b", "k"}) == "new"
    # every survivor failed: the rollback is settled the same way
    assert settled({"a": down, "b": down}, "old", {"a", "b", "k"}) == "old"
    # two applied, one failed, the dead one's vote could only tie: ties go to the advanced
    # state (churn trial 24 of churn_clock_25_votes.json waited 7.2 s for it)
    assert settled({"a": up, "b": down}, "new", {"a", "b", "k"}) == "new"
    assert settled({"a": up, "b": up}, "old", {"a", "b", "k"}) == "new"  # we failed
    # two failed, one applied: the missing vote could tie and the tie would go to "new"
    assert settled({"a": down, "b": up}, "old", {"a", "b", "k"}) is None
    # a pair whose other member has not voted: its vote could go either way -> wait
    assert settled({}, "new", {"a"}) is None
    # votes of peers we did not see contribute neither count nor are waited for
    sybils = {f"s{i}": _v(5, "evil", parent="old") for i in range(10)}
    assert settled({**sybils, "a": up}, "new", {"a"}) == "new"
    # whenever settled, it is what every vote in decides, however the missing votes go
    rng = random.Random(0)
    hashes = ["old", "new", "zz", "aa"]
    settled_cases = 0
    for _ in range(3000):
        voters = {f"v{i}" for i in range(rng.randrange(1, 6))}
        mine = rng.choice(hashes[:2])
        cast = {p: _v(5, rng.choice(hashes), parent="old") for p in voters
                if rng.random() < 0.7}
        got = settled(cast, mine, voters)
        settled_cases += got is not None
        late = sorted(voters - set(cast))
        for fill in itertools.product(hashes, repeat=len(late)):
            full = {**cast, **{p: _v(5, h, parent="old")
                               for p, h in zip(late, fill)}}
            want = decide_votes(full, mine=mine, parent="old", voters=voters, me="me")
            assert got is None or got == want, (cast, mine, voters, fill)
    assert settled_cases > 1000  # the rule does stop early, not only when all voted


def test_joiner_adopts_only_anchored_or_trusted_heads() -> None:
    heads = {"t": _c(4, "good", parent="p", members=("t", "u")),
             "evil": _c(10**6, "zero", parent="x"), "u": _c(4, "good", parent="p")}
    assert trusted_head(heads, anchor="", trust=lambda p: False, mine="g0") is None
    got = trusted_head(heads, anchor="", trust=lambda p: p == "t", mine="g0")
    assert got is not None and (got.hash, got.version, got.holders) == ("good", 4, ("t",))
    got = trusted_head(heads, anchor="zero", trust=lambda p: False, mine="g0")
    assert got is not None and got.hash == "zero" and got.holders == ("evil",)
    boom = trusted_head(heads, anchor="", trust=lambda p: 1 / 0, mine="g0")  # type: ignore
    assert boom is None
    lin = Lineage(hash="h1", version=1, witnesses=frozenset({"me", "a"}))
    reasons = head_rejections({"e": _c(10**6, "zero", parent="x"),
                               "f": _c(2, "h9", parent="h1"), "a": _c(1, "h1")}, lin,
                              joiner=False)
    assert reasons == {"unknown_parent": 1, "no_quorum": 1}
    assert head_rejections({"e": _c(9, "z")}, Lineage("g", 0), joiner=True) == {"untrusted": 1}
