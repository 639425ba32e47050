"""Group formation and a bit-parity reduce-scatter/all-gather on hivemind p2p streams.

Why not hivemind's ``AllReduceRunner``: its reducer answers each sender with a *delta*
(average - sender's part) that the sender adds to its own part, and keeps its own shard
uncompressed, so peers end with different low bits (docs/notes/hivemind.md). Patching that
means overriding the runner, the tensor-part container and the averager's in-place add, and
its failure semantics (a failed reducer leaves each peer with its own values) still diverge.
A compact protocol on ``hivemind.p2p`` binary streams is shorter and parity holds by
construction:

1. **Group.** Each peer stores ``join/<version>`` in the DHT (subkey = peer id, value = its
   state hash, signed), waits ``join_window_s`` and reads the records. Among the peers that
   claim its own hash, the smallest peer id leads (one no stream opens to is skipped for the
   next: the record of a peer killed earlier at this version outlives it). Others send
   JOIN(version, hash) to it; at
   ``1.5 x join_window_s`` the leader freezes the member list (sorted peer ids) and answers
   every JOIN with it and a fresh nonce; the members' digest covers both, so a stream of an
   earlier attempt at the same version is refused. Peers only group with peers that claim
   their own state hash (consistency.py).
2. **Reduce-scatter.** The flat pseudo-gradient is cut into one contiguous shard per member.
   Member i sends shard j to member j on up to ``reducer.STRIPES`` streams (chunk c on
   stream c mod n: one yamux stream's window alone can starve the link), as chunks of
   ``CHUNK_VALUES`` values,
   each encoded in a thread pool while the previous chunk is on the wire; reducer j decodes
   each chunk in place (in the pool, while the next arrives).
3. **All-gather, overlapped.** As soon as every member's chunk c is in, reducer j encodes the
   plain weighted mean of chunk c *once* and streams the same bytes back on every member's
   stream; it uses ``decode(those bytes)`` itself. At the end a verdict says whether the
   whole-shard robust reduction (bounds, weight cap, centred clipping: ``reduce.py``) equals
   what was streamed, or its result follows ("redo"); see ``reducer.py``. Members decode
   straight into one output tensor.
4. **Check.** A member never applies a shard it did not check: finite, L2 norm <= ``max_norm``
   and <= ``max_norm_ratio`` x the larger of the norm of its own input for that shard and
   of the last mean it accepted, scaled to the shard's length (an honest mean of bounded
   contributions cannot be far larger than both; the second keeps a member that trained
   little, e.g. a joiner that just rebased, from failing every honest mean, while a hostile
   reducer can still grow the reference at most ``max_norm_ratio``-fold per step). A bad
   shard fails the step for the member;
   a shard poisoned for everyone fails it for everyone, with their hashes unchanged.

A member that misses or rejects any shard fails the step (keeps training locally; the votes
in ``vote.py`` reconcile peers that finished with peers that did not). Every frame is bounded
by the size it must have: a chunk by the codec's size for its length, the state by its wire
size for our model, sent in frames of ``STATE_CHUNK`` bytes.

Here: the handlers, group formation (JOIN / freeze) and state transfers; the member side of
steps 2-4 is exchange.py, the reducer side reducer.py.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from collectives._hivemind import P2P, PeerID, open_stream
from collectives.codec import Codec
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.exchange import MemberExchange
from collectives.reducer import ReducerMixin, Session, members_digest
from collectives.streams import FrameError, recv_frame, recv_header, send_frame, send_header

__all__ = ["AllReduce", "ExchangeReport", "STATE_CHUNK", "Session", "members_digest"]

logger = logging.getLogger(__name__)
STATE_CHUNK = 4 << 20
"""Bytes per frame of a state transfer."""
JOIN_TRIES = 3
"""A JOIN whose reply was lost (IncompleteReadError) is asked again: the leader answers an
admitted member's repeated JOIN with the same list."""
LINGER_S = 5.0
"""How long a handler waits for the caller to close first (a handler that closes right
after writing can make p2pd reset the stream and lose the reply)."""


class RateLimit:
    """At most ``per_minute`` events per key in any 60 s window; at most ``max_keys`` keys."""

    def __init__(self, per_minute: int, max_keys: int = 4096) -> None:
        self.per_minute, self.max_keys = per_minute, max_keys
        self._seen: dict[str, deque[float]] = {}

    def allow(self, key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        q = self._seen.get(key)
        if q is None:
            if len(self._seen) >= self.max_keys:
                self._seen = {k: v for k, v in self._seen.items() if v and v[-1] > now - 60}
                if len(self._seen) >= self.max_keys:
                    return False
            q = self._seen[key] = deque()
        while q and q[0] <= now - 60:
            q.popleft()
        if len(q) >= self.per_minute:
            return False
        q.append(now)
        return True


@dataclass(frozen=True)
class ExchangeReport:
    """What one attempt's exchange did (``AllReduce.report``): the group's nonce, bytes,
    the peers our reducer accepted (``witnessed``: whose votes count) or never heard from
    (``suspects``), exclusions, rejected shards, clipped contributions, and the exchange's
    phase marks (loop.time())."""

    nonce: str
    bytes_sent: int
    bytes_received: int
    witnessed: frozenset[str]
    suspects: frozenset[str]
    excluded: dict[str, str]
    bad_shards: dict[str, str]
    clipped: tuple[str, ...]
    marks: dict[str, float]


class _Unreachable(Exception):
    """No stream to a peer could be opened (dial failure, timeout)."""


class AllReduce(MemberExchange, ReducerMixin):
    """Stream handlers and the member-side protocol of one node (runs on the transport loop)."""

    def __init__(self, p2p: P2P, config: OuterConfig, codec: Codec, *, peer_id: str, gid: str,
                 state_provider: Callable[[str], bytes | None]) -> None:
        self.p2p, self.config, self.codec, self.peer_id = p2p, config, codec, peer_id
        self.names = {k: f"/swarm-node/outer/{gid}/{k}/5" for k in ("join", "reduce", "state")}
        self.state_provider = state_provider
        """hash -> the serialized state if we hold it (cached per hash by the provider)."""
        self.session: Session | None = None
        self.mean_rms = 0.0
        """Root mean square of the last mean whose shards all passed ``_check_shard``."""
        self.rejected = 0
        self.state_refused = 0
        """State requests refused by the per-peer rate limit."""
        self._state_limit = RateLimit(config.state_requests_per_minute)
        self._state_slots = asyncio.Semaphore(2)

    async def start(self) -> None:
        await self.p2p.add_binary_stream_handler(self.names["join"], self._guard(self._on_join))
        await self.p2p.add_binary_stream_handler(self.names["reduce"],
                                                 self._guard(self._on_reduce))
        await self.p2p.add_binary_stream_handler(self.names["state"], self._guard(self._on_state))

    def _guard(self, handler):  # type: ignore[no-untyped-def]
        async def wrapped(info, reader, writer) -> None:  # type: ignore[no-untyped-def]
            try:
                await handler(info.peer_id.to_base58(), reader, writer)
                try:  # let the caller close first: it has read our reply by then
                    await asyncio.wait_for(reader.read(1), LINGER_S)
                except (asyncio.TimeoutError, ConnectionError):
                    pass
            except (FrameError, asyncio.IncompleteReadError, ConnectionError,
                    asyncio.TimeoutError, StepFailed) as e:
                self.rejected += 1
                logger.info("outer stream from %s dropped: %s", info.peer_id, e)
            except Exception:  # noqa: BLE001 - a bad peer must never crash the node
                self.rejected += 1
                logger.exception("outer stream handler failed (peer %s)", info.peer_id)
            finally:
                writer.close()
        return wrapped

    # --- session --------------------------------------------------------------------------
    async def open_session(self, *, step: int, state_hash: str, numel: int, weight: float,
                           deadline: float, rms_floor: float = 0.0) -> None:
        """A new attempt (``rms_floor``: the size of the recent steps of a state adopted
        since the last one, ``Holding.take_rms_floor``: ``mean_rms`` is at least that)."""
        loop = asyncio.get_running_loop()
        self.mean_rms = max(self.mean_rms, rms_floor)
        self.session = s = Session(step=step, state_hash=state_hash, numel=numel,
                                   weight=weight, deadline=deadline,
                                   members_fut=loop.create_future())
        s.connected = await self._connected(s, 1.0) or set()

    # --- handlers -------------------------------------------------------------------------
    async def _on_join(self, peer: str, reader, writer) -> None:  # type: ignore[no-untyped-def]
        req = await asyncio.wait_for(recv_header(reader), 10)
        s = self._current(req.get("step"))
        if s is None or req.get("hash") != s.state_hash:
            await send_header(writer, {"ok": False, "reason": "closed"})
            return
        if not s.members_fut.done():
            s.joins.add(peer)
        # idempotent: an admitted member whose reply was lost asks again and gets it again
        try:
            members = await asyncio.wait_for(asyncio.shield(s.members_fut), s.remaining())
        except Exception:  # noqa: BLE001 - not the leader, or the deadline passed
            members = []
        ok = peer in members
        await send_header(writer, {"ok": ok, "members": members if ok else [],
                                   "nonce": s.nonce if ok else ""})

    async def _on_state(self, peer: str, reader, writer) -> None:  # type: ignore[no-untyped-def]
        req = await asyncio.wait_for(recv_header(reader), 10)
        want = req.get("hash")
        if not isinstance(want, str) or not self._state_limit.allow(peer):
            self.state_refused += 1
            await send_header(writer, {"ok": False, "reason": "rate"})
            return
        async with self._state_slots:  # serialisation happens once per hash (provider cache)
            data = await asyncio.get_running_loop().run_in_executor(None, self.state_provider,
                                                                    want)
            if data is None:
                await send_header(writer, {"ok": False, "reason": "gone"})
                return
            await send_header(writer, {"ok": True, "hash": want, "size": len(data)})
            view = memoryview(data)
            for offset in range(0, len(view), STATE_CHUNK):
                await send_frame(writer, view[offset : offset + STATE_CHUNK])
        logger.info("served outer state %s… to %s (%d bytes)", want[:12], peer, len(data))

    # --- member side ----------------------------------------------------------------------
    async def form_group(self, leader: str, *, freeze_at: float, expected: set[str],
                         latest: float, deadline: float | None = None) -> list[str]:
        """Members of this attempt (sorted peer ids) from the leader, or StepFailed.

        The leader freezes at ``freeze_at``, or later (up to ``latest``) while a peer whose
        join record it saw (``expected``) has not sent its JOIN yet: slow peers (a large
        model to hash) are not dropped for being a second late.

        A leader we cannot even open a stream to is dead (issue 17.6: the join record of a
        peer killed in the previous attempt at this version outlives it, and every survivor
        chose it): we fall back to the next peer of ``expected`` in id order, and when that
        is us, we lead. Everyone who saw the same records falls back the same way. A leader
        that answered (even "no") is never skipped: that could split its group.

        ``deadline``: the attempt's new end (a meeting on the clock counts it from the read)."""
        s = self.session
        assert s is not None
        if deadline is not None:
            s.deadline = deadline
        s.members_fut.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        dead: set[str] = set()
        for cand in [leader, *sorted(expected - {leader})]:
            if cand == self.peer_id:
                return await self._lead(s, freeze_at, expected - dead, latest)
            try:
                return await self._join(s, cand)
            except _Unreachable as e:
                dead.add(cand)
                logger.info("step %d: leader %s unreachable (%s); next in id order", s.step,
                            cand, e)
        err = StepFailed(f"could not join any leader of {len(dead)}: {sorted(dead)}")
        s.members_fut.set_exception(err)
        raise err

    async def _lead(self, s: Session, freeze_at: float, expected: set[str],
                    latest: float) -> list[str]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, freeze_at - loop.time()))
        while not expected <= s.joins | {self.peer_id} and loop.time() < latest:
            await asyncio.sleep(0.01)  # a JOIN that arrives now is on the critical path
        members = sorted({self.peer_id} | s.joins)
        if len(members) > self.config.max_peers:
            others = [m for m in members if m != self.peer_id][: self.config.max_peers - 1]
            members = sorted([self.peer_id, *others])
        s.nonce = secrets.token_hex(8)
        s.members_fut.set_result(members)
        return members

    async def _join(self, s: Session, leader: str) -> list[str]:
        """JOIN via ``leader``; _Unreachable if no stream to it opens."""
        for attempt in range(JOIN_TRIES):
            try:
                reply = await self._join_once(s, leader)
                break
            except _Unreachable:
                raise
            except Exception as e:  # noqa: BLE001
                transient = isinstance(e, (asyncio.IncompleteReadError, ConnectionError))
                if transient and attempt + 1 < JOIN_TRIES and s.remaining() > 0.5:
                    logger.info("JOIN via %s lost its reply (%r); asking again", leader, e)
                    continue
                s.members_fut.set_exception(StepFailed(f"join via {leader} failed: {e!r}"))
                raise StepFailed(f"could not join leader {leader}: {e!r}") from e
        members, nonce = reply.get("members"), reply.get("nonce")
        if not reply.get("ok") or not isinstance(members, list) or self.peer_id not in members \
                or not all(isinstance(m, str) for m in members) or members != sorted(set(members)) \
                or len(members) > self.config.max_peers \
                or not (isinstance(nonce, str) and 0 < len(nonce) <= 64):
            s.members_fut.set_exception(StepFailed("not admitted"))
            raise StepFailed(f"leader {leader} did not admit us: {reply.get('reason')}")
        s.nonce = nonce
        s.members_fut.set_result(members)
        return members

    async def _join_once(self, s: Session, leader: str) -> dict:
        try:  # bounded apart from the reply: the leader answers only at its freeze
            reader, writer = await asyncio.wait_for(open_stream(
                self.p2p, PeerID.from_base58(leader), self.names["join"]),
                min(s.remaining(), max(2.0, self.config.join_window_s)))
        except Exception as e:  # noqa: BLE001 - dial errors come as several types
            raise _Unreachable(repr(e)[:300]) from e
        try:  # we close first, after the reply: see LINGER_S
            await send_header(writer, {"step": s.step, "hash": s.state_hash})
            return await asyncio.wait_for(recv_header(reader), s.remaining())
        finally:
            writer.close()

    async def refuse_joins(self) -> None:
        """A meeting we let pass: a peer that JOINs us gets "not admitted" at once."""
        s = self.session
        if s is not None and not s.members_fut.done():
            s.members_fut.set_exception(StepFailed("no step at this meeting"))
            s.members_fut.exception()  # retrieved: nobody else awaits it

    async def report(self) -> ExchangeReport | None:
        """What this attempt's exchange did, as the asyncio thread sees it (None: no session)."""
        s = self.session
        if s is None:
            return None
        return ExchangeReport(
            nonce=s.nonce, bytes_sent=s.bytes_sent, bytes_received=s.bytes_received,
            witnessed=frozenset(s.witnessed), suspects=frozenset(s.suspects),
            excluded=dict(s.excluded), bad_shards=dict(s.bad_shards), clipped=tuple(s.clipped),
            marks=dict(s.marks))

    async def fetch_state(self, peer: str, state_hash: str, timeout: float, *,
                          max_bytes: int) -> bytes:
        """The serialized state ``state_hash`` from ``peer`` (at most ``max_bytes``, in
        chunks; not verified here)."""
        async def go() -> bytes:
            reader, writer = await open_stream(self.p2p, PeerID.from_base58(peer),
                                               self.names["state"])
            try:
                await send_header(writer, {"hash": state_hash})
                head = await recv_header(reader)
                size = head.get("size")
                if not head.get("ok"):
                    raise StepFailed(f"{peer} refused {state_hash[:12]}: {head.get('reason')}")
                if not isinstance(size, int) or isinstance(size, bool) \
                        or not 0 < size <= max_bytes:
                    raise StepFailed(f"{peer} announced a state of {size!r} bytes")
                buf = bytearray()
                while len(buf) < size:
                    chunk = await recv_frame(reader, min(STATE_CHUNK, size - len(buf)))
                    if not chunk:
                        raise StepFailed(f"{peer} sent an empty state chunk")
                    buf += chunk
                return bytes(buf)
            finally:
                writer.close()
        return await asyncio.wait_for(go(), timeout)
