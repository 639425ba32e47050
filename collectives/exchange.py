"""The member side of the all-reduce (steps 2-4 of allreduce.py's protocol): send our part
of every shard to its reducer on ``stripes`` streams, decode the means it streams back into
one output tensor as they arrive, reduce our own shard, and check every returned shard
before it is used (a mixin of ``AllReduce``, whose attributes these are).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Callable

import torch

from collectives._hivemind import P2P, PeerID, open_stream
from collectives.codec import Codec, chunk_bounds
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.reduce import Contribution, shard_bounds
from collectives.reducer import Session, members_digest, stripes
from collectives.streams import (CHUNK, MAX_HEADER_BYTES, VERDICT, FrameError, recv_header,
                                 recv_tagged, send_header, send_pipelined, work_pool)
from protocol.errors import ProtocolError
from protocol.limits import unpackb

__all__ = ["MemberExchange"]

logger = logging.getLogger(__name__)


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x)) if x.numel() else 0.0


def _shifted(fn: Callable[[int, int], None] | None, offset: int
             ) -> Callable[[int, int], None] | None:
    """``fn`` for ranges relative to ``offset`` (a shard's start)."""
    if fn is None:
        return None
    return lambda a, b: fn(offset + a, offset + b)


class MemberExchange:
    """``AllReduce.exchange`` and its parts (the attributes are ``AllReduce``'s)."""

    p2p: P2P
    config: OuterConfig
    codec: Codec
    peer_id: str
    names: dict[str, str]
    session: Session | None
    mean_rms: float
    _setup_shard: Callable[[Session, list[str]], None]
    _reducer_timer: Callable[..., Any]
    _chunk_in: Callable[[Session, int], None]
    _add: Callable[[Session, Contribution], None]

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
        # the norms of our own parts (the check's reference) while the wire is busy, not
        # after the last byte arrived (50M values: ~15-30 ms on the critical path)
        own_norms = {j: loop.run_in_executor(work_pool(), _norm, delta[slice(*bounds[j])])
                     for j in tasks}
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
                await own_norms[j], self.mean_rms)
            s.marks["checked"] = loop.time()
            if why is not None:
                s.bad_shards[members[j]] = why
                errors[members[j]] = f"bad shard: {why}"
            squares, checked = squares + norm ** 2, checked + bounds[j][1] - bounds[j][0]
        s.suspects |= set(errors) - {self.peer_id}
        s.suspects |= {p for p, why in s.excluded.items() if why in ("missing", "gone", "broken")}
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

    def _check_shard(self, shard: torch.Tensor, own: torch.Tensor | float,
                     ref_rms: float = 0.0) -> tuple[str | None, float]:
        """Why a reducer's returned shard must not be applied (else None), and its norm.
        ``own``: our input for that shard, or its norm; ``ref_rms``: the root mean square
        of the last mean we accepted (``mean_rms``)."""
        norm = _norm(shard)
        if not math.isfinite(norm):
            return "non_finite", 0.0
        own_norm = own if isinstance(own, float) else _norm(own)
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
        reader, writer = await open_stream(self.p2p, PeerID.from_base58(peer),
                                           self.names["reduce"])
        s.mark("stream_open")

        async def send() -> None:
            sent = await send_header(writer, {"step": s.step, "digest": digest,
                                              "weight": s.weight, "stripe": k, "stripes": n})
            sent += await send_pipelined(writer, [
                lambda a=a, b=b: self.codec.encode(part[a:b]) for a, b in chunks])
            # not `s.bytes_sent += await ...`: that reads the counter before the await and
            # loses what other tasks added meanwhile
            s.bytes_sent += sent
            s.mark("sent")

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
            s.mark("last_frame_in")
            for fut in decoding:
                await fut
            s.mark("last_decoded")
        finally:
            for fut in decoding:
                fut.cancel()
        return verdict
