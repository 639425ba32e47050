"""Who leads (collectives/leader.py): an order no fresh key can buy, that moves with the
meeting and the state, and puts peers we saw stall a group last for a bounded time."""

from __future__ import annotations

import string

from collectives.leader import (BLAME_ATTEMPTS, STRANGER_BLAME_ATTEMPTS, Blame, leader_order,
                                yield_lead)

WITNESSES = frozenset({"Qm-honest-a", "Qm-honest-b", "Qm-honest-c"})


def test_a_ground_key_that_sorts_first_does_not_lead_a_group_of_witnesses() -> None:
    """Before: min(peer ids). An id ground to sort before every honest one led every group."""
    ground = "0" * 46  # sorts before any base58 peer id
    holders = {ground, *WITNESSES}
    assert min(holders) == ground
    for meeting in range(50):
        order = leader_order(holders, state_hash="ab" * 32, meeting=str(meeting),
                             witnesses=WITNESSES)
        assert order[-1] == ground and set(order) == holders


def test_the_order_is_the_same_for_everyone_and_moves_with_the_meeting_and_state() -> None:
    holders = list(WITNESSES)
    firsts = set()
    for meeting in range(30):
        order = leader_order(holders, state_hash="cd" * 32, meeting=str(meeting),
                             witnesses=WITNESSES)
        assert order == leader_order(reversed(holders), state_hash="cd" * 32,
                                     meeting=str(meeting), witnesses=WITNESSES)
        firsts.add(order[0])
    assert firsts == set(WITNESSES)  # every witness leads some meetings
    a = leader_order(holders, state_hash="00" * 32, meeting="1", witnesses=WITNESSES)
    others = {tuple(leader_order(holders, state_hash=h * 32, meeting="1", witnesses=WITNESSES))
              for h in ("01", "02", "03", "04", "05", "06")}
    assert len(others | {tuple(a)}) > 1  # a new state hash draws a new order


def test_without_witnesses_every_holder_is_ranked_by_the_draw() -> None:
    """Genesis (no version yet): the draw alone; what a ground key can do there is said in
    leader.py and the README."""
    holders = [f"Qm{c}" for c in string.ascii_letters[:8]]
    orders = {tuple(leader_order(holders, state_hash="ef" * 32, meeting=str(m),
                                 witnesses=frozenset()))[0] for m in range(40)}
    assert len(orders) > 3


def test_a_blamed_peer_ranks_last_for_the_next_attempts_only() -> None:
    blame = Blame()
    holders = set(WITNESSES)
    order = leader_order(holders, state_hash="ab" * 32, meeting="7", witnesses=WITNESSES)
    staller = order[0]
    blame.clear(staller)  # a witness: it took part in a step with us
    blame.blame(staller, "leader_stalled")  # during an attempt
    blame.attempt_ended()
    for _ in range(BLAME_ATTEMPTS):
        again = leader_order(holders, state_hash="ab" * 32, meeting="7", witnesses=WITNESSES,
                             blamed=blame.blamed())
        assert again[-1] == staller and again[0] == order[1]
        blame.attempt_ended()
    assert blame.blamed() == frozenset()
    assert blame.counts == {"leader_stalled": 1}


def test_the_blame_list_is_bounded() -> None:
    blame = Blame(max_peers=4)
    for i in range(10):
        blame.blame(f"fresh-{i}", "exchange_missing")
    assert len(blame.blamed()) == 4


def test_a_peer_blamed_again_is_skipped_longer_and_cleared_when_it_takes_part() -> None:
    blame = Blame()
    blame.clear("p")  # known: it took part in a step with us
    spans = []
    for _ in range(3):
        blame.blame("p", "join_missing")
        n = 0
        while "p" in blame.blamed():
            blame.attempt_ended()
            n += 1
        spans.append(n)
    assert spans == [BLAME_ATTEMPTS + 1, 2 * BLAME_ATTEMPTS + 1, 4 * BLAME_ATTEMPTS + 1]
    blame.blame("p", "join_missing")
    blame.clear("p")  # it contributed to a step with us
    assert blame.blamed() == frozenset()


def test_a_no_show_is_not_waited_for_but_keeps_its_rank() -> None:
    """A holder whose JOIN we waited for in vain: no wait past the freeze next time, but
    the leader order (which every member must compute alike) does not move."""
    blame = Blame()
    holders = set(WITNESSES)
    order = leader_order(holders, state_hash="ab" * 32, meeting="7", witnesses=WITNESSES)
    for peer in holders:  # witnesses: they took part in steps with us
        blame.clear(peer)
    blame.no_show(order[0])
    blame.attempt_ended()
    assert blame.unwaited() == {order[0]} and blame.blamed() == frozenset()
    assert leader_order(holders, state_hash="ab" * 32, meeting="7", witnesses=WITNESSES,
                        blamed=blame.blamed()) == order
    blame.no_show(order[1])
    blame.clear(order[1])  # it JOINed and contributed since
    assert blame.unwaited() == {order[0]}
    for _ in range(BLAME_ATTEMPTS):
        blame.attempt_ended()
    assert blame.unwaited() == frozenset()
    assert blame.counts == {"no_show": 2}


def test_only_a_first_no_show_gets_the_freeze_grace() -> None:
    """A leader that read early gives a no-show the freeze grace once (it may be here now:
    test_lineage); one that is a no-show again gets none (a holder re-storing its record
    that never JOINs cost every meeting the grace), until it took part in a step with us."""
    blame = Blame()
    blame.no_show("staller")
    blame.no_show("slow")
    assert blame.first_no_shows() == {"staller", "slow"}
    blame.attempt_ended()
    blame.no_show("staller")  # at the next meeting too
    blame.clear("slow")  # it JOINed and contributed
    assert blame.first_no_shows() == frozenset() and blame.unwaited() == {"staller"}
    blame.no_show("slow")  # once more, after taking part: a first one again
    blame.blame("staller", "leader_stalled")  # blamed: never waited for at all
    assert blame.first_no_shows() == {"slow"}


def test_a_stranger_is_held_to_its_blame_longer_than_a_peer_that_took_part() -> None:
    """Fresh identities are free: one that never took part in a step with us and failed
    one (JOINed, never reduced) is not admitted again for ``STRANGER_BLAME_ATTEMPTS``."""
    blame = Blame()
    blame.clear("known")
    blame.blame("known", "exchange_missing")
    blame.blame("stranger", "exchange_missing")
    blame.no_show("stranger")  # refused while blamed: not counted twice
    spans = {}
    n = 0
    while blame.blamed():
        blame.attempt_ended()
        n += 1
        for peer in ("known", "stranger"):
            if peer not in blame.blamed():
                spans.setdefault(peer, n)
    assert spans == {"known": BLAME_ATTEMPTS + 1, "stranger": STRANGER_BLAME_ATTEMPTS + 1}
    assert blame.counts == {"exchange_missing": 2}


def test_a_late_peer_that_would_lead_goes_last_and_says_it_gave_up_the_lead() -> None:
    """attempt.py: a late peer JOINs the others' leader; only one that would have led says
    so, and takes the lead back if JOINed (matchmaking.py: both sides waited on each other
    when the others had read its record after all)."""
    order = ["me", "a", "b"]
    assert yield_lead(order, "me", late=False) == (order, False)
    assert yield_lead(order, "me", late=True) == (["a", "b", "me"], True)
    assert yield_lead(["a", "me", "b"], "me", late=True) == (["a", "b", "me"], False)
    assert yield_lead(["me"], "me", late=True) == (["me"], False)
