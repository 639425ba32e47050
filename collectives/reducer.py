"""The reducer side of the all-reduce: one attempt's state and the shard-stream handler.

A reducer receives every member's part of its shard as chunks. As soon as chunk c of every
member is in place it computes the plain weighted mean of chunk c (median-capped weights,
peer-id order), encodes it once and streams it to every member, while chunks c+1... still
arrive: the all-gather overlaps the reduce-scatter. When the last chunk is in, the
statistics gathered on the way (``reduce.chunk_stats``) tell whether ``reduce_shard`` would
have accepted every contribution and clipped none (``reduce.plain_mean_holds``): then the
streamed mean *is* the robust mean and the verdict is "ok". Otherwise (an excluded or
clipped contribution, a member that sent garbage or never finished) the reducer computes
``reduce_shard`` on the whole shards and sends its result after a "redo" verdict; members
overwrite what they decoded. The hostile-peer checks are therefore exactly those of a
whole-shard reduction; a hostile peer only costs one more transfer of the shard. Both take
the norm reference of a group of two from our state when the shard is set up
(``Session.ref_rms``: our ``mean_rms`` then), so they agree on it.

A member sends its part of a shard on ``stripes`` streams (see ``STRIPES``): stream k
opens with a header ``{step, digest, weight, stripe: k, stripes: n}`` and carries chunks
k, k+n, k+2n...; the reducer answers on the same stream with a header ``{"ok": true}`` (or a
refusal), the tagged frames of the same chunks of the mean, a tagged verdict
``{"verdict": "ok" | "redo" | "none"}``, after "redo" those chunks of the robust mean. A
member's contribution counts once all its stripes are in; a bad stripe excludes the member.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from dataclasses import dataclass, field

import torch

from collectives._hivemind import P2P
from collectives.codec import Codec, CodecError, chunk_bounds
from collectives.config import OuterConfig
from collectives.reduce import (Contribution, ShardResult, capped_weights, chunk_stats,
                                plain_mean_holds, reduce_shard, shard_bounds)
from collectives.streams import (CHUNK, VERDICT, FrameError, recv_header, recv_pipelined,
                                 send_header, send_tagged, work_pool)
from protocol.limits import packb

__all__ = ["Session", "ReducerMixin", "members_digest", "STRIPES", "stripes"]

logger = logging.getLogger(__name__)

STRIPES = 16
"""Streams per (member, reducer) pair: chunk c of a shard travels on stream c mod n.

A yamux stream carries at most its receive window (256 KiB: p2pd grows it only while a
window drains within 4x the session's RTT estimate, one ping every 30 s, < 1 ms on an idle
link) per round trip of its window updates, and when both directions are busy those updates
queue behind the receiver's own data in its TCP send buffer, which autotuning has grown to
2-3 MB on the long-lived connection (0.2 s at 100 Mbit/s). Measured at 100M values, 2 peers,
100 Mbit/s tbf: with one stream per pair the exchanges after the first ran at 7-9 MB/s in one
direction (that sender's TCP socket empty, its p2pd blocked on windows with python's unix
sockets full) while the other filled the link: 42-50 s against 33.4 s of raw TCP; 4 streams
behaved the same; with 16 (4 MiB of window per direction for the parts, as much for the
means) both TCP send queues stayed full and every exchange took 34 s."""
CHUNKS_PER_STRIPE = 8
"""A stream per 8 chunks of a shard (8 MiB as fp32), at most ``STRIPES``: small shards are
short transfers, where every stream costs CPU and no window limits the rate. At 10M values
and 4 peers on 2 cores (10 chunks a shard) 10 streams per pair took the all-reduce from 0.92
of raw TCP (one stream, 9632947) to 0.69-0.72 (int8, bisected to b93aa37), and one stream
brought it back to 0.90; 100M values with 2 peers (191 chunks a shard) keep all 16."""
GONE_PROBE_S = 0.25
"""Between two looks at p2pd's connections while a member's contribution is missing. A
member whose process died (its kernel closed its connections) is excluded within about two
looks instead of being waited for until the reduce deadline: in the churn bench (deadline 8
s, period 4 s) that wait ended the survivors' kill attempts at the next meeting's opening,
some just before it and some just after (churn_clock_25_votes.json trial 18: a minority at
the retry). A live member that lost its connection that long loses this attempt's shard."""


def stripes(nchunks: int) -> int:
    """Streams of a shard of ``nchunks`` chunks: one per ``CHUNKS_PER_STRIPE`` chunks, at
    most ``STRIPES``."""
    return max(1, min(STRIPES, nchunks // CHUNKS_PER_STRIPE))


def members_digest(members: list[str], nonce: str = "") -> str:
    return hashlib.sha256("\n".join([nonce, *members]).encode()).hexdigest()[:32]


@dataclass
class Session:
    """One outer step attempt as seen by the asyncio thread."""

    step: int
    state_hash: str
    numel: int
    weight: float
    deadline: float
    """loop.time() by which everything of this attempt is over."""
    members_fut: asyncio.Future[list[str]]
    joins: set[str] = field(default_factory=set)
    members: list[str] | None = None
    nonce: str = ""
    """Chosen by the leader at the freeze; part of the members' digest."""
    contribs: dict[str, Contribution] = field(default_factory=dict)
    receiving: set[tuple[str, int]] = field(default_factory=set)
    """(member, stripe) of the shard streams our reducer is reading (``stripes`` per member)."""
    stripes_in: dict[str, int] = field(default_factory=dict)
    """Member -> how many of its stripes were read completely."""
    excluded: dict[str, str] = field(default_factory=dict)
    # --- our reducer's shard ---
    ref_rms: float = 0.0
    """``AllReduce.mean_rms`` when our shard was set up: the history half of our norm
    reference in a group of two (reduce.py), fixed for the attempt."""
    chunks: list[tuple[int, int]] = field(default_factory=list)
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    """Member -> its part of our shard, decoded in place chunk by chunk."""
    declared: dict[str, float] = field(default_factory=dict)
    have: list[int] = field(default_factory=list)
    """Chunk -> how many members' chunk is in place."""
    stream: list[asyncio.Future[bytes | None]] = field(default_factory=list)
    """Chunk -> encoded plain mean of that chunk (None once streaming was abandoned)."""
    stats: list[tuple[dict[str, float], dict[str, float]] | None] = field(default_factory=list)
    streaming: bool = True
    verdict: str = ""
    """"ok" (the streamed mean stands), "redo" (``result`` replaces it), "none"."""
    shard_done: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once ``verdict`` is."""
    result: list[asyncio.Future[bytes]] | None = None
    finishing: asyncio.Future[None] | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    suspects: set[str] = field(default_factory=set)
    """Members whose shard or contribution never came: their votes are not awaited."""
    witnessed: tuple[str, ...] = ()
    """Peers whose contribution our reducer accepted (us included): who saw us contribute
    and whose votes count (consistency.py)."""
    bad_shards: dict[str, str] = field(default_factory=dict)
    """Reducer -> why the shard it returned was rejected ("non_finite", "norm")."""
    clipped: tuple[str, ...] = ()
    connected: set[str] = field(default_factory=set)
    """The peers our p2pd was connected to when the session opened (reducer timer)."""
    marks: dict[str, float] = field(default_factory=dict)
    """Phase -> loop.time() of this attempt's exchange (logged: where the time goes)."""

    def remaining(self) -> float:
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def mark(self, phase: str) -> None:
        """``marks[phase]`` = now: called again by each of many streams or chunks, it keeps
        the last (where the exchange's tail goes, in the step's record)."""
        self.marks[phase] = asyncio.get_running_loop().time()


def _quiet(fut: asyncio.Future) -> None:  # type: ignore[type-arg]
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


class ReducerMixin:
    """Reducer handlers of :class:`collectives.allreduce.AllReduce`."""

    p2p: P2P
    config: OuterConfig
    codec: Codec
    peer_id: str
    session: Session | None
    mean_rms: float
    """RMS of the last mean we accepted as a member (exchange.py; raised to an adopted
    state's step size by ``open_session``'s ``rms_floor``, holding.py)."""

    def _current(self, step: object) -> Session | None:
        s = self.session
        return s if s is not None and s.step == step else None

    def _setup_shard(self, s: Session, members: list[str]) -> None:
        """Our shard's buffers (by whichever comes first: our exchange or a member)."""
        if s.members is None:
            s.members = members
        if s.chunks:
            return
        lo, hi = shard_bounds(s.numel, len(members))[members.index(self.peer_id)]
        s.chunks = chunk_bounds(hi - lo)
        s.have = [0] * len(s.chunks)
        loop = asyncio.get_running_loop()
        s.stream = [loop.create_future() for _ in s.chunks]
        s.stats = [None] * len(s.chunks)
        s.declared[self.peer_id] = s.weight
        s.parts[self.peer_id] = torch.empty(hi - lo, dtype=torch.float32)
        s.ref_rms = self.mean_rms

    async def _on_reduce(self, peer: str, reader, writer) -> None:  # type: ignore[no-untyped-def]
        head = await asyncio.wait_for(recv_header(reader), 10)
        s = self._current(head.get("step"))
        if s is None:
            await send_header(writer, {"ok": False, "reason": "step"})
            return
        members = await asyncio.wait_for(asyncio.shield(s.members_fut), s.remaining())
        k = head.get("stripe")
        if head.get("digest") != members_digest(members, s.nonce) or peer not in members \
                or peer == self.peer_id or peer in s.contribs or peer in s.excluded:
            await send_header(writer, {"ok": False, "reason": "membership"})
            return
        self._setup_shard(s, members)
        n = stripes(len(s.chunks))
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < n \
                or head.get("stripes") != n or (peer, k) in s.receiving:
            await send_header(writer, {"ok": False, "reason": "stripe"})
            return
        s.receiving.add((peer, k))
        weight = head.get("weight")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) \
                or not (math.isfinite(weight) and 0 < weight <= self.config.max_weight):
            self._abandon(s)  # reduce_shard excludes it: no plain mean to stream
            weight = math.nan
        if peer not in s.declared:
            s.declared[peer] = float(weight)
            s.parts[peer] = torch.empty(s.parts[self.peer_id].numel(), dtype=torch.float32)
        values = s.parts[peer]
        await send_header(writer, {"ok": True})
        sender = asyncio.create_task(self._send_result(s, writer, k))
        mine = s.chunks[k::n]
        try:
            if not (s.declared[peer] == weight
                    or math.isnan(s.declared[peer]) and math.isnan(weight)):
                raise ValueError("stripes declare different weights")
            s.bytes_received += await asyncio.wait_for(recv_pipelined(
                reader, [self.codec.encoded_size(b - a) for a, b in mine],
                lambda i, data: self.codec.decode_into(data, values[slice(*mine[i])]),
                on_done=lambda i: self._chunk_in(s, k + i * n)), s.remaining())
            s.stripes_in[peer] = s.stripes_in.get(peer, 0) + 1
            if s.stripes_in[peer] == n and peer not in s.excluded:
                self._add(s, Contribution(peer=peer, weight=s.declared[peer], values=values))
        except FrameError:  # longer than its codec size: the stream is out of step, drop it
            self._exclude(s, peer, "decode")
            sender.cancel()
            raise
        except (CodecError, ValueError) as e:
            logger.warning("step %d: contribution of %s rejected: %s", s.step, peer, e)
            self._exclude(s, peer, "decode")
        except (asyncio.IncompleteReadError, ConnectionError):
            # the stripe broke off (the member died or dropped us): it cannot be sent again
            # (one stream per stripe), so nothing it sends can count in this attempt
            self._exclude(s, peer, "broken")
            sender.cancel()
            raise
        except BaseException:
            sender.cancel()
            raise
        await sender

    def _exclude(self, s: Session, peer: str, why: str) -> None:
        s.excluded.setdefault(peer, why)
        self._abandon(s)
        self._maybe_finish(s)

    async def _send_result(self, s: Session, writer, k: int) -> None:  # type: ignore[no-untyped-def]
        """Stream stripe ``k`` of the plain mean's chunks while they are valid, then the
        verdict (and that stripe of the robust mean after "redo")."""
        n = stripes(len(s.chunks))
        for fut in s.stream[k::n]:
            data = await asyncio.wait_for(asyncio.shield(fut), s.remaining())
            if data is None:
                break
            await send_tagged(writer, CHUNK, data)
        await asyncio.wait_for(s.shard_done.wait(), s.remaining())
        await send_tagged(writer, VERDICT, packb({"verdict": s.verdict}))
        s.mark("verdict_sent")
        if s.verdict == "redo":
            assert s.result is not None
            for fut in s.result[k::n]:
                data = await asyncio.wait_for(asyncio.shield(fut), s.remaining())
                await send_tagged(writer, CHUNK, data)

    # --- streaming the plain mean ---------------------------------------------------------
    def _chunk_in(self, s: Session, c: int) -> None:
        s.have[c] += 1
        s.mark("chunk_in")
        if s.streaming and s.members is not None and s.have[c] == len(s.members):
            job = asyncio.get_running_loop().run_in_executor(work_pool(), self._plain_chunk,
                                                             s, c)
            job.add_done_callback(lambda f, c=c: self._chunk_out(s, c, f))

    def _plain_chunk(self, s: Session, c: int) -> tuple[bytes, tuple[dict, dict]]:
        """Encoded plain weighted mean of chunk c, and its statistics (work pool)."""
        a, b = s.chunks[c]
        parts = {p: s.parts[p][a:b] for p in sorted(s.parts)}
        weights = capped_weights(s.declared)
        total = math.fsum(weights.values())
        mean = torch.zeros(b - a, dtype=torch.float32)
        for p, x in parts.items():
            mean.add_(x, alpha=weights[p] / total)
        return self._encode_mean(mean), chunk_stats(parts)

    def _encode_mean(self, mean: torch.Tensor) -> bytes:
        """The wire bytes of (a chunk of) our shard's mean: encoded once, sent to all."""
        return self.codec.encode(mean)

    def _chunk_out(self, s: Session, c: int, job: asyncio.Future) -> None:  # type: ignore[type-arg]
        if job.cancelled() or job.exception() is not None or not s.streaming:
            if not job.cancelled() and job.exception() is not None:
                logger.info("step %d: plain mean of chunk %d failed: %r", s.step, c,
                            job.exception())
            self._abandon(s)
            self._maybe_finish(s)
            return
        data, s.stats[c] = job.result()
        s.mark("mean_ready")
        if not s.stream[c].done():
            s.stream[c].set_result(data)
            s.bytes_sent += (len(data) + 9) * (len(s.parts) - 1)
        if all(st is not None for st in s.stats):
            self._maybe_finish(s)

    def _abandon(self, s: Session) -> None:
        """Stop streaming the plain mean: a whole-shard reduction decides (verdict "redo")."""
        s.streaming = False
        for fut in s.stream:
            if not fut.done():
                fut.set_result(None)

    # --- the verdict ----------------------------------------------------------------------
    def _add(self, s: Session, c: Contribution) -> None:
        s.contribs[c.peer] = c
        self._maybe_finish(s)

    def _maybe_finish(self, s: Session, *, force: bool = False) -> None:
        if s.finishing is not None or s.members is None:
            return
        if not force and len(s.contribs) + len(s.excluded) < len(s.members):
            return
        streamed = s.streaming and len(s.contribs) == len(s.members) and not s.excluded
        if streamed and not all(st is not None for st in s.stats):
            if not force:
                return  # the last chunks' means are still being computed: _chunk_out calls
            self._abandon(s)
            streamed = False
        s.marks["contributions_in"] = asyncio.get_running_loop().time()
        if streamed and self._plain_holds(s):
            s.witnessed, s.clipped, s.verdict = tuple(sorted(s.contribs)), (), "ok"
            s.marks["reduced"] = s.marks["contributions_in"]
            s.shard_done.set()
            s.finishing = asyncio.get_running_loop().create_future()
            s.finishing.set_result(None)
            return
        self._abandon(s)
        s.finishing = asyncio.ensure_future(self._finish(s))

    def _plain_holds(self, s: Session) -> bool:
        sq: dict[str, float] = {p: 0.0 for p in s.parts}
        off: dict[str, float] = {p: 0.0 for p in s.parts}
        for st in s.stats:
            assert st is not None
            for p, v in st[0].items():
                sq[p] += v
            for p, v in st[1].items():
                off[p] += v
        cfg = self.config
        return plain_mean_holds(weights=s.declared, sq_norms=sq,
                                sq_offsets=off if len(sq) >= 3 else {},
                                max_weight=cfg.max_weight, max_norm=cfg.max_norm,
                                max_norm_ratio=cfg.max_norm_ratio, own=self.peer_id,
                                ref_rms=s.ref_rms, numel=s.parts[self.peer_id].numel())

    def _reduce(self, s: Session, contribs: list[Contribution]) -> ShardResult:
        """Our shard's robust mean of ``contribs`` (pure; runs in the work pool)."""
        cfg = self.config
        return reduce_shard(contribs, max_weight=cfg.max_weight, max_norm=cfg.max_norm,
                            max_norm_ratio=cfg.max_norm_ratio, own=self.peer_id,
                            ref_rms=s.ref_rms)

    async def _finish(self, s: Session) -> None:
        """Whole-shard reduction: the "redo" (or "none") verdict."""
        loop = asyncio.get_running_loop()
        assert s.members is not None
        contribs = dict(s.contribs)  # what arrives from now on is too late for this attempt
        try:
            res = await loop.run_in_executor(work_pool(), self._reduce, s,
                                             list(contribs.values()))
            s.witnessed, s.clipped, mean = res.accepted, res.clipped, res.mean
            for peer, why in res.excluded.items():
                s.excluded.setdefault(peer, why)
        except Exception:  # noqa: BLE001 - never leave the handlers waiting
            logger.exception("step %d: reduction failed", s.step)
            mean = None
        for peer in s.members:
            if peer not in contribs and peer not in s.excluded:
                s.excluded[peer] = "missing"
        if mean is not None:  # encoded once; the pool runs the chunks roughly in order
            s.result = [loop.run_in_executor(work_pool(), self._encode_mean, mean[a:b])
                        for a, b in chunk_bounds(mean.numel())]
            for fut in s.result:  # a cancelled attempt must not log "never retrieved"
                _quiet(fut)
            s.marks["reduced"] = loop.time()
            # counted here: our own exchange may end before the sends
            wire = sum(self.codec.encoded_size(b - a) + 9 for a, b in chunk_bounds(mean.numel()))
            s.bytes_sent += (wire + 32) * len([p for p in contribs if p != self.peer_id])
        s.verdict = "redo" if mean is not None else "none"
        s.shard_done.set()

    async def _connected(self, s: Session, timeout: float) -> set[str] | None:
        """The peers p2pd holds a connection to (None if it did not answer in time)."""
        try:
            return {p.peer_id.to_base58() for p in await asyncio.wait_for(
                self.p2p.list_peers(), timeout)}
        except Exception as e:  # noqa: BLE001
            logger.debug("step %d: p2pd's peers not listed: %r", s.step, e)
            return None

    async def _reducer_timer(self, s: Session, at: float) -> None:
        """Finish our shard at ``at`` with what came; before that, exclude members that are
        gone: connected to our p2pd at some look during this exchange (the first look is at
        its start) or when the session opened (before the meeting: a member that died
        before our exchange started), absent from two looks in a row while their
        contribution is missing."""
        loop = asyncio.get_running_loop()
        seen = set(s.connected)
        absent: set[str] = set()
        while s.finishing is None and loop.time() < at:
            waiting = set(s.members or ()) - set(s.contribs) - set(s.excluded) - {self.peer_id}
            if waiting:
                connected = await self._connected(s, GONE_PROBE_S)
                if connected is not None:  # no answer: nobody is judged gone
                    seen |= waiting & connected
                    gone = (waiting & seen) - connected
                    for peer in sorted(gone & absent):
                        logger.info("step %d: %s is gone (no connection): not waiting for "
                                    "its contribution", s.step, peer)
                        self._exclude(s, peer, "gone")
                    absent = gone
            await asyncio.sleep(max(0.0, min(GONE_PROBE_S, at - loop.time())))
        self._maybe_finish(s, force=True)
