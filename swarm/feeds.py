"""Rollout feeds: each node receives rollouts from k sources it chose, rotating (issue 15).

Flooding rollouts on one gossip topic costs every node O(N · D) messages per round (every
batch of every peer, plus the mesh's duplicate copies). SAPO needs only a few external groups
per round, so a node subscribes instead to ``feeds.sources`` = k peers of its own choosing:

- **Feed** (``FEED_PROTOCOL``): a libp2p stream the *receiver* opens. It sends one frame, the
  swarm id (with ``/live`` appended when no backfill is wanted); the source answers ``OK`` or
  ``BUSY``, then pushes every rollout batch it publishes itself (the exact sealed envelope,
  signed once) as one varint-framed message. A source never relays: one hop, no duplicates.
- **Choice** (``FeedClient``): sources are picked uniformly at random among live, announced,
  non-bootstrap, non-banned peers that are neither current sources nor cooling down. Every
  ``feeds.rotate_s`` a replacement source is picked and its feed opened *beside* the oldest;
  the oldest is closed (its source *rests*, i.e. is picked again only when no unrested
  candidate is left) the moment the replacement is open, so the slot has no gap and a rotation
  loses no batch without any backfill. A node samples the whole swarm over time and no source
  is held longer than about k · ``feeds.rotate_s``. Peers never suggest sources, and nothing
  arrives on a feed we did not open.
- **Delivery decides, not keys** (issue 32): a uniform pick over keys gives a farm of fresh
  identities the share of slots it has of the table (measured: ~90 %). The learner reports
  once a round what each sender delivered after *its own* re-scoring (``rate``: the IPC op
  ``sources``), and ``swarm.feed_standing`` makes each source proven (it delivered groups
  with signal), live (valid groups, no signal yet: an honest node whose model has not taken
  off) or a stranger, and closes the feeds that hold a slot for nothing. Once the learner
  reports, ``feeds.sources − feeds.explore_slots`` slots go to the best sources known
  (proven, then live) and the rest to strangers, uniformly (never-held keys do not go
  first). A rotation replaces a stranger with whoever the slots need, a live or proven
  source only with a proven one. A stranger's feed that brings no frame in
  ``feeds.probe_rounds`` reports, or no valid group in ``feeds.trial_rounds`` (either never
  sooner than 3 of the swarm's publishing intervals, at most ``feeds.probe_s``), is closed
  at once and its source cooled longer each time; a known source's only while another feed
  delivers. While no feed delivers at all (every one silent for that wait), a rotation comes
  every wait instead of every ``feeds.rotate_s``. While our own groups carry signal and no
  held feed brings any (``Standing.searching``: every source we hold is behind or hostile),
  each slot not held by a proven source tries a stranger (never-held ones first) for one
  wait (``_search``). So keys that deliver nothing hold only the slots nobody better
  fills, each for a few seconds, and an honest source is kept from its first valid group,
  before its groups carry signal (what made it lose its slot to rotation or to an 8-round
  trial before).
  Before any report (a swarm process without a learner) every pick is uniform, as before.
- **Networks, not keys** (``swarm.networks``): keys are free, addresses are not. A network (an
  IPv4 /24, an IPv6 /48, a relay; loopback is none unless ``feeds.loopback_networks``) whose
  sources hold ``feeds.max_per_network`` slots gets no more while candidates elsewhere are
  left, placed by the address of the connection a feed runs on (a source that announced an
  address elsewhere is closed at once when its connection shows it in a full network,
  ``feed_network_full``). A farm of any number of keys on one machine or one /24 then
  holds at most that many of a node's slots, whatever it delivers.
- **Backfill**: a subscription asks for the source's newest batch (if younger than
  ``feeds.backfill_s``) only when it fills a gap: at start and after a feed failed. A rotation
  asks for live batches only (``/live`` after the swarm id): its slot had none missing, and a
  backfilled batch is up to a round old when it arrives (in gossip_bench, where a round is
  1 s, those were the whole latency tail: issue 15).
- **Budgets** (``FeedServer``): at most ``feeds.max_subscribers`` feeds served at once, one
  per peer; subscription requests per peer through a token bucket; a queue of ``feeds.queue``
  batches per subscriber, dropped from (``dropped_feed_slow``) rather than waited for; a write
  that stalls ``feeds.write_timeout_s`` ends that feed. On the receiving side a frame is read
  with the envelope size limit, then checked by ``swarm.validation`` (signature once, per-
  sender token bucket, replay window) with the stream's authenticated peer as the required
  signer; a frame that is invalid (not merely rate-limited or stale) closes the feed and
  cools its source down for ``feeds.cooldown_s``, as does a refusal or a failure.
- **Resubscription**: a feed whose stream ends (EOF, reset) while its source is still
  connected is opened again at once on that connection, in the same slot and trial, asking
  for the newest batch: what happens when hole punching (swarm.holepunch) replaces the
  relayed connection the stream ran on by a direct one (waiting for the failure cool-down
  lost ~10 batches there). Once per source per ``feeds.cooldown_s``: a source that keeps
  ending its streams takes the failure path (cooled, ``RETRY_S`` doubling), so it costs us
  at most one extra stream per cool-down and its own per-peer request budget still applies.

Inbound rollouts per node are therefore at most k feeds × the per-sender rate, whatever the
swarm size; see ``swarm/SCALING.md`` for the bounds, what is not claimed (the pick is uniform
over keys), and the parameters used by the simulation.
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.io.exceptions import IOException, MsgioException
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from protocol import Limits
from swarm.config import GossipConfig
from swarm.feed_standing import Kind, Standing, Trial
from swarm.networks import Networks
from swarm.peers import PeerTable
from swarm.ratelimit import TokenBuckets
from swarm.relay import is_circuit

__all__ = ["BUSY", "FEED_PROTOCOL", "LIVE", "OK", "FeedClient", "FeedServer"]

logger = logging.getLogger(__name__)

FEED_PROTOCOL = TProtocol("/swarm-node/feed/1.0.0")
OK = b"ok"
BUSY = b"busy"
LIVE = b"/live"
"""Appended to the swarm id in a request: no backfill (swarm ids contain no '/')."""
MAX_REQUEST = 128
"""Bytes of a subscription request (the swarm id, at most 64 characters, and ``LIVE``)."""
HANDSHAKE_TIMEOUT_S = 10.0
"""Request and answer of a subscription, once the stream is open (a loaded 2-core box with
6 node processes took up to 10 s to open a stream: measured)."""
TICK_S = 0.5
"""Period of the client's maintenance (replace lost feeds, rotate)."""
OPENS_PER_TICK = 2
"""Feeds started per tick: at start-up, k feeds at once from every node crowd the event loops."""
RETRY_S = 5.0
"""First cool-down of a source that failed or refused; doubles per failure up to
``feeds.cooldown_s`` (an invalid frame gets the full cool-down at once)."""

FrameHandler = Callable[[ID, bytes], bool]
"""Called with (source, frame); returns False when the feed must be closed (invalid frame)."""


def _ended(error: BaseException) -> bool:
    """Whether ``error`` means the stream ended (EOF, reset, its connection closed), rather
    than that the source sent something wrong (an oversized or garbled frame)."""
    return isinstance(error, (IOException, EOFError)) and not isinstance(error, MsgioException)


def _connected(host: IHost, peer: ID) -> bool:
    """Whether ``peer`` holds a connection with us that is not closing. (A stream ends a
    moment before the host drops the connection it ran on: ``get_connected_peers`` still
    lists a peer that has just gone.)"""
    return any(not (conn.is_closed or conn.muxed_conn.is_closed)
               for conn in host.get_network().get_connections(peer))


async def _close(stream: INetStream, *, reset: bool = False) -> None:
    try:
        if reset:
            await stream.reset()
        else:
            await stream.close()
    except Exception as e:  # already reset or torn down by the peer: nothing to do
        logger.debug("closing a feed stream: %s", e)


@dataclass(kw_only=True)
class FeedServer:
    """Serves this node's own rollout batches to the peers that subscribed."""

    config: GossipConfig
    counters: collections.Counter[str]
    is_banned: Callable[[ID], bool] = lambda _peer: False
    _subs: dict[ID, trio.MemorySendChannel[bytes]] = field(default_factory=dict, repr=False)
    _latest: tuple[float, bytes] | None = field(default=None, repr=False)
    _buckets: TokenBuckets | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._buckets = TokenBuckets(rate=self.config.feeds.subscribe_per_s,
                                     burst=self.config.feeds.subscribe_burst)

    def subscribers(self) -> int:
        return len(self._subs)

    def publish(self, data: bytes) -> int:
        """Queue a sealed batch for every subscriber; the number it was queued for."""
        self._latest = (trio.current_time(), data)
        sent = 0
        for send in list(self._subs.values()):
            try:
                send.send_nowait(data)
                sent += 1
            except trio.WouldBlock:
                self.counters["dropped_feed_slow"] += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the feed is ending; its task removes it
        self.counters["feed_sent"] += sent
        return sent

    async def handle(self, stream: INetStream) -> None:
        """Stream handler of FEED_PROTOCOL: one subscriber, until it or we stop."""
        peer = stream.muxed_conn.peer_id
        assert self._buckets is not None
        if self.is_banned(peer):
            self.counters["rejected_banned_peer"] += 1
            await _close(stream, reset=True)
            return
        if not self._buckets.take(str(peer), trio.current_time()):
            self.counters["rejected_feed_request_rate"] += 1
            await _close(stream, reset=True)
            return
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                request = await read_varint_prefixed_bytes_limited(stream, MAX_REQUEST)
        except Exception as e:  # timeout, oversized, EOF, reset: all end this request
            self.counters["rejected_feed_bad_request"] += 1
            logger.debug("feed request from %s: %s", peer, e)
            await _close(stream, reset=True)
            return
        swarm = self.config.swarm_id.encode()
        if request not in (swarm, swarm + LIVE):
            self.counters["rejected_feed_bad_request"] += 1
            await _close(stream, reset=True)
            return
        backfill = request == swarm
        old = self._subs.pop(peer, None)
        if old is not None:  # a re-subscription replaces the peer's previous feed
            old.close()
        if len(self._subs) >= self.config.feeds.max_subscribers:
            self.counters["feed_busy"] += 1
            try:
                await stream.write(encode_varint_prefixed(BUSY))
            except Exception as e:
                logger.debug("feed refusal to %s: %s", peer, e)
            await _close(stream)
            return
        send, recv = trio.open_memory_channel[bytes](self.config.feeds.queue)
        self._subs[peer] = send
        self.counters["feed_subscribers_accepted"] += 1
        try:
            await self._serve(stream, recv, backfill)
        except Exception as e:  # the subscriber left or stalled
            logger.debug("feed to %s ended: %s: %s", peer, type(e).__name__, e)
        finally:
            if self._subs.get(peer) is send:
                del self._subs[peer]
            send.close()
            await _close(stream)

    async def _serve(self, stream: INetStream, recv: trio.MemoryReceiveChannel[bytes],
                     backfill: bool) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._until_closed, stream, nursery.cancel_scope)
            await self._push(stream, recv, backfill)
            nursery.cancel_scope.cancel()

    async def _until_closed(self, stream: INetStream, scope: trio.CancelScope) -> None:
        """A subscriber sends nothing after its request: EOF, a reset or any byte ends the
        feed at once, freeing its slot (else only the next write would notice)."""
        try:
            await stream.read(1)
        except Exception as e:
            logger.debug("feed subscriber closed: %s", e)
        scope.cancel()

    async def _push(self, stream: INetStream, recv: trio.MemoryReceiveChannel[bytes],
                    backfill: bool) -> None:
        timeout = self.config.feeds.write_timeout_s
        with trio.fail_after(timeout):
            await stream.write(encode_varint_prefixed(OK))
        latest = self._latest
        if backfill and latest is not None and \
                trio.current_time() - latest[0] <= self.config.feeds.backfill_s:
            with trio.fail_after(timeout):
                await stream.write(encode_varint_prefixed(latest[1]))
            self.counters["feed_backfilled"] += 1
        async for data in recv:
            with trio.fail_after(timeout):
                await stream.write(encode_varint_prefixed(data))


@dataclass
class _Feed:
    peer: ID
    started: float
    scope: trio.CancelScope
    open: bool = False
    replaces: ID | None = None
    """A rotation's new feed: the feed it closes once open (it asks for no backfill)."""
    trial: Trial | None = None
    """Its record since it opened (``swarm.feed_standing``); None until open."""
    network: str | None = None
    """Its connection's network (``swarm.networks``), once the stream is open."""


@dataclass(kw_only=True)
class FeedClient:
    """Holds ``feeds.sources`` feeds to peers it picks from the table, and rotates them."""

    config: GossipConfig
    host: IHost
    table: PeerTable
    counters: collections.Counter[str]
    on_frame: FrameHandler
    is_banned: Callable[[ID], bool] = lambda _peer: False
    dial: Callable[[PeerInfo], Awaitable[bool]] | None = None
    """Connects to a source we hold no connection to; True when connected (the service's
    ``Dialer.dial``: through a relay for a peer that announces only ``p2p-circuit``
    addresses, which ``host.connect`` drops in py-libp2p 0.8.1). None: ``host.connect``."""
    rng: random.Random = field(default_factory=random.Random)
    limits: Limits = field(default_factory=Limits)
    _feeds: dict[ID, _Feed] = field(default_factory=dict, repr=False)
    _cooldown: dict[ID, float] = field(default_factory=dict, repr=False)
    _rested: dict[ID, float] = field(default_factory=dict, repr=False)
    _failures: dict[ID, int] = field(default_factory=dict, repr=False)
    _resubscribed: dict[ID, float] = field(default_factory=dict, repr=False)
    """When each source's feed was last opened again at once (``_may_resubscribe``)."""
    _last_rotation: float = field(default=0.0, repr=False)
    _networks: dict[ID, str | None] = field(default_factory=dict, repr=False)
    """The network of each source we held a connection to (its last feed's)."""
    _self: ID | None = field(default=None, repr=False)
    standing: Standing = field(init=False, repr=False)
    networks: Networks = field(init=False, repr=False)

    def __post_init__(self) -> None:
        feeds = self.config.feeds
        self.networks = Networks(prefix_v4=feeds.network_prefix_v4,
                                 prefix_v6=feeds.network_prefix_v6,
                                 loopback=feeds.loopback_networks)
        self.standing = Standing(trial_rounds=feeds.trial_rounds,
                                 probe_rounds=feeds.probe_rounds, probe_s=feeds.probe_s,
                                 capacity=self.table.capacity)

    def sources(self) -> list[str]:
        """Peer ids of the feeds open now."""
        return [str(f.peer) for f in self._feeds.values() if f.open]

    def kinds(self) -> dict[str, int]:
        """Open feeds by their source's kind (``proven``, ``live``, ``trial``: see
        swarm.feed_standing), and ``idle``: those among them holding the slot for nothing
        now (no valid group in the last reports)."""
        out = {kind.label: 0 for kind in Kind}
        for f in self._feeds.values():
            if f.open:
                out[self._kind(f.peer).label] += 1
        out["idle"] = sum(self.standing.idle(f.trial) for f in self._feeds.values()
                          if f.open and f.trial is not None) if self.standing.reports else 0
        return out

    def rate(self, delivered: dict[str, int], valid: dict[str, int] | None = None,
             own: int | None = None) -> None:
        """The learner's report of one round (see the module docstring): sender -> groups
        it delivered that carried signal (``delivered``) and that passed re-scoring
        (``valid``; None from a learner that does not report it: the signal counts), and
        our own local groups that carried signal (``own``; None: not reported). Closes the
        feeds ``Standing.judge`` finds idle or without signal."""
        self.standing.report(delivered, delivered if valid is None else valid,
                             trio.current_time(), own)
        trials = {str(f.peer): f.trial for f in self._feeds.values()
                  if f.open and f.trial is not None}
        self.counters["feed_idle_slot_rounds"] += sum(map(self.standing.idle, trials.values()))
        feeds = {str(f.peer): f for f in self._feeds.values()}
        for key, verdict in self.standing.judge(trials, trio.current_time()).items():
            feed = feeds[key]
            strikes = self.standing.dropped(key, verdict)
            self._cool(feed.peer, verdict.value, strikes=strikes)
            logger.info("feed from %s closed (%s) after %d rounds", key, verdict.name.lower(),
                        self.standing.reports - trials[key].opened)
            feed.scope.cancel()

    def _kind(self, peer: ID) -> Kind:
        return self.standing.kind(str(peer))

    def _want(self, held: list[_Feed]) -> Kind | None:
        """The kind the next slot needs, beside ``held``: ``LIVE`` (the best known source)
        while fewer than ``feeds.sources − feeds.explore_slots`` live or proven sources are
        held (by ``Standing.rank``: while signal flows, proven ones), else ``STRANGER``
        (exploration); None before the learner's first report: any. Counting held live
        sources while signal flows (keys of an all-wrong farm among them), a free slot went
        to strangers only, even while a proven source was free."""
        if not self.standing.reports:
            return None
        reserved = self.config.feeds.sources - self.config.feeds.explore_slots
        known = sum(self.standing.rank(str(f.peer)) >= Kind.LIVE for f in held)
        return Kind.LIVE if known < reserved else Kind.STRANGER

    async def run(self, self_id: ID) -> None:
        self._self = self_id
        self._last_rotation = trio.current_time()
        async with trio.open_nursery() as nursery:
            while True:
                self._maintain(self_id, nursery)
                await trio.sleep(TICK_S)

    def _maintain(self, self_id: ID, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        self._cooldown = {p: t for p, t in self._cooldown.items() if t > now}
        k = self.config.feeds.sources
        open_ = [f for f in self._feeds.values() if f.open and f.replaces is None]
        rotating = any(f.replaces is not None for f in self._feeds.values())
        # rotate only a full set of open feeds: while opens fail (a loaded box), rotating too
        # would only add dials. The replacement opens beside the feed it replaces (make
        # before break)
        starved = self._starved(open_, now)
        period = min(self.config.feeds.rotate_s, self.standing.wait_s()) if starved \
            else self.config.feeds.rotate_s
        due = now - self._last_rotation >= period
        searching = self.standing.searching(f.trial for f in open_)
        if not rotating and len(open_) >= k and (due or searching):
            rotation = self._search(self_id, open_, now) if searching else None
            if rotation is not None:
                self.counters["feed_search_rotations"] += 1
            elif due:
                rotation = self._rotation(self_id, open_, starved=starved)
            if rotation is not None:
                old, new = rotation
                self._start(new, nursery, now, replaces=old.peer)
            if due or rotation is not None:
                self._last_rotation = now  # a failed replacement is retried next period
        # a replacement whose old feed already ended holds that slot itself
        slots = sum(f.replaces is None or f.replaces not in self._feeds
                    for f in self._feeds.values())
        for _ in range(min(OPENS_PER_TICK, k - slots)):
            info = self._pick(self_id, want=self._want(list(self._feeds.values())))
            if info is None:
                break
            self._start(info, nursery, now)

    def _starved(self, open_: list[_Feed], now: float) -> bool:
        """Nothing arrives (``Standing.starved``): a rotation comes every wait instead of
        every ``feeds.rotate_s``, and a silent live source rotates after the wait and 3 of
        its own gaps between frames (measured: 50 keys sending valid all-wrong groups that
        the shared re-scoring budget mostly left unchecked held every slot of a node as
        silent live sources for 25 of its 60 rounds, with two honest peers among 52 and one
        rotation per 10 s). A dial per wait is all it costs, and only while nothing arrives."""
        return self.standing.starved([f.trial for f in open_], now)

    def _search(self, self_id: ID, open_: list[_Feed], now: float
                ) -> tuple[_Feed, PeerInfo] | None:
        """While ``Standing.searching`` (our own groups carry signal, no feed we hold brings
        any): the oldest feed whose source is not proven and that has been open for the
        wait, and a stranger to replace it (candidates by ``Standing.rank``: our signal
        flows, so a live one is a stranger). Every such slot is tried for one wait, not one
        per ``feeds.rotate_s``: a node that joined where a farm of 50 keys already sat
        found neither of its two honest peers in 60 rounds (module docstring)."""
        wait = self.standing.wait_s()
        for feed in sorted(open_, key=lambda f: f.started):
            if feed.trial is None or self._kind(feed.peer) is Kind.PROVEN \
                    or now - feed.trial.opened_s < wait:
                continue
            info = self._pick(self_id, want=Kind.STRANGER, unrested=True)
            return (feed, info) if info is not None else None
        return None

    def _rotation(self, self_id: ID, open_: list[_Feed], *,
                  starved: bool = False) -> tuple[_Feed, PeerInfo] | None:
        """The feed a rotation replaces, and by whom: the oldest that can be replaced. A
        stranger's, or a live source's silent for ``feeds.probe_s`` (``starved``: for the
        wait and 3 of its own gaps between frames: ``Standing.silent``), by the kind the
        slots need without it; a live or proven source's only by a proven one (a source that
        delivers is not traded for one that may not), except, when live and proven sources
        hold more than the ``feeds.sources − feeds.explore_slots`` reserved slots, the live
        one that delivered least recently: the exploration slots always rotate (measured:
        four keys that each sent one valid batch held all four slots as live sources, and
        nothing rotated). Before the learner reports: the oldest, by anyone."""
        by_age = sorted(open_, key=lambda f: f.started)
        if not self.standing.reports:
            info = self._pick(self_id)
            return (by_age[0], info) if info is not None else None
        reserved = self.config.feeds.sources - self.config.feeds.explore_slots
        live = [f for f in open_ if self._kind(f.peer) is Kind.LIVE and f.trial is not None]
        stalest = min(live, key=lambda f: (f.trial.valid_grew if f.trial else 0, f.started)) \
            if live and sum(self._kind(f.peer) >= Kind.LIVE for f in open_) > reserved else None
        for feed in by_age:
            # a live source silent for feeds.probe_s and probe_rounds reports is rotated
            # like a stranger (measured: keys that trickle one valid batch every 15 s held
            # every slot while no signal flowed, and only the stalest rotated)
            silent = feed.trial is not None and self.standing.silent(
                str(feed.peer), feed.trial, trio.current_time(), starved=starved)
            if feed is stalest or silent or self._kind(feed.peer) is Kind.STRANGER:
                held = [f for f in self._feeds.values() if f is not feed]
                info = self._pick(self_id, want=self._want(held))
            else:
                info = self._pick(self_id, want=Kind.PROVEN, at_least=Kind.PROVEN)
            if info is not None:
                return feed, info
        return None

    def _start(self, info: PeerInfo, nursery: trio.Nursery, now: float, *,
               replaces: ID | None = None) -> None:
        feed = _Feed(peer=info.peer_id, started=now, scope=trio.CancelScope(), replaces=replaces)
        self._feeds[info.peer_id] = feed
        nursery.start_soon(self._follow, info, feed)

    def _opened(self, feed: _Feed) -> None:
        """``feed`` is open (its trial starts): if it is a rotation's, close the feed it
        replaces now."""
        feed.open = True
        feed.trial = self.standing.open(str(feed.peer), trio.current_time())
        self._failures.pop(feed.peer, None)
        self.counters["feed_opened"] += 1
        logger.debug("feed from %s open (%d open, %s)", feed.peer, len(self.sources()),
                     feed.trial.kind.label)
        old_peer, feed.replaces = feed.replaces, None
        old = self._feeds.get(old_peer) if old_peer is not None else None
        if old is None or old_peer is None:
            return
        old.scope.cancel()
        del self._feeds[old_peer]
        now = trio.current_time()
        self._rested[old_peer] = now
        if len(self._rested) > self.table.capacity:  # bounded: forget the longest rested
            del self._rested[min(self._rested, key=self._rested.__getitem__)]
        self.counters["feed_rotated"] += 1

    def _pick(self, self_id: ID, *, want: Kind | None = None, at_least: Kind | None = None,
              unrested: bool = False) -> PeerInfo | None:
        """A uniform pick. ``want`` None (the learner never reported): among unrested
        candidates, else among rested ones. ``STRANGER``: among the sources that showed
        nothing yet (never-held keys do not go first: that handed the slots to a farm that
        mints them), else as ``LIVE``. ``LIVE`` or ``PROVEN``: among the candidates of the
        best kind there is, at least ``at_least`` (else None: an empty slot helps nobody,
        but a rotation keeps what it has). Candidates rank by ``Standing.rank``: while
        signal flows, a live one is a stranger. ``unrested`` (``_search``): strangers we
        never held (or rested longest ago) first, so a search tries every key once before
        any twice. Before all that, candidates in networks that hold their slots already
        are left out while others remain (``_spread``)."""
        candidates = self._spread(self._candidates(self_id))
        if want is None:
            fresh: list[PeerInfo] = []
            rested: list[PeerInfo] = []
            for info in candidates:
                (rested if info.peer_id in self._rested else fresh).append(info)
            pool = fresh or rested
        else:
            by_kind: dict[Kind, list[PeerInfo]] = collections.defaultdict(list)
            for info in candidates:
                by_kind[self.standing.rank(str(info.peer_id))].append(info)
            floor = Kind.STRANGER if at_least is None else at_least
            best = max((k for k in by_kind if k >= floor), default=None)
            pool = by_kind[Kind.STRANGER] if want is Kind.STRANGER and at_least is None \
                else []
            if unrested:
                pool = [i for i in pool if i.peer_id not in self._rested] or pool
            if not pool and best is not None:
                pool = by_kind[best]
        if not pool:
            return None
        return pool[self.rng.randrange(len(pool))]

    def _full(self, *, besides: _Feed | None = None) -> set[str]:
        """Networks whose open feeds (``besides`` not counted, nor the feed a rotation
        replaces: it closes as its replacement opens) hold ``feeds.max_per_network`` slots;
        none without a cap."""
        cap = self.config.feeds.max_per_network
        if not cap:
            return set()
        leaving = {f.replaces for f in self._feeds.values() if f.replaces is not None}
        held = collections.Counter(
            f.network for f in self._feeds.values()
            if f.open and f is not besides and f.peer not in leaving and f.network is not None)
        return {net for net, n in held.items() if n >= cap}

    def _placed(self, info: PeerInfo) -> set[str | None]:
        """The networks ``info`` may be in: that of our last connection to it, else those of
        the addresses it announces (swarm.networks)."""
        if info.peer_id in self._networks:
            return {self._networks[info.peer_id]}
        return {self.networks.of_addr(a) for a in info.addrs} or {None}

    def _elsewhere(self, pool: list[PeerInfo], full: set[str]) -> list[PeerInfo]:
        """The candidates of ``pool`` that may be in a network not in ``full``."""
        return [i for i in pool if not self._placed(i) <= full]

    def _spread(self, pool: list[PeerInfo]) -> list[PeerInfo]:
        """``pool`` without the candidates whose every network is full (``_full``), unless
        that leaves none: a farm of keys in one network holds at most
        ``feeds.max_per_network`` slots while sources elsewhere are left to pick."""
        full = self._full()
        return (self._elsewhere(pool, full) or pool) if full else pool

    def _network_full(self, feed: _Feed, stream: INetStream) -> bool:
        """Records the network ``feed``'s stream runs on; True when that network already
        holds its slots (``_full``) while a candidate elsewhere is left: the feed is not
        opened (its source was placed by the addresses it announced, not where it is)."""
        net = feed.network = self.networks.of_stream(stream, self.host)
        self._networks.pop(feed.peer, None)  # newest last: the oldest is forgotten first
        self._networks[feed.peer] = net
        if len(self._networks) > self.table.capacity:
            del self._networks[next(iter(self._networks))]
        full = self._full(besides=feed)
        if net is None or net not in full or self._self is None:
            return False
        if not self._elsewhere(self._candidates(self._self), full):
            return False
        self._cool(feed.peer, "feed_network_full")
        logger.info("feed from %s not opened: its network %s holds %d slots already",
                    feed.peer, net, self.config.feeds.max_per_network)
        return True

    def _candidates(self, self_id: ID) -> list[PeerInfo]:
        out = []
        for ann in self.table.live():
            if ann.bootstrap_only or ann.peer_id == str(self_id):
                continue
            try:
                pid = ID.from_base58(ann.peer_id)
            except Exception:  # the validator checked the signer; be safe anyway
                continue
            if pid in self._feeds or pid in self._cooldown or self.is_banned(pid):
                continue
            addrs = []
            for text in ann.addrs:
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(text))
                except Exception:  # an unparsable address is skipped, not fatal
                    continue
                if info.peer_id == pid:
                    addrs.extend(info.addrs)
            if addrs:
                out.append(PeerInfo(pid, addrs))
        return out

    async def _connect(self, info: PeerInfo) -> bool:
        if self.dial is not None:
            return await self.dial(info)
        try:
            with trio.fail_after(self.config.peers.dial_timeout_s):
                await self.host.connect(info)
        except Exception as e:  # py-libp2p raises many unrelated types for one failed dial
            logger.debug("feed dial to %s failed: %s: %s", info.peer_id, type(e).__name__, e)
            return False
        return True

    def _cool(self, peer: ID, counter: str, *, full: bool = False, strikes: int = 0) -> None:
        """Not picked again for a while: the full ``feeds.cooldown_s`` after an invalid frame,
        else ``RETRY_S`` doubled per consecutive failure, or per idle strike (``strikes``:
        consecutive idle drops, which a reopened feed does not reset), capped at
        ``feeds.cooldown_s``."""
        self.counters[counter] += 1
        if len(self._failures) > self.table.capacity:
            self._failures.clear()  # bounded memory; forgetting only shortens cool-downs
        n = self._failures[peer] = self._failures.get(peer, 0) + 1
        wait = self.config.feeds.cooldown_s if full else \
            min(self.config.feeds.cooldown_s, RETRY_S * 2 ** (max(n, strikes) - 1))
        self._cooldown[peer] = trio.current_time() + wait

    async def _follow(self, info: PeerInfo, feed: _Feed) -> None:
        peer = info.peer_id
        try:
            with feed.scope:
                # a stranger is asked for its newest batch even on a rotation: an honest
                # source answers at once, which is what its probe looks for
                stream = await self._open(info, backfill=feed.replaces is None or (
                    self.standing.reports > 0 and self._kind(peer) is Kind.STRANGER))
                if stream is None:
                    return
                if self._network_full(feed, stream):
                    with trio.CancelScope(shield=True):
                        await _close(stream)
                    return
                self._opened(feed)
                while stream is not None:
                    try:
                        await self._receive(feed, stream)
                        return  # an invalid frame: its source is cooled down
                    except Exception as e:
                        if not self._may_resubscribe(peer, e):
                            raise
                        logger.info("feed from %s: its stream ended (%s) while still "
                                    "connected; subscribing again", peer, type(e).__name__)
                    finally:
                        with trio.CancelScope(shield=True):
                            await _close(stream)
                    stream = await self._resubscribe(info)
        except Exception as e:  # EOF, reset, oversized frame, dial failure: try another source
            self._cool(peer, "feed_failed")
            logger.debug("feed from %s ended: %s: %s", peer, type(e).__name__, e)
        finally:
            if self._feeds.get(peer) is feed:
                del self._feeds[peer]

    async def _receive(self, feed: _Feed, stream: INetStream) -> None:
        """Hand every frame of ``stream`` to ``on_frame``; returns at the first invalid one
        (its source cooled down), raises when the stream ends."""
        peer = feed.peer
        while True:
            data = await read_varint_prefixed_bytes_limited(stream, self.limits.max_message_bytes)
            self.counters["feed_frames"] += 1
            if feed.trial is not None:
                feed.trial.frames += 1
            if not self.on_frame(peer, data):
                self._cool(peer, "feed_closed_invalid", full=True)
                return
            self.standing.frame(str(peer), trio.current_time())

    def _may_resubscribe(self, peer: ID, error: Exception) -> bool:
        """Whether a feed whose stream failed with ``error`` is opened again at once (module
        docstring): the stream ended, its source is still connected and not banned, and its
        feed was not opened so within ``feeds.cooldown_s``."""
        last = self._resubscribed.get(peer)
        return (_ended(error) and not self.is_banned(peer)
                and _connected(self.host, peer)
                and (last is None or trio.current_time() - last >= self.config.feeds.cooldown_s))

    async def _resubscribe(self, info: PeerInfo) -> INetStream | None:
        """The feed's new stream on the connection we still hold (no dial), with the
        source's newest batch to fill the gap; None when refused."""
        self._resubscribed.pop(info.peer_id, None)
        self._resubscribed[info.peer_id] = trio.current_time()
        if len(self._resubscribed) > self.table.capacity:  # bounded: forget the oldest
            del self._resubscribed[next(iter(self._resubscribed))]
        self.counters["feed_resubscribed"] += 1
        return await self._open(info, backfill=True, dial=False)

    async def _open(self, info: PeerInfo, *, backfill: bool,
                    dial: bool = True) -> INetStream | None:
        """Dial if needed (and ``dial``), open the stream, send the request; None when
        refused."""
        if info.peer_id not in self.host.get_connected_peers():
            if not dial:
                raise ConnectionError(f"no longer connected to {info.peer_id}")
            if not await self._connect(info):
                if any(not is_circuit(a) for a in info.addrs):
                    # most likely departed: with long announcement periods (swarm.peers) its
                    # entry would stay for minutes; its next announcement brings it back. A
                    # peer reachable only through relays is kept: a relay that failed once
                    # says little about the peer, and forgetting it would hide it from our
                    # dialer too until its next announcement (minutes in a large swarm)
                    self.table.forget(str(info.peer_id))
                    self.counters["feed_forgot_unreachable"] += 1
                raise ConnectionError(f"could not connect to {info.peer_id}")
        with trio.fail_after(self.config.peers.dial_timeout_s):
            stream = await self.host.new_stream(info.peer_id, [FEED_PROTOCOL])
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                request = self.config.swarm_id.encode() + (b"" if backfill else LIVE)
                await stream.write(encode_varint_prefixed(request))
                reply = await read_varint_prefixed_bytes_limited(stream, MAX_REQUEST)
        except BaseException:
            with trio.CancelScope(shield=True):
                await _close(stream, reset=True)
            raise
        if reply != OK:
            self._cool(info.peer_id, "feed_refused")
            await _close(stream)
            return None
        return stream
