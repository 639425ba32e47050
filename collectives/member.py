"""The member side of the all-reduce (steps 2-4 of allreduce.py's protocol): send our part
of every shard to its reducer on ``stripes`` streams, decode the means it streams back into
one output tensor as they arrive, hand our own shard's part to our reducer, and check every
returned shard before it is used.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from dataclasses import dataclass
from typing import Callable

import torch

from collectives._hivemind import P2P, PeerID, open_stream
from collectives.codec import Codec, chunk_bounds
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.group import GroupInfo
from collectives.reducer import Peers, ShardReducer, stripes
from collectives.session import Session
from collectives.streams import (CHUNK, MAX_HEADER_BYTES, VERDICT, FrameError, cancel_all,
                                 recv_header, recv_tagged, send_header, send_pipelined,
                                 work_pool)
from protocol.errors import ProtocolError
from protocol.limits import unpackb

__all__ = ["Member", "check_shard"]

logger = logging.getLogger(__name__)

Landed = Callable[[int, int], None]
"""``landed(lo, hi)``: ``mean[lo:hi]`` was decoded in place (codec pool; landing.py)."""


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x)) if x.numel() else 0.0


def _shifted(fn: Landed | None, offset: int) -> Landed | None:
    """``fn`` for ranges relative to ``offset`` (a shard's start)."""
    if fn is None:
        return None
    return lambda a, b: fn(offset + a, offset + b)


def check_shard(shard: torch.Tensor, own: torch.Tensor | float, *, ref_rms: float,
                max_norm: float, max_norm_ratio: float) -> tuple[str | None, float]:
    """Why a reducer's returned shard must not be applied (else None), and its norm.
    ``own``: our input for that shard, or its norm; ``ref_rms``: the root mean square of the
    last mean we accepted (``AllReduce.mean_rms``). The limit is ``max_norm_ratio`` x the
    larger of the two, scaled to the shard's length, and never above ``max_norm``."""
    norm = _norm(shard)
    if not math.isfinite(norm):
        return "non_finite", 0.0
    own_norm = own if isinstance(own, float) else _norm(own)
    ref = max(own_norm if math.isfinite(own_norm) else 0.0, ref_rms * math.sqrt(shard.numel()))
    limit = max_norm
    if ref > 0:
        limit = min(limit, max_norm_ratio * ref)
    return ("norm" if norm > limit else None), norm


@dataclass(frozen=True)
class Exchanged:
    """What ``Member.exchange`` returns: the group's mean and its root mean square (None
    when no returned shard was checked: a group of one)."""

    mean: torch.Tensor
    rms: float | None


class Member:
    """Our side as a member of every shard's reduction (one per node; state is per call)."""

    def __init__(self, p2p: P2P, config: OuterConfig, codec: Codec, *, peer_id: str,
                 protocol: str) -> None:
        self.p2p, self.config, self.codec = p2p, config, codec
        self.peer_id, self.protocol = peer_id, protocol

    async def exchange(self, s: Session, group: GroupInfo, shard: ShardReducer,
                       delta: torch.Tensor, *, reduce_deadline: float, mean_rms: float,
                       peers: Peers, out: torch.Tensor | None = None,
                       on_landed: Landed | None = None) -> Exchanged:
        """Reduce-scatter + all-gather of ``delta`` with ``group`` (``shard``: ours, which
        finishes by ``reduce_deadline`` at the latest); the group's mean (in ``out`` if
        given: fp32, contiguous, of delta's size) or StepFailed. ``on_landed(lo, hi)``:
        called in the codec pool once ``mean[lo:hi]`` was decoded (a range lands again if a
        reducer's "redo" overwrites it); the mean is only final, and checked, when this
        returns (landing.py). Records suspects and bad shards in ``s``."""
        loop = asyncio.get_running_loop()
        traffic = s.traffic
        traffic.marks["start"] = loop.time()
        bounds = group.shards(s.numel)
        me = group.members.index(self.peer_id)
        shard.watch(reduce_deadline, peers)
        if out is None:  # every shard is decoded into place
            out = torch.empty(s.numel, dtype=torch.float32)
        elif out.shape != (s.numel,) or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError("out must be a contiguous fp32 vector of the delta's size")
        down = self.codec.for_mean(group.size)
        tasks = {j: asyncio.ensure_future(self._exchange_with(
            s, peer, delta[slice(*bounds[j])], group.digest, down, out=out[slice(*bounds[j])],
            landed=_shifted(on_landed, bounds[j][0])))
                 for j, peer in enumerate(group.members) if j != me}
        # the norms of our own parts (the check's reference) while the wire is busy, not
        # after the last byte arrived (50M values: ~15-30 ms on the critical path)
        own_norms = {j: loop.run_in_executor(work_pool(), _norm, delta[slice(*bounds[j])])
                     for j in tasks}
        lo, hi = bounds[me]
        errors: dict[str, str] = {}
        got: set[int] = set()
        try:
            await shard.put_own(delta[lo:hi])
            traffic.marks["own"] = loop.time()
            tasks[me] = asyncio.ensure_future(self._own_result(s, shard, out[lo:hi], down,
                                                               _shifted(on_landed, lo)))
            for j, task in tasks.items():
                try:
                    await asyncio.wait_for(task, s.remaining())
                    got.add(j)
                except Exception as e:  # noqa: BLE001
                    errors[group.members[j]] = repr(e)[:200]
            traffic.marks["results_in"] = loop.time()
        finally:
            await cancel_all(list(tasks.values()))
        squares, checked = 0.0, 0
        cfg = self.config
        for j in sorted(got - {me}):
            own = await own_norms[j]
            why, norm = await loop.run_in_executor(work_pool(), functools.partial(
                check_shard, out[slice(*bounds[j])], own, ref_rms=mean_rms,
                max_norm=cfg.bounds.max_norm, max_norm_ratio=cfg.bounds.max_norm_ratio))
            traffic.mark("checked")
            if why is not None:
                s.bad_shards[group.members[j]] = why
                errors[group.members[j]] = f"bad shard: {why}"
            squares, checked = squares + norm ** 2, checked + bounds[j][1] - bounds[j][0]
        s.suspects |= set(errors) - {self.peer_id}
        s.suspects |= {p for p, why in shard.excluded.items()
                       if why in ("missing", "gone", "broken")}
        traffic.marks["end"] = loop.time()
        logger.info("step %d exchange phases (s since start): %s", s.step,
                    {k: round(v - traffic.marks["start"], 3) for k, v in traffic.marks.items()})
        if errors:
            raise StepFailed(f"missing or bad shards from {sorted(errors)}: {errors}")
        return Exchanged(mean=out, rms=math.sqrt(squares / checked) if checked else None)

    async def _own_result(self, s: Session, shard: ShardReducer, mine: torch.Tensor,
                          down: Codec, landed: Landed | None) -> None:
        """Our reducer's mean of our shard, from the same bytes the members receive."""
        loop = asyncio.get_running_loop()
        async for c, data in shard.mean_of(list(range(len(shard.chunks)))):
            await loop.run_in_executor(work_pool(), _decode, down, data, mine,
                                       *shard.chunks[c], landed)
        s.traffic.mark("own_result")

    async def _exchange_with(self, s: Session, peer: str, part: torch.Tensor, digest: str,
                             down: Codec, *, out: torch.Tensor,
                             landed: Landed | None = None) -> None:
        """Send ``part`` to its reducer ``peer`` and receive the mean of that shard into
        ``out`` on the same streams (``stripes`` of them): the chunks of both directions
        overlap."""
        chunks = chunk_bounds(part.numel())
        n = stripes(len(chunks))
        jobs = [asyncio.ensure_future(self._stripe(s, peer, part, digest, down, out,
                                                   chunks[k::n], k, n, landed))
                for k in range(n)]
        try:
            for job in asyncio.as_completed(jobs):
                await job  # the first error fails the exchange with this reducer
        finally:
            await cancel_all(jobs)

    async def _stripe(self, s: Session, peer: str, part: torch.Tensor, digest: str,
                      down: Codec, out: torch.Tensor, chunks: list[tuple[int, int]], k: int,
                      n: int, landed: Landed | None) -> None:
        """Stripe ``k`` of ``n``: these ``chunks`` of ``part`` to ``peer``, the same chunks of
        its mean back into ``out``."""
        reader, writer = await open_stream(self.p2p, PeerID.from_base58(peer), self.protocol)
        s.traffic.mark("stream_open")

        async def send() -> None:
            sent = await send_header(writer, {"step": s.step, "digest": digest,
                                              "weight": s.weight, "stripe": k, "stripes": n})
            sent += await send_pipelined(writer, [
                functools.partial(self.codec.encode, part[a:b]) for a, b in chunks])
            # not `traffic.bytes_sent += await ...`: that reads the counter before the await
            # and loses what other tasks added meanwhile
            s.traffic.bytes_sent += sent
            s.traffic.mark("sent")

        sender = asyncio.ensure_future(send())
        try:
            head = await recv_header(reader)
            if not head.get("ok"):
                raise StepFailed(f"reducer {peer} refused: {head.get('reason')}")
            s.traffic.marks.setdefault("first_reply", asyncio.get_running_loop().time())
            verdict = await self._recv_chunks(s, reader, chunks, down, out, landed,
                                              verdict_ends=True)
            if verdict == "redo":
                await self._recv_chunks(s, reader, chunks, down, out, landed,
                                        verdict_ends=False)
            elif verdict != "ok":
                raise StepFailed(f"reducer {peer} has no result ({verdict})")
            await sender  # its errors too
        finally:
            await cancel_all([sender])
            writer.close()

    async def _recv_chunks(self, s: Session, reader: asyncio.StreamReader,
                           chunks: list[tuple[int, int]], down: Codec, out: torch.Tensor,
                           landed: Landed | None, *, verdict_ends: bool) -> str:
        """Decode chunk frames into ``out`` (in the pool, while the next frame arrives).
        ``verdict_ends``: up to len(chunks) chunks, then a verdict frame (returned); else
        exactly len(chunks) chunks ("")."""
        loop = asyncio.get_running_loop()
        decoding: list[asyncio.Future[None]] = []
        verdict = ""
        try:
            for c in range(len(chunks) + verdict_ends):
                size = down.encoded_size(chunks[c][1] - chunks[c][0]) \
                    if c < len(chunks) else 0
                tag, body = await asyncio.wait_for(
                    recv_tagged(reader, max(size, MAX_HEADER_BYTES if verdict_ends else 0)),
                    s.remaining())
                s.traffic.bytes_received += len(body) + 9
                if tag == CHUNK and c < len(chunks):
                    decoding.append(loop.run_in_executor(
                        work_pool(), _decode, down, body, out, *chunks[c], landed))
                    continue
                if tag != VERDICT or not verdict_ends:
                    raise FrameError(f"unexpected frame {tag!r} at chunk {c}")
                try:
                    head = unpackb(bytes(body))
                except ProtocolError as e:
                    raise FrameError(f"verdict does not decode: {e}") from e
                said = head.get("verdict") if isinstance(head, dict) else None
                if not isinstance(said, str) or (said == "ok" and c != len(chunks)):
                    raise FrameError(f"bad verdict {said!r} after {c} chunks")
                verdict = said
                break
            s.traffic.mark("last_frame_in")
            for fut in decoding:
                await fut
            s.traffic.mark("last_decoded")
        finally:
            for fut in decoding:
                fut.cancel()
        return verdict


def _decode(codec: Codec, data: bytes | memoryview, out: torch.Tensor, a: int, b: int,
            landed: Landed | None) -> None:
    """``out[a:b]`` = decode(data), then ``landed(a, b)`` (codec pool)."""
    codec.decode_into(data, out[a:b])
    if landed is not None:
        landed(a, b)
