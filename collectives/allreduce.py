"""Group formation and a bit-parity reduce-scatter/all-gather on hivemind p2p streams.

Why not hivemind's ``AllReduceRunner``: its reducer answers each sender with a *delta*
(average - sender's part) that the sender adds to its own part, and keeps its own shard
uncompressed, so peers end with different low bits (shared/notes/hivemind.md). Patching that
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
in ``loop.py`` reconcile peers that finished with peers that did not). Every frame is bounded
by the size it must have: a chunk by the codec's size for its length, the state by its wire
size for our model, sent in frames of ``STATE_CHUNK`` bytes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import deque
from typing import Callable

import torch

from collectives._hivemind import P2P, PeerID
from collectives.codec import Codec, chunk_bounds
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.reduce import Contribution, shard_bounds
from collectives.reducer import ReducerMixin, Session, members_digest, stripes
from collectives.streams import (CHUNK, MAX_HEADER_BYTES, VERDICT, FrameError, recv_frame,
                                 recv_header, recv_tagged, send_frame, send_header,
                                 send_pipelined, work_pool)
from protocol.errors import ProtocolError
from protocol.limits import unpackb

__all__ = ["Session", "AllReduce", "members_digest", "STATE_CHUNK"]

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


def _shifted(fn: Callable[[int, int], None] | None, offset: int
             ) -> Callable[[int, int], None] | None:
    """``fn`` for ranges relative to ``offset`` (a shard's start)."""
    if fn is None:
        return None
    return lambda a, b: fn(offset + a, offset + b)


class _Unreachable(Exception):
    """No stream to a peer could be opened (dial failure, timeout)."""


class AllReduce(ReducerMixin):
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
                           deadline: float) -> None:
        loop = asyncio.get_running_loop()
        self.session = Session(step=step, state_hash=state_hash, numel=numel, weight=weight,
                               deadline=deadline, members_fut=loop.create_future())

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
                         latest: float) -> list[str]:
        """Members of this attempt (sorted peer ids) from the leader, or StepFailed.

        The leader freezes at ``freeze_at``, or later (up to ``latest``) while a peer whose
        join record it saw (``expected``) has not sent its JOIN yet: slow peers (a large
        model to hash) are not dropped for being a second late.

        A leader we cannot even open a stream to is dead (issue 17.6: the join record of a
        peer killed in the previous attempt at this version outlives it, and every survivor
        chose it): we fall back to the next peer of ``expected`` in id order, and when that
        is us, we lead. Everyone who saw the same records falls back the same way. A leader
        that answered (even "no") is never skipped: that could split its group."""
        s = self.session
        assert s is not None
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
            await asyncio.sleep(0.05)
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
            _, reader, writer = await asyncio.wait_for(self.p2p.call_binary_stream_handler(
                PeerID.from_base58(leader), self.names["join"]),
                min(s.remaining(), max(2.0, self.config.join_window_s)))
        except Exception as e:  # noqa: BLE001 - dial errors come as several types
            raise _Unreachable(repr(e)[:300]) from e
        try:  # we close first, after the reply: see LINGER_S
            await send_header(writer, {"step": s.step, "hash": s.state_hash})
            return await asyncio.wait_for(recv_header(reader), s.remaining())
        finally:
            writer.close()

    async def exchange(self, delta: torch.Tensor, members: list[str], *,
                       reduce_deadline: float, out: torch.Tensor | None = None,
                       on_landed: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Reduce-scatter + all-gather of ``delta``; the group's mean (in ``out`` if given:
        fp32, contiguous, of delta's size) or StepFailed.
        ``on_landed(lo, hi)``: called in the codec pool once ``mean[lo:hi]`` was decoded (a
        range lands again if a reducer's "redo" overwrites it); the mean is only final,
        and checked, when this returns (landing.py)."""
        s = self.session
        assert s is not None
        loop = asyncio.get_running_loop()
        s.marks["start"] = loop.time()
        self._setup_shard(s, members)
        bounds = shard_bounds(s.numel, len(members))
        me = members.index(self.peer_id)
        timer = asyncio.create_task(self._reducer_timer(s, reduce_deadline))
        digest = members_digest(members, s.nonce)
        if out is None:  # every shard is decoded into place
            out = torch.empty(s.numel, dtype=torch.float32)
        elif out.shape != (s.numel,) or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError("out must be a contiguous fp32 vector of the delta's size")
        tasks = {j: asyncio.create_task(self._exchange_with(
            s, peer, delta[slice(*bounds[j])], digest, out=out[slice(*bounds[j])],
            landed=_shifted(on_landed, bounds[j][0])))
                 for j, peer in enumerate(members) if j != me}
        lo, hi = bounds[me]
        own = s.parts[self.peer_id]
        for c, (a, b) in enumerate(s.chunks):  # one chunk at a time: the senders share the pool
            await loop.run_in_executor(work_pool(), lambda a=a, b=b: self.codec.decode_into(
                self.codec.encode(delta[lo + a : lo + b]), own[a:b]))
            self._chunk_in(s, c)
        self._add(s, Contribution(peer=self.peer_id, weight=s.weight, values=own))
        s.marks["own"] = loop.time()
        errors: dict[str, str] = {}
        got: set[int] = set()
        try:
            mine = asyncio.create_task(self._own_result(s, out[lo:hi],
                                                        _shifted(on_landed, lo)))
            tasks[me] = mine
            for j, task in tasks.items():
                try:
                    await asyncio.wait_for(task, s.remaining())
                    got.add(j)
                except Exception as e:  # noqa: BLE001
                    errors[members[j]] = repr(e)[:200]
            s.marks["results_in"] = loop.time()
        finally:
            for t in tasks.values():
                t.cancel()
        squares, checked = 0.0, 0
        for j in sorted(got - {me}):
            why, norm = await loop.run_in_executor(
                work_pool(), self._check_shard, out[slice(*bounds[j])],
                delta[slice(*bounds[j])], self.mean_rms)
            if why is not None:
                s.bad_shards[members[j]] = why
                errors[members[j]] = f"bad shard: {why}"
            squares, checked = squares + norm ** 2, checked + bounds[j][1] - bounds[j][0]
        s.suspects |= set(errors) - {self.peer_id}
        s.suspects |= {p for p, why in s.excluded.items() if why == "missing"}
        s.marks["end"] = loop.time()
        logger.info("step %d exchange phases (s since start): %s", s.step,
                    {k: round(v - s.marks["start"], 3) for k, v in s.marks.items()})
        if errors:
            raise StepFailed(f"missing or bad shards from {sorted(errors)}: {errors}")
        if checked:
            self.mean_rms = math.sqrt(squares / checked)
        timer.cancel()
        return out

    async def _own_result(self, s: Session, mine: torch.Tensor,
                          landed: Callable[[int, int], None] | None) -> None:
        """Our reducer's mean of our shard, from the same bytes the members receive."""
        loop = asyncio.get_running_loop()
        for (a, b), fut in zip(s.chunks, s.stream):
            data = await asyncio.shield(fut)
            if data is None:
                break
            await loop.run_in_executor(work_pool(), self._decode, data, mine, a, b, landed)
        await s.shard_done.wait()
        if s.verdict == "redo":
            assert s.result is not None
            for (a, b), fut in zip(s.chunks, s.result):
                data = await asyncio.shield(fut)
                await loop.run_in_executor(work_pool(), self._decode, data, mine, a, b, landed)
        elif s.verdict != "ok":
            raise StepFailed("own shard has no result")
        s.marks["own_result"] = loop.time()

    def _decode(self, data: bytes, out: torch.Tensor, a: int, b: int,
                landed: Callable[[int, int], None] | None) -> None:
        """``out[a:b]`` = decode(data), then ``landed(a, b)`` (codec pool)."""
        self.codec.decode_into(data, out[a:b])
        if landed is not None:
            landed(a, b)

    def _check_shard(self, shard: torch.Tensor, own: torch.Tensor,
                     ref_rms: float = 0.0) -> tuple[str | None, float]:
        """Why a reducer's returned shard must not be applied (else None), and its norm.
        ``ref_rms``: the root mean square of the last mean we accepted (``mean_rms``)."""
        norm = float(torch.linalg.vector_norm(shard)) if shard.numel() else 0.0
        if not math.isfinite(norm):
            return "non_finite", 0.0
        own_norm = float(torch.linalg.vector_norm(own)) if own.numel() else 0.0
        ref = max(own_norm if math.isfinite(own_norm) else 0.0,
                  ref_rms * math.sqrt(shard.numel()))
        limit = self.config.max_norm
        if ref > 0:
            limit = min(limit, self.config.max_norm_ratio * ref)
        return ("norm" if norm > limit else None), norm

    async def _exchange_with(self, s: Session, peer: str, part: torch.Tensor, digest: str, *,
                             out: torch.Tensor | None = None,
                             landed: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Send ``part`` to its reducer ``peer`` and receive the mean of that shard (into
        ``out``) on the same streams (``stripes`` of them): the chunks of both directions
        overlap."""
        out = torch.empty(part.numel(), dtype=torch.float32) if out is None else out
        chunks = chunk_bounds(part.numel())
        n = stripes(len(chunks))
        jobs = [asyncio.create_task(self._stripe(s, peer, part, digest, out, chunks[k::n], k, n,
                                                 landed)) for k in range(n)]
        try:
            for job in asyncio.as_completed(jobs):
                await job  # the first error fails the exchange with this reducer
        finally:
            for job in jobs:
                job.cancel()
        return out

    async def _stripe(self, s: Session, peer: str, part: torch.Tensor, digest: str,
                      out: torch.Tensor, chunks: list[tuple[int, int]], k: int, n: int,
                      landed: Callable[[int, int], None] | None) -> None:
        """Stripe ``k`` of ``n``: these ``chunks`` of ``part`` to ``peer``, the same chunks of
        its mean back into ``out``."""
        _, reader, writer = await self.p2p.call_binary_stream_handler(
            PeerID.from_base58(peer), self.names["reduce"])

        async def send() -> None:
            sent = await send_header(writer, {"step": s.step, "digest": digest,
                                              "weight": s.weight, "stripe": k, "stripes": n})
            sent += await send_pipelined(writer, [
                lambda a=a, b=b: self.codec.encode(part[a:b]) for a, b in chunks])
            # not `s.bytes_sent += await ...`: that reads the counter before the await and
            # loses what other tasks added meanwhile
            s.bytes_sent += sent
            s.marks["sent"] = max(s.marks.get("sent", 0.0), asyncio.get_running_loop().time())

        sender = asyncio.create_task(send())
        try:
            head = await recv_header(reader)
            if not head.get("ok"):
                raise StepFailed(f"reducer {peer} refused: {head.get('reason')}")
            s.marks.setdefault("first_reply", asyncio.get_running_loop().time())
            verdict = await self._recv_chunks(s, reader, chunks, out, landed, verdict_ends=True)
            if verdict == "redo":
                await self._recv_chunks(s, reader, chunks, out, landed, verdict_ends=False)
            elif verdict != "ok":
                raise StepFailed(f"reducer {peer} has no result ({verdict})")
            await sender  # its errors too
        finally:
            sender.cancel()
            writer.close()

    async def _recv_chunks(self, s: Session, reader, chunks: list[tuple[int, int]],
                           out: torch.Tensor, landed: Callable[[int, int], None] | None, *,
                           verdict_ends: bool) -> str:  # type: ignore[no-untyped-def]
        """Decode chunk frames into ``out`` (in the pool, while the next frame arrives).
        ``verdict_ends``: up to len(chunks) chunks, then a verdict frame (returned); else
        exactly len(chunks) chunks ("")."""
        loop = asyncio.get_running_loop()
        decoding: list[asyncio.Future[None]] = []
        verdict = ""
        try:
            for c in range(len(chunks) + verdict_ends):
                size = self.codec.encoded_size(chunks[c][1] - chunks[c][0]) \
                    if c < len(chunks) else 0
                tag, body = await asyncio.wait_for(
                    recv_tagged(reader, max(size, MAX_HEADER_BYTES if verdict_ends else 0)),
                    s.remaining())
                s.bytes_received += len(body) + 9
                if tag == CHUNK and c < len(chunks):
                    decoding.append(loop.run_in_executor(
                        work_pool(), self._decode, body, out, *chunks[c], landed))
                    continue
                if tag != VERDICT or not verdict_ends:
                    raise FrameError(f"unexpected frame {tag!r} at chunk {c}")
                try:
                    head = unpackb(body)
                except ProtocolError as e:
                    raise FrameError(f"verdict does not decode: {e}") from e
                verdict = head.get("verdict") if isinstance(head, dict) else None
                if not isinstance(verdict, str) or (verdict == "ok" and c != len(chunks)):
                    raise FrameError(f"bad verdict {verdict!r} after {c} chunks")
                break
            for fut in decoding:
                await fut
        finally:
            for fut in decoding:
                fut.cancel()
        return verdict

    async def fetch_state(self, peer: str, state_hash: str, timeout: float, *,
                          max_bytes: int) -> bytes:
        """The serialized state ``state_hash`` from ``peer`` (at most ``max_bytes``, in
        chunks; not verified here)."""
        async def go() -> bytes:
            _, reader, writer = await self.p2p.call_binary_stream_handler(
                PeerID.from_base58(peer), self.names["state"])
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
