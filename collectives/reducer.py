"""The reducer side of the all-reduce: our shard of one attempt (``ShardReducer``).

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
import functools
import logging
import math
from typing import AsyncIterator, Awaitable, Callable

import torch

from collectives.codec import Codec, CodecError, chunk_bounds
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.group import GroupInfo
from collectives.reduce import (Contribution, ShardResult, capped_weights, chunk_stats,
                                plain_mean_holds, reduce_shard)
from collectives.session import Session
from collectives.streams import (CHUNK, VERDICT, FrameError, cancel_all, recv_pipelined,
                                 send_header, send_tagged, work_pool)
from protocol.limits import packb

__all__ = ["ShardReducer", "STRIPES", "stripes"]

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


def _quiet(fut: asyncio.Future) -> None:  # type: ignore[type-arg]
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


Peers = Callable[[float], Awaitable["set[str] | None"]]
"""The peers p2pd holds a connection to, asked with a timeout (None: no answer in time)."""


class ShardReducer:
    """Our shard of one attempt: every member's part in, the mean out (asyncio thread only).

    Set up by whichever comes first, our own exchange or a member's stream
    (``AllReduce.shard``). ``ref_rms``: ``AllReduce.mean_rms`` then, the history half of our
    norm reference in a group of two (reduce.py), fixed for the attempt."""

    def __init__(self, config: OuterConfig, codec: Codec, *, me: str, session: Session,
                 group: GroupInfo, ref_rms: float) -> None:
        self.config, self.codec, self.me, self.ref_rms = config, codec, me, ref_rms
        self.mean_codec = codec.for_mean(group.size)
        """What the mean goes back in (the members' contributions come in ``codec``)."""
        self.session, self.group = session, group
        self.traffic = session.traffic
        lo, hi = group.shards(session.numel)[group.members.index(me)]
        self.chunks = chunk_bounds(hi - lo)
        self.stripes = stripes(len(self.chunks))
        loop = asyncio.get_running_loop()
        self.have = [0] * len(self.chunks)
        """Chunk -> how many members' chunk is in place."""
        self.stream: list[asyncio.Future[bytes | None]] = [loop.create_future()
                                                           for _ in self.chunks]
        """Chunk -> encoded plain mean of that chunk (None once streaming was abandoned)."""
        self.stats: list[tuple[dict[str, float], dict[str, float]] | None] = \
            [None] * len(self.chunks)
        self.streaming = True
        self.parts: dict[str, torch.Tensor] = {me: torch.empty(hi - lo, dtype=torch.float32)}
        """Member -> its part of our shard, decoded in place chunk by chunk."""
        self.declared: dict[str, float] = {me: session.weight}
        self.receiving: set[tuple[str, int]] = set()
        """(member, stripe) of the shard streams we are reading."""
        self.stripes_in: dict[str, int] = {}
        """Member -> how many of its stripes were read completely."""
        self.contribs: dict[str, Contribution] = {}
        self.excluded: dict[str, str] = {}
        self.verdict = ""
        """"ok" (the streamed mean stands), "redo" (``result`` replaces it), "none"."""
        self.done = asyncio.Event()
        """Set once ``verdict`` is."""
        self.result: list[asyncio.Future[bytes]] | None = None
        self.finishing: asyncio.Future[None] | None = None
        self.witnessed: tuple[str, ...] = ()
        """Peers whose contribution we accepted (us included): who saw them contribute and
        whose votes count (consistency.py)."""
        self.clipped: tuple[str, ...] = ()
        self._tasks: set[asyncio.Future[None]] = set()

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def busy(self) -> bool:
        """Something of ours still runs (the watch, a whole-shard reduction)."""
        return bool(self._tasks)

    async def close(self) -> None:
        """Cancel what still runs (the watch, a whole-shard reduction) and wait for it."""
        await cancel_all(list(self._tasks))

    # --- contributions in -----------------------------------------------------------------
    async def put_own(self, part: torch.Tensor) -> None:
        """Our own part of our shard, through the codec as the others' parts come."""
        loop = asyncio.get_running_loop()
        own = self.parts[self.me]
        for c, (a, b) in enumerate(self.chunks):  # one at a time: the senders share the pool
            await loop.run_in_executor(work_pool(), self._through_codec, part[a:b], own[a:b])
            self._chunk_in(c)
        self._add(Contribution(peer=self.me, weight=self.session.weight, values=own))

    def _through_codec(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.codec.decode_into(self.codec.encode(x), out)

    async def take_stripe(self, peer: str, head: dict, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        """Stripe ``head["stripe"]`` of ``peer``'s part (a member of our group), and on the
        same stream the same chunks of the mean back."""
        s, n, k = self.session, self.stripes, head.get("stripe")
        if peer in self.contribs or peer in self.excluded:
            await send_header(writer, {"ok": False, "reason": "membership"})
            return
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < n \
                or head.get("stripes") != n or (peer, k) in self.receiving:
            await send_header(writer, {"ok": False, "reason": "stripe"})
            return
        self.receiving.add((peer, k))
        weight = head.get("weight")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) \
                or not (math.isfinite(weight) and 0 < weight <= self.config.bounds.max_weight):
            self._abandon()  # reduce_shard excludes it: no plain mean to stream
            weight = math.nan
        if peer not in self.declared:
            self.declared[peer] = float(weight)
            self.parts[peer] = torch.empty(self.parts[self.me].numel(), dtype=torch.float32)
        values = self.parts[peer]
        await send_header(writer, {"ok": True})
        sender = asyncio.ensure_future(self._send_mean(writer, k))
        mine = self.chunks[k::n]
        try:
            if not (self.declared[peer] == weight
                    or math.isnan(self.declared[peer]) and math.isnan(weight)):
                raise ValueError("stripes declare different weights")
            self.traffic.bytes_received += await asyncio.wait_for(recv_pipelined(
                reader, [self.codec.encoded_size(b - a) for a, b in mine],
                lambda i, data: self.codec.decode_into(data, values[slice(*mine[i])]),
                on_done=lambda i: self._chunk_in(k + i * n)), s.remaining())
            self.stripes_in[peer] = self.stripes_in.get(peer, 0) + 1
            if self.stripes_in[peer] == n and peer not in self.excluded:
                self._add(Contribution(peer=peer, weight=self.declared[peer], values=values))
        except FrameError:  # longer than its codec size: the stream is out of step, drop it
            self.exclude(peer, "decode")
            await cancel_all([sender])
            raise
        except (CodecError, ValueError) as e:
            logger.warning("step %d: contribution of %s rejected: %s", s.step, peer, e)
            self.exclude(peer, "decode")
        except (asyncio.IncompleteReadError, ConnectionError):
            # the stripe broke off (the member died or dropped us): it cannot be sent again
            # (one stream per stripe), so nothing it sends can count in this attempt
            self.exclude(peer, "broken")
            await cancel_all([sender])
            raise
        except BaseException:
            await cancel_all([sender])
            raise
        await sender

    def exclude(self, peer: str, why: str) -> None:
        self.excluded.setdefault(peer, why)
        self._abandon()
        self._maybe_finish()

    # --- the mean out ---------------------------------------------------------------------
    async def mean_of(self, chunks: list[int]) -> AsyncIterator[tuple[int, bytes]]:
        """(chunk, encoded mean of it) for ``chunks``, as they become final: the plain mean's
        while it stands, then after a "redo" verdict the robust mean's (a chunk may come
        twice). StepFailed if the shard has no result."""
        s = self.session
        for c in chunks:
            data = await asyncio.wait_for(asyncio.shield(self.stream[c]), s.remaining())
            if data is None:
                break
            yield c, data
        await asyncio.wait_for(self.done.wait(), s.remaining())
        if self.verdict == "redo":
            assert self.result is not None
            for c in chunks:
                yield c, await asyncio.wait_for(asyncio.shield(self.result[c]), s.remaining())
        elif self.verdict != "ok":
            raise StepFailed("our shard has no result")

    async def _send_mean(self, writer: asyncio.StreamWriter, k: int) -> None:
        """Stripe ``k`` of the plain mean's chunks while they are valid, then the verdict
        (and that stripe of the robust mean after "redo")."""
        n = self.stripes
        for fut in self.stream[k::n]:
            data = await asyncio.wait_for(asyncio.shield(fut), self.session.remaining())
            if data is None:
                break
            await send_tagged(writer, CHUNK, data)
        await asyncio.wait_for(self.done.wait(), self.session.remaining())
        await send_tagged(writer, VERDICT, packb({"verdict": self.verdict}))
        self.traffic.mark("verdict_sent")
        if self.verdict == "redo":
            assert self.result is not None
            for res in self.result[k::n]:
                data = await asyncio.wait_for(asyncio.shield(res), self.session.remaining())
                await send_tagged(writer, CHUNK, data)

    # --- streaming the plain mean ---------------------------------------------------------
    def _chunk_in(self, c: int) -> None:
        self.have[c] += 1
        self.traffic.mark("chunk_in")
        if self.streaming and self.have[c] == self.group.size:
            job = asyncio.get_running_loop().run_in_executor(work_pool(), self._plain_chunk, c)
            job.add_done_callback(functools.partial(self._chunk_out, c))

    def _plain_chunk(self, c: int) -> tuple[bytes, tuple[dict[str, float], dict[str, float]]]:
        """Encoded plain weighted mean of chunk c, and its statistics (work pool)."""
        a, b = self.chunks[c]
        parts = {p: self.parts[p][a:b] for p in sorted(self.parts)}
        weights = capped_weights(self.declared)
        total = math.fsum(weights.values())
        mean = torch.zeros(b - a, dtype=torch.float32)
        for p, x in parts.items():
            mean.add_(x, alpha=weights[p] / total)
        return self.encode_mean(mean), chunk_stats(parts)

    def encode_mean(self, mean: torch.Tensor) -> bytes:
        """The wire bytes of (a chunk of) our shard's mean: encoded once, sent to all."""
        return self.mean_codec.encode(mean)

    def _chunk_out(self, c: int, job: asyncio.Future) -> None:  # type: ignore[type-arg]
        if job.cancelled() or job.exception() is not None or not self.streaming:
            if not job.cancelled() and job.exception() is not None:
                logger.info("step %d: plain mean of chunk %d failed: %r", self.group.step, c,
                            job.exception())
            self._abandon()
            self._maybe_finish()
            return
        data, self.stats[c] = job.result()
        self.traffic.mark("mean_ready")
        if not self.stream[c].done():
            self.stream[c].set_result(data)
            sent = (len(data) + 9) * (len(self.parts) - 1)
            self.traffic.bytes_sent += sent
            self.traffic.gather_sent += sent
        if all(st is not None for st in self.stats):
            self._maybe_finish()

    def _abandon(self) -> None:
        """Stop streaming the plain mean: a whole-shard reduction decides (verdict "redo")."""
        self.streaming = False
        for fut in self.stream:
            if not fut.done():
                fut.set_result(None)

    # --- the verdict ----------------------------------------------------------------------
    def _add(self, c: Contribution) -> None:
        self.contribs[c.peer] = c
        self._maybe_finish()

    def _maybe_finish(self, *, force: bool = False) -> None:
        if self.finishing is not None:
            return
        size = self.group.size
        if not force and len(self.contribs) + len(self.excluded) < size:
            return
        streamed = self.streaming and len(self.contribs) == size and not self.excluded
        if streamed and not all(st is not None for st in self.stats):
            if not force:
                return  # the last chunks' means are still being computed: _chunk_out calls
            self._abandon()
            streamed = False
        loop = asyncio.get_running_loop()
        self.traffic.marks["contributions_in"] = loop.time()
        if streamed and self._plain_holds():
            self.witnessed, self.clipped, self.verdict = tuple(sorted(self.contribs)), (), "ok"
            self.traffic.marks["reduced"] = self.traffic.marks["contributions_in"]
            self.done.set()
            self.finishing = loop.create_future()
            self.finishing.set_result(None)
            return
        self._abandon()
        self.finishing = self._spawn(self._finish())

    def _plain_holds(self) -> bool:
        sq: dict[str, float] = {p: 0.0 for p in self.parts}
        off: dict[str, float] = {p: 0.0 for p in self.parts}
        for st in self.stats:
            assert st is not None
            for p, v in st[0].items():
                sq[p] += v
            for p, v in st[1].items():
                off[p] += v
        cfg = self.config
        return plain_mean_holds(weights=self.declared, sq_norms=sq,
                                sq_offsets=off if len(sq) >= 3 else {},
                                max_weight=cfg.bounds.max_weight, max_norm=cfg.bounds.max_norm,
                                max_norm_ratio=cfg.bounds.max_norm_ratio, own=self.me,
                                ref_rms=self.ref_rms, numel=self.parts[self.me].numel())

    def _reduce(self, contribs: list[Contribution]) -> ShardResult:
        """Our shard's robust mean of ``contribs`` (pure; runs in the work pool)."""
        cfg = self.config.bounds
        return reduce_shard(contribs, max_weight=cfg.max_weight, max_norm=cfg.max_norm,
                            max_norm_ratio=cfg.max_norm_ratio, own=self.me,
                            ref_rms=self.ref_rms)

    async def _finish(self) -> None:
        """Whole-shard reduction: the "redo" (or "none") verdict."""
        loop = asyncio.get_running_loop()
        contribs = dict(self.contribs)  # what arrives from now on is too late for this attempt
        mean: torch.Tensor | None
        try:
            res = await loop.run_in_executor(work_pool(), self._reduce, list(contribs.values()))
            self.witnessed, self.clipped, mean = res.accepted, res.clipped, res.mean
            for peer, why in res.excluded.items():
                self.excluded.setdefault(peer, why)
        except Exception:  # noqa: BLE001 - never leave the handlers waiting
            logger.exception("step %d: reduction failed", self.group.step)
            mean = None
        for peer in self.group.members:
            if peer not in contribs and peer not in self.excluded:
                self.excluded[peer] = "missing"
        if mean is not None:  # encoded once; the pool runs the chunks roughly in order
            bounds = chunk_bounds(mean.numel())
            self.result = [loop.run_in_executor(work_pool(), self.encode_mean, mean[a:b])
                           for a, b in bounds]
            for fut in self.result:  # a cancelled attempt must not log "never retrieved"
                _quiet(fut)
            self.traffic.marks["reduced"] = loop.time()
            # counted here: our own exchange may end before the sends (a sparse mean's size
            # is bounded by, not equal to, this)
            wire = sum(self.mean_codec.encoded_size(b - a) + 9 for a, b in bounds)
            sent = (wire + 32) * len([p for p in contribs if p != self.me])
            self.traffic.bytes_sent += sent
            self.traffic.gather_sent += sent
        self.verdict = "redo" if mean is not None else "none"
        self.done.set()

    # --- members that are gone ------------------------------------------------------------
    def watch(self, at: float, peers: Peers) -> None:
        """Finish our shard at ``at`` with what came; before that, exclude members that are
        gone (``_watch``). Runs until then, or until the shard finished."""
        self._spawn(self._watch(at, peers))

    async def _watch(self, at: float, peers: Peers) -> None:
        """Members connected to our p2pd at some look during this exchange (the first look
        is at its start) or when the session opened (before the meeting: a member that died
        before our exchange started), absent from two looks in a row while their
        contribution is missing, are excluded as "gone"."""
        loop = asyncio.get_running_loop()
        seen = set(self.session.connected)
        absent: set[str] = set()
        while self.finishing is None and loop.time() < at:
            waiting = set(self.group.members) - set(self.contribs) - set(self.excluded) \
                - {self.me}
            if waiting:
                connected = await peers(GONE_PROBE_S)
                if connected is not None:  # no answer: nobody is judged gone
                    seen |= waiting & connected
                    gone = (waiting & seen) - connected
                    for peer in sorted(gone & absent):
                        logger.info("step %d: %s is gone (no connection): not waiting for "
                                    "its contribution", self.group.step, peer)
                        self.exclude(peer, "gone")
                    absent = gone
            await asyncio.sleep(max(0.0, min(GONE_PROBE_S, at - loop.time())))
        self._maybe_finish(force=True)
