"""Group formation for one attempt: JOIN to the leader, the leader's freeze.

Each peer stored its join record and read the others' (rendezvous.py); among the peers that
claim its own state hash the attempt names a leader. Members send JOIN(step, hash) to it; at
``freeze_at`` (or later, up to ``latest``, while a peer whose record it saw has not sent its
JOIN yet) the leader freezes the member list, draws a nonce and answers every JOIN with both
(``GroupInfo``). The members' digest covers the nonce, so a stream of an earlier attempt at
the same version is refused.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from collectives._hivemind import P2P, PeerID, open_stream
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.group import GroupInfo
from collectives.session import Session
from collectives.streams import recv_header, send_header

__all__ = ["Matchmaker", "JOIN_TRIES", "LeaderFailed", "SWITCH_GRACE_S"]

logger = logging.getLogger(__name__)

SWITCH_GRACE_S = 0.25
"""A late peer that takes the lead back when JOINed (``form_group(lead_if_joined=)``)
freezes no earlier than this after the first JOIN: the others read at about the same time
and JOIN at once."""
JOIN_TRIES = 3
"""A JOIN whose reply was lost (IncompleteReadError) is asked again: the leader answers an
admitted member's repeated JOIN with the same list."""


class _Unreachable(Exception):
    """No stream to a peer could be opened (dial failure, timeout)."""


class LeaderFailed(StepFailed):
    """A leader that answered did not admit us: ``why`` is "refused" (it said no) or
    "stalled" (no answer by the time its freeze had to be over)."""

    def __init__(self, leader: str, why: str, detail: str = "") -> None:
        super().__init__(f"leader {leader} {why}{': ' + detail if detail else ''}")
        self.leader, self.why = leader, why


class Matchmaker:
    """Both sides of JOIN; stateless apart from its inputs (the session holds the joins)."""

    def __init__(self, p2p: P2P, config: OuterConfig, *, peer_id: str, protocol: str) -> None:
        self.p2p, self.config, self.peer_id, self.protocol = p2p, config, peer_id, protocol

    async def on_join(self, s: Session | None, peer: str, req: dict[str, Any],
                      writer: asyncio.StreamWriter) -> None:
        """A JOIN from ``peer`` (``s``: the session of the step it names, if that is ours):
        answered at our freeze with the group if we admitted it, else "no" at once."""
        if s is None or req.get("hash") != s.state_hash:
            await send_header(writer, {"ok": False, "reason": "closed"})
            return
        if not s.group.done():
            s.joins.add(peer)
        # idempotent: an admitted member whose reply was lost asks again and gets it again
        try:
            group = await asyncio.wait_for(asyncio.shield(s.group), s.remaining())
        except Exception:  # noqa: BLE001 - not the leader, or the deadline passed
            group = None
        if group is None or peer not in group.members:
            await send_header(writer, {"ok": False, "members": [], "nonce": ""})
            return
        await send_header(writer, {"ok": True, "members": list(group.members),
                                   "nonce": group.nonce})

    async def form_group(self, s: Session, order: list[str], *, freeze_at: float,
                         latest: float, reply_by: float,
                         no_wait: frozenset[str] = frozenset(),
                         refuse: frozenset[str] = frozenset(),
                         lead_if_joined: bool = False) -> GroupInfo:
        """This attempt's group (or StepFailed); sets ``s.group`` either way. ``order``: the
        peers whose join records claim our hash, in the order they lead (leader.py; its
        first is the leader). As leader we freeze at ``freeze_at``, or later (up to
        ``latest``) while one of them has not sent its JOIN yet: slow peers (a large model to
        hash) are not dropped for being a second late, unless we blamed them (``no_wait``:
        leader.py); and we admit none of ``refuse`` (peers we blamed: a member whose shard
        never came would fail every group it is admitted to). As member we wait for the leader's
        answer until ``reply_by`` (its freeze is over by then): no answer is a stall
        (``LeaderFailed``), as is a refusal.

        A leader we cannot even open a stream to is dead (issue 17.6: the join record of a
        peer killed in the previous attempt at this version outlives it, and every survivor
        chose it): we fall back to the next peer of ``order``, and when that is us, we lead.
        Everyone who saw the same records falls back the same way. A leader that answered
        (even "no") is not skipped in this attempt: that could split its group; the members
        it stalled rank it last next time (leader.py).

        ``lead_if_joined``: we gave up the lead for being late (``leader.yield_lead``): a
        JOIN that reaches us while we wait for another leader's answer says the others read
        our record after all and wait on us, so we lead (freezing at the earliest
        ``SWITCH_GRACE_S`` after it, for the others' JOINs), instead of both sides waiting
        on each other until they blame one another. A JOIN from a peer of ``refuse`` does
        not count: a holder we blamed could otherwise pull a late peer out of the honest
        group into one with itself."""
        s.group.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        expected = set(order)
        dead: set[str] = set()
        for cand in order:
            if cand == self.peer_id:
                return await self._lead(s, freeze_at, expected - dead - no_wait - refuse,
                                        latest, refuse)
            try:
                if lead_if_joined:
                    joined = await self._join_unless_joined(s, cand, reply_by, refuse)
                    if joined is None:
                        now = asyncio.get_running_loop().time()
                        logger.info("step %d: JOINed while late; leading after all", s.step)
                        return await self._lead(s, max(freeze_at, now + SWITCH_GRACE_S),
                                                expected - dead - no_wait - refuse,
                                                max(latest, now + SWITCH_GRACE_S), refuse)
                    return joined
                return await self._join(s, cand, reply_by)
            except _Unreachable as e:
                dead.add(cand)
                logger.info("step %d: leader %s unreachable (%s); next in order", s.step,
                            cand, e)
        err = StepFailed(f"could not join any leader of {len(dead)}: {sorted(dead)}")
        s.group.set_exception(err)
        raise err

    async def _join_unless_joined(self, s: Session, leader: str, reply_by: float,
                                  refuse: frozenset[str]) -> GroupInfo | None:
        """``_join`` via ``leader``, or None as soon as a peer not in ``refuse`` JOINs us
        (the JOIN is cancelled)."""
        join = asyncio.ensure_future(self._join(s, leader, reply_by))

        async def joined() -> None:
            while not s.joins - refuse:
                await asyncio.sleep(0.01)

        watch = asyncio.ensure_future(joined())
        try:
            await asyncio.wait({join, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if join.done():
            return join.result()
        join.cancel()
        try:
            return await join  # it ended as we cancelled it: that stands
        except asyncio.CancelledError:
            return None

    async def _lead(self, s: Session, freeze_at: float, expected: set[str],
                    latest: float, refuse: frozenset[str]) -> GroupInfo:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, freeze_at - loop.time()))
        while not expected <= s.joins | {self.peer_id} and loop.time() < latest:
            await asyncio.sleep(0.01)  # a JOIN that arrives now is on the critical path
        members = sorted({self.peer_id} | (s.joins - refuse))
        if len(members) > self.config.group.max_peers:
            others = [m for m in members if m != self.peer_id][: self.config.group.max_peers - 1]
            members = sorted([self.peer_id, *others])
        group = GroupInfo(step=s.step, members=tuple(members), nonce=secrets.token_hex(8))
        s.group.set_result(group)
        return group

    async def _join(self, s: Session, leader: str, reply_by: float) -> GroupInfo:
        """JOIN via ``leader``; _Unreachable if no stream to it opens."""
        for attempt in range(JOIN_TRIES):
            try:
                reply = await self._join_once(s, leader, reply_by)
                break
            except _Unreachable:
                raise
            except asyncio.TimeoutError:
                err = LeaderFailed(leader, "stalled", "no answer to our JOIN in time")
                s.group.set_exception(err)
                raise err from None
            except Exception as e:  # noqa: BLE001
                transient = isinstance(e, (asyncio.IncompleteReadError, ConnectionError))
                if transient and attempt + 1 < JOIN_TRIES and s.remaining() > 0.5:
                    logger.info("JOIN via %s lost its reply (%r); asking again", leader, e)
                    continue
                s.group.set_exception(StepFailed(f"join via {leader} failed: {e!r}"))
                raise StepFailed(f"could not join leader {leader}: {e!r}") from e
        group = self._admitted(s, reply)
        if group is None:
            err = LeaderFailed(leader, "refused", f"not admitted ({reply.get('reason')})")
            s.group.set_exception(err)
            raise err
        s.group.set_result(group)
        return group

    def _admitted(self, s: Session, reply: dict[str, Any]) -> GroupInfo | None:
        """The group a leader's reply admits us to; None if it does not, or is malformed."""
        members, nonce = reply.get("members"), reply.get("nonce")
        if not reply.get("ok") or not isinstance(members, list) or self.peer_id not in members \
                or not all(isinstance(m, str) for m in members) or members != sorted(set(members)) \
                or len(members) > self.config.group.max_peers \
                or not (isinstance(nonce, str) and 0 < len(nonce) <= 64):
            return None
        return GroupInfo(step=s.step, members=tuple(members), nonce=nonce)

    async def _join_once(self, s: Session, leader: str, reply_by: float) -> dict[str, Any]:
        try:  # bounded apart from the reply: the leader answers only at its freeze
            reader, writer = await asyncio.wait_for(open_stream(
                self.p2p, PeerID.from_base58(leader), self.protocol),
                min(s.remaining(), max(2.0, self.config.schedule.join_window_s)))
        except Exception as e:  # noqa: BLE001 - dial errors come as several types
            raise _Unreachable(repr(e)[:300]) from e
        try:  # we close first, after the reply: see allreduce.LINGER_S
            await send_header(writer, {"step": s.step, "hash": s.state_hash})
            wait = min(s.remaining(), reply_by - asyncio.get_running_loop().time())
            return await asyncio.wait_for(recv_header(reader), max(0.0, wait))
        finally:
            writer.close()

    @staticmethod
    def refuse(s: Session | None) -> None:
        """A meeting we let pass: a peer that JOINs us gets "not admitted" at once."""
        if s is not None and not s.group.done():
            s.group.set_exception(StepFailed("no step at this meeting"))
            s.group.exception()  # retrieved: nobody else awaits it
