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
   claim its own hash, the first in ``leader.leader_order`` leads (witnesses of our version
   first, then an unpredictable draw; one no stream opens to is skipped for the next: the
   record of a peer killed earlier at this version outlives it). Others send
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

Who does what, each an object with its inputs and outputs:

- ``AllReduce`` (here): the node's stream handlers and state transfers; opens a ``Session``
  per attempt (session.py) and hands each phase to its collaborator;
- ``Matchmaker`` (matchmaking.py): step 1, JOIN and the leader's freeze -> a frozen
  ``GroupInfo`` (group.py);
- ``Member`` (member.py): our side of steps 2-4 with every reducer;
- ``ShardReducer`` (reducer.py): our shard of the attempt, one per session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import torch

from collectives._hivemind import P2P, PeerID, list_peers, open_stream
from collectives.codec import Codec
from collectives.config import OuterConfig
from collectives.errors import StepFailed
from collectives.group import GroupInfo
from collectives.matchmaking import Matchmaker
from collectives.member import Member
from collectives.reducer import ShardReducer
from collectives.session import Session
from collectives.streams import FrameError, recv_frame, recv_header, send_frame, send_header

__all__ = ["AllReduce", "ExchangeReport", "STATE_CHUNK"]

logger = logging.getLogger(__name__)
STATE_CHUNK = 4 << 20
"""Bytes per frame of a state transfer."""
LINGER_S = 5.0
"""How long a handler waits for the caller to close first (a handler that closes right
after writing can make p2pd reset the stream and lose the reply)."""
Handler = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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
    gather_sent: int
    """Of ``bytes_sent``, the means our reducer sent (the all-gather)."""
    witnessed: frozenset[str]
    suspects: frozenset[str]
    excluded: dict[str, str]
    bad_shards: dict[str, str]
    clipped: tuple[str, ...]
    marks: dict[str, float]


class AllReduce:
    """One node's all-reduce endpoint (runs on the transport's asyncio thread): the stream
    handlers, the current attempt's ``Session``, and the phases' collaborators."""

    def __init__(self, p2p: P2P, config: OuterConfig, codec: Codec, *, peer_id: str, gid: str,
                 state_provider: Callable[[str], bytes | None]) -> None:
        self.p2p, self.config, self.codec, self.peer_id = p2p, config, codec, peer_id
        self.names = {k: f"/swarm-node/outer/{gid}/{k}/5" for k in ("join", "reduce", "state")}
        self.state_provider = state_provider
        """hash -> the serialized state if we hold it (cached per hash by the provider)."""
        self.matchmaker = Matchmaker(p2p, config, peer_id=peer_id, protocol=self.names["join"])
        self.member = Member(p2p, config, codec, peer_id=peer_id, protocol=self.names["reduce"])
        self.session: Session | None = None
        self._shards: list[ShardReducer] = []
        """Our reducers of recent attempts (one may still finish for the others)."""
        self.mean_rms = 0.0
        """Root mean square of the last mean whose shards all passed the member's check."""
        self.rejected = 0
        self.state_refused = 0
        """State requests refused by the per-peer rate limit."""
        self._state_limit = RateLimit(config.catchup.requests_per_minute)
        self._state_slots = asyncio.Semaphore(2)

    async def start(self) -> None:
        await self.p2p.add_binary_stream_handler(self.names["join"], self._guard(self._on_join))
        await self.p2p.add_binary_stream_handler(self.names["reduce"],
                                                 self._guard(self._on_reduce))
        await self.p2p.add_binary_stream_handler(self.names["state"], self._guard(self._on_state))

    async def close(self) -> None:
        """End what our reducers still run (a watch, a whole-shard reduction) and wait."""
        shards, self._shards = self._shards, []
        for shard in shards:
            await shard.close()

    def _guard(self, handler: Handler) -> Callable[[Any, asyncio.StreamReader,
                                                    asyncio.StreamWriter], Awaitable[None]]:
        async def wrapped(info: Any, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
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
        self._shards = [sh for sh in self._shards if sh.busy]
        self.session = s = Session(step=step, state_hash=state_hash, numel=numel,
                                   weight=weight, deadline=deadline,
                                   group=loop.create_future())
        s.connected = await self._peers(1.0) or set()

    def _current(self, step: object) -> Session | None:
        s = self.session
        return s if s is not None and s.step == step else None

    def shard(self, s: Session, group: GroupInfo) -> ShardReducer:
        """Our reducer of this attempt (set up by whichever comes first: our exchange or a
        member's stream)."""
        if s.shard is None:
            s.shard = ShardReducer(self.config, self.codec, me=self.peer_id, session=s,
                                   group=group, ref_rms=self.mean_rms)
            self._shards.append(s.shard)
        return s.shard

    async def _peers(self, timeout: float) -> set[str] | None:
        """The peers p2pd holds a connection to (None if it did not answer in time)."""
        try:
            return {p.peer_id.to_base58() for p in await asyncio.wait_for(
                list_peers(self.p2p), timeout)}
        except Exception as e:  # noqa: BLE001
            logger.debug("p2pd's peers not listed: %r", e)
            return None

    # --- the phases -----------------------------------------------------------------------
    async def form_group(self, order: list[str], *, freeze_at: float, latest: float,
                         reply_by: float | None = None, deadline: float | None = None,
                         no_wait: frozenset[str] = frozenset(),
                         refuse: frozenset[str] = frozenset(),
                         lead_if_joined: bool = False) -> GroupInfo:
        """This attempt's group (``Matchmaker.form_group``; ``reply_by`` defaults to the
        session's end) or StepFailed. ``deadline``: the attempt's new end (a meeting on the
        clock counts it from the read)."""
        s = self.session
        assert s is not None
        if deadline is not None:
            s.deadline = deadline
        return await self.matchmaker.form_group(
            s, order, freeze_at=freeze_at, latest=latest,
            reply_by=s.deadline if reply_by is None else reply_by, no_wait=no_wait,
            refuse=refuse, lead_if_joined=lead_if_joined)

    async def exchange(self, delta: torch.Tensor, group: GroupInfo, *, reduce_deadline: float,
                       out: torch.Tensor | None = None,
                       on_landed: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """The group's mean of ``delta`` (``Member.exchange``) or StepFailed."""
        s = self.session
        assert s is not None and s.group.done() and s.group.result() == group
        got = await self.member.exchange(s, group, self.shard(s, group), delta,
                                         reduce_deadline=reduce_deadline,
                                         mean_rms=self.mean_rms, peers=self._peers, out=out,
                                         on_landed=on_landed)
        if got.rms is not None:
            self.mean_rms = got.rms
        return got.mean

    async def refuse_joins(self) -> None:
        """A meeting we let pass: a peer that JOINs us gets "not admitted" at once."""
        self.matchmaker.refuse(self.session)

    async def report(self) -> ExchangeReport | None:
        """What this attempt's exchange did, as the asyncio thread sees it (None: no session)."""
        s = self.session
        if s is None:
            return None
        formed = s.group.done() and not s.group.cancelled() and s.group.exception() is None
        group = s.group.result() if formed else None
        shard = s.shard
        return ExchangeReport(
            nonce=group.nonce if group is not None else "",
            bytes_sent=s.traffic.bytes_sent, bytes_received=s.traffic.bytes_received,
            gather_sent=s.traffic.gather_sent,
            witnessed=frozenset(shard.witnessed if shard else ()),
            suspects=frozenset(s.suspects),
            excluded=dict(shard.excluded if shard else {}), bad_shards=dict(s.bad_shards),
            clipped=tuple(shard.clipped if shard else ()), marks=dict(s.traffic.marks))

    # --- handlers -------------------------------------------------------------------------
    async def _on_join(self, peer: str, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        req = await asyncio.wait_for(recv_header(reader), 10)
        await self.matchmaker.on_join(self._current(req.get("step")), peer, req, writer)

    async def _on_reduce(self, peer: str, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(recv_header(reader), 10)
        s = self._current(head.get("step"))
        if s is None:
            await send_header(writer, {"ok": False, "reason": "step"})
            return
        group = await asyncio.wait_for(asyncio.shield(s.group), s.remaining())
        if head.get("digest") != group.digest or peer not in group.members \
                or peer == self.peer_id:
            await send_header(writer, {"ok": False, "reason": "membership"})
            return
        await self.shard(s, group).take_stripe(peer, head, reader, writer)

    async def _on_state(self, peer: str, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
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
