"""Checks of swarm.feeds without a network, run in a child interpreter by test_feeds_units.py
(libp2p cannot be imported into a test process that imported hivemind).

``python -m tests.swarm.feeds_checks`` prints one JSON line: {check name: "ok" | error}.
"""

from __future__ import annotations

import collections
import json
import sys
import time
import traceback
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_varint_prefixed

from protocol import Identity, PeerAnnouncement, seal
from swarm.config import AnnouncementsConfig, FeedsConfig, GossipConfig
from swarm.feed_standing import MIN_WAIT_S, Kind, Verdict
from swarm.feeds import BUSY, LIVE, OK, FeedClient, FeedServer, _Feed
from swarm.host import build_stack
from swarm.peers import PeerTable
from swarm.pubsub import Ignored
from swarm.service import GossipService
from tests.swarm.conftest import batch

SWARM = "feeds-check"
CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def config(**kw: Any) -> GossipConfig:
    return GossipConfig(data_dir="/nonexistent", swarm_id=SWARM, **kw)


class FakeStream:
    """A stream whose peer sends ``incoming`` and then nothing until ``hang_up``."""

    def __init__(self, peer: ID, incoming: bytes = b"") -> None:
        self.muxed_conn = SimpleNamespace(peer_id=peer)
        self.inbuf = bytearray(incoming)
        self.written = bytearray()
        self.closed = self.was_reset = False
        self.eof = trio.Event()

    async def read(self, n: int = -1) -> bytes:
        while not self.inbuf:
            if self.eof.is_set():
                return b""
            await self.eof.wait()
        n = len(self.inbuf) if n < 0 else n
        out = bytes(self.inbuf[:n])
        del self.inbuf[:n]
        return out

    async def write(self, data: bytes) -> None:
        if self.closed or self.was_reset:
            raise trio.ClosedResourceError("closed")
        self.written += data

    async def close(self) -> None:
        self.closed = True

    async def reset(self) -> None:
        self.was_reset = True

    def hang_up(self) -> None:
        self.eof.set()

    def frames(self) -> list[bytes]:
        out, buf = [], bytes(self.written)
        while buf:
            n, shift, i = 0, 0, 0
            while True:
                b = buf[i]
                n |= (b & 0x7F) << shift
                i += 1
                shift += 7
                if b < 0x80:
                    break
            out.append(buf[i:i + n])
            buf = buf[i + n:]
        return out


def peer() -> tuple[Identity, ID]:
    me = Identity.generate()
    return me, ID.from_base58(me.peer_id)


def request(swarm: str = SWARM) -> bytes:
    return encode_varint_prefixed(swarm.encode())


@check
def server_refuses_beyond_its_budget_and_frees_a_slot_on_hang_up() -> None:
    async def main() -> None:
        counters: collections.Counter[str] = collections.Counter()
        server = FeedServer(config=config(feeds=FeedsConfig(max_subscribers=2)), counters=counters)
        server.publish(b"old-batch")  # the newest batch, sent to each new subscriber
        streams = [FakeStream(peer()[1], request()) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for s in streams[:2]:
                nursery.start_soon(server.handle, s)
            await trio.testing.wait_all_tasks_blocked()
            assert server.subscribers() == 2
            await server.handle(streams[2])  # the third is answered busy and closed
            assert streams[2].frames() == [BUSY] and streams[2].closed
            assert server.publish(b"new-batch") == 2
            await trio.testing.wait_all_tasks_blocked()
            for s in streams[:2]:
                assert s.frames() == [OK, b"old-batch", b"new-batch"], s.frames()
            streams[0].hang_up()  # the subscriber left: its slot is free at once
            await trio.testing.wait_all_tasks_blocked()
            assert server.subscribers() == 1
            nursery.cancel_scope.cancel()
        assert counters["feed_busy"] == 1 and counters["feed_backfilled"] == 2
    trio.run(main)


@check
def server_budgets_requests_per_peer_and_checks_the_swarm() -> None:
    async def main() -> None:
        counters: collections.Counter[str] = collections.Counter()
        feeds = FeedsConfig(subscribe_burst=1, subscribe_per_s=0.01)
        server = FeedServer(config=config(feeds=feeds), counters=counters)
        _, p = peer()
        first = FakeStream(p, request("another-swarm"))
        await server.handle(first)
        assert first.was_reset and counters["rejected_feed_bad_request"] == 1
        again = FakeStream(p, request())  # same peer: its one token is spent
        await server.handle(again)
        assert again.was_reset and counters["rejected_feed_request_rate"] == 1
        assert server.subscribers() == 0
        banned = FeedServer(config=config(), counters=counters, is_banned=lambda _p: True)
        s = FakeStream(peer()[1], request())
        await banned.handle(s)
        assert s.was_reset and counters["rejected_banned_peer"] == 1
    trio.run(main)


@check
def a_slow_subscriber_loses_batches_instead_of_blocking_the_source() -> None:
    async def main() -> None:
        counters: collections.Counter[str] = collections.Counter()
        server = FeedServer(config=config(feeds=FeedsConfig(queue=2)), counters=counters)
        server._subs[peer()[1]] = trio.open_memory_channel[bytes](2)[0]  # nobody reads it
        assert [server.publish(b"x") for _ in range(4)] == [1, 1, 0, 0]
        assert counters["dropped_feed_slow"] == 2
    trio.run(main)


def table_of(n: int, **kw: Any) -> tuple[PeerTable, list[str]]:
    table = PeerTable(ttl_s=60)
    ids = []
    for _ in range(n):
        me = Identity.generate()
        ids.append(me.peer_id)
        table.update(PeerAnnouncement(peer_id=me.peer_id,
                                      addrs=(f"/ip4/127.0.0.1/tcp/1/p2p/{me.peer_id}",), **kw), 0.0)
    return table, ids


def client(table: PeerTable, **kw: Any) -> FeedClient:
    return FeedClient(config=config(**kw), host=SimpleNamespace(), table=table,
                      counters=collections.Counter(), on_frame=lambda _p, _d: True)


@check
def sources_are_picked_uniformly_and_never_bootstrap_self_banned_or_cooling() -> None:
    async def main() -> None:
        table, ids = table_of(10)
        boot = Identity.generate().peer_id
        table.update(PeerAnnouncement(peer_id=boot, addrs=(f"/ip4/127.0.0.1/tcp/1/p2p/{boot}",),
                                      bootstrap_only=True), 0.0)
        me, banned, cooling = (ID.from_base58(i) for i in ids[:3])
        c = client(table)
        c.is_banned = lambda p: p == banned
        c._cooldown[cooling] = trio.current_time() + 100
        picks = collections.Counter(str(c._pick(me).peer_id) for _ in range(2000))
        assert set(picks) == set(ids[3:]), picks  # 7 eligible
        assert min(picks.values()) > 2000 / 7 * 0.7, picks
        c._rested = {ID.from_base58(i): 0.0 for i in ids[3:9]}  # only ids[9] is unrested
        assert {str(c._pick(me).peer_id) for _ in range(50)} == {ids[9]}
        c._rested[ID.from_base58(ids[9])] = 0.0  # all rested: any of them again
        assert len({str(c._pick(me).peer_id) for _ in range(200)}) == 7
    trio.run(main)


@check
def the_client_holds_k_feeds_and_rotates_the_oldest() -> None:
    async def main() -> None:
        table, ids = table_of(6)
        c = client(table, feeds=FeedsConfig(sources=3, rotate_s=10.0))
        followed: list[ID] = []

        gate = trio.Event()  # a rotation's replacement opens only when the test says so

        async def follow(info: Any, feed: Any) -> None:
            followed.append(info.peer_id)
            with feed.scope:
                if feed.replaces is not None:
                    await gate.wait()
                c._opened(feed)
                await trio.sleep_forever()
        c._follow = follow  # type: ignore[method-assign]
        me = ID.from_base58(Identity.generate().peer_id)
        async with trio.open_nursery() as nursery:
            c._last_rotation = trio.current_time()
            for _ in range(2):  # at most OPENS_PER_TICK (2) per tick
                c._maintain(me, nursery)
                await trio.testing.wait_all_tasks_blocked()
            assert len(c.sources()) == 3 and len(set(followed)) == 3
            first = min(c._feeds.values(), key=lambda f: f.started).peer  # the oldest
            c._last_rotation -= 10.0
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            # make before break: the replacement is being opened, the oldest still feeds
            assert len(c._feeds) == 4 and str(first) in c.sources() and len(c.sources()) == 3
            c._maintain(me, nursery)  # no second rotation nor gap fill meanwhile
            await trio.testing.wait_all_tasks_blocked()
            assert len(c._feeds) == 4 and len(set(followed)) == 4
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert str(first) not in c.sources() and first in c._rested
            assert len(c.sources()) == 3 and len(c._feeds) == 3 and len(set(followed)) == 4
            assert c.counters["feed_rotated"] == 1
            nursery.cancel_scope.cancel()
    trio.run(main)


@check
def a_rotation_asks_for_live_batches_only_and_a_gap_fill_for_the_newest() -> None:
    async def main() -> None:
        counters: collections.Counter[str] = collections.Counter()
        server = FeedServer(config=config(), counters=counters)
        server.publish(b"old-batch")
        live = FakeStream(peer()[1], encode_varint_prefixed(SWARM.encode() + LIVE))
        gap = FakeStream(peer()[1], request())
        bad = FakeStream(peer()[1], encode_varint_prefixed(SWARM.encode() + b"/more"))
        async with trio.open_nursery() as nursery:
            for s in (live, gap):
                nursery.start_soon(server.handle, s)
            await server.handle(bad)
            await trio.testing.wait_all_tasks_blocked()
            server.publish(b"new-batch")
            await trio.testing.wait_all_tasks_blocked()
            assert live.frames() == [OK, b"new-batch"], live.frames()
            assert gap.frames() == [OK, b"old-batch", b"new-batch"], gap.frames()
            nursery.cancel_scope.cancel()
        assert bad.was_reset and counters["rejected_feed_bad_request"] == 1
        assert counters["feed_backfilled"] == 1
        # the client side: a rotation's replacement sends the /live request
        stream = FakeStream(peer()[1], encode_varint_prefixed(OK))
        c = FeedClient(config=config(), host=FakeHost(stream), table=table_of(0)[0],
                       counters=counters, on_frame=lambda _p, _d: True)
        assert await c._open(PeerInfo(stream.muxed_conn.peer_id, []), backfill=False) is stream
        assert stream.frames() == [SWARM.encode() + LIVE]
    trio.run(main)


class FakeHost:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream

    def get_connected_peers(self) -> list[ID]:
        return [self.stream.muxed_conn.peer_id]

    async def new_stream(self, peer_id: ID, protocols: list[str]) -> FakeStream:
        return self.stream


class UnconnectedHost:
    """A host connected to nobody whose own ``connect`` cannot use ``p2p-circuit``
    addresses (py-libp2p 0.8.1 drops them before choosing a transport)."""

    def __init__(self) -> None:
        self.connect_calls: list[PeerInfo] = []

    def get_connected_peers(self) -> list[ID]:
        return []

    async def connect(self, info: PeerInfo) -> None:
        self.connect_calls.append(info)
        raise ConnectionError("All addresses are unusable (relay-only)")


@check
def a_source_behind_nat_is_dialled_through_its_relay_and_kept_when_that_fails() -> None:
    """A source that announces only circuit addresses is dialled through the relay-aware
    dial (swarm.discovery.Dialer), not host.connect, which cannot use those addresses; when
    the relayed dial fails the peer stays in the table (only cooled down): it is behind
    NAT, not gone, and forgetting it would hide it from our dialer until its next
    announcement. A source with a direct address that cannot be dialled is forgotten."""
    async def main() -> None:
        nated, relay, public = (Identity.generate().peer_id for _ in range(3))
        table = PeerTable(ttl_s=60)
        circuit = f"/ip4/10.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{nated}"
        table.update(PeerAnnouncement(peer_id=nated, addrs=(circuit,)), 0.0)
        table.update(PeerAnnouncement(peer_id=public,
                                      addrs=(f"/ip4/10.0.0.2/tcp/1/p2p/{public}",)), 0.0)
        dialled: list[PeerInfo] = []

        async def dial(info: PeerInfo) -> bool:
            dialled.append(info)
            return False  # the relay is down

        host = UnconnectedHost()
        c = FeedClient(config=config(), host=host, table=table,
                       counters=collections.Counter(), on_frame=lambda _p, _d: True, dial=dial)
        me = ID.from_base58(Identity.generate().peer_id)
        infos = {str(i.peer_id): i for i in c._candidates(me)}
        for pid in (nated, public):
            feed = _Feed(peer=infos[pid].peer_id, started=0.0, scope=trio.CancelScope())
            c._feeds[feed.peer] = feed
            await c._follow(infos[pid], feed)
        assert [str(i.peer_id) for i in dialled] == [nated, public], dialled
        assert all("/p2p-circuit" in str(a) for a in dialled[0].addrs), dialled[0].addrs
        assert host.connect_calls == []
        assert {a.peer_id for a in table.live()} == {nated}  # the public one is forgotten
        assert c.counters["feed_forgot_unreachable"] == 1 and c.counters["feed_failed"] == 2
        assert ID.from_base58(nated) in c._cooldown and not c._feeds
        # without a dial callable (host.connect only) a circuit-only source is kept too
        c2 = FeedClient(config=config(), host=host, table=table,
                        counters=collections.Counter(), on_frame=lambda _p, _d: True)
        feed = _Feed(peer=infos[nated].peer_id, started=0.0, scope=trio.CancelScope())
        c2._feeds[feed.peer] = feed
        await c2._follow(infos[nated], feed)
        assert len(host.connect_calls) == 1 and {a.peer_id for a in table.live()} == {nated}
    trio.run(main)


@check
def an_invalid_frame_closes_the_feed_and_cools_its_source_down() -> None:
    """Through the service's frame check: a batch signed by another key than the source's
    (a relayed or forged one) is rejected as wrong_sender and ends the feed."""
    async def main() -> None:
        source, source_id = peer()
        other = Identity.generate()
        good = seal(source, batch("m", 1), swarm_id=SWARM)
        forged = seal(other, batch("m", 2), swarm_id=SWARM)
        stream = FakeStream(source_id, b"".join(encode_varint_prefixed(x)
                                                 for x in (OK, good, forged, good)))
        me = Identity.generate()
        cfg = config(feeds=FeedsConfig(cooldown_s=60.0))
        service = GossipService(cfg, me, build_stack(me, cfg), bootstrap_peers=[])
        table, _ = table_of(0)
        c = FeedClient(config=cfg, host=FakeHost(stream), table=table,
                       counters=service.counters, on_frame=service._feed_frame)
        feed = _Feed(peer=source_id, started=0.0, scope=trio.CancelScope())
        c._feeds[source_id] = feed
        await c._follow(PeerInfo(source_id, []), feed)
        assert stream.frames()[0] == SWARM.encode()  # the request
        counters = service.counters
        assert counters["received_rollouts"] == 1 and counters["rejected_wrong_sender"] == 1
        assert counters["feed_closed_invalid"] == 1 and counters["feed_frames"] == 2
        assert c._cooldown[source_id] - trio.current_time() > 59 and not c._feeds
        assert [d.sender for d in service.inbox.take("rollouts", 10)] == [source.peer_id]
    trio.run(main)


@check
def announcements_signed_closer_than_half_the_min_gap_are_ignored() -> None:
    """By the sender's own clock (network delays do not matter): the second of two signed
    0.4 s apart is ignored (not relayed, no penalty), an older one arriving late too, one
    signed a full gap later is accepted and its stated period recorded."""
    async def main() -> None:
        me, sender = Identity.generate(), Identity.generate()
        cfg = config(announcements=AnnouncementsConfig(min_gap_s=1.0))
        service = GossipService(cfg, me, build_stack(me, cfg), bootstrap_peers=[])
        validate = service.make_validator("announce")
        now = int(time.time() * 1000)

        def msg(at_ms: int) -> rpc_pb2.Message:
            ann = PeerAnnouncement(peer_id=sender.peer_id, addrs=(), interval_s=42.0)
            return rpc_pb2.Message(from_id=ID.from_base58(sender.peer_id).to_bytes(),
                                   data=seal(sender, ann, swarm_id=SWARM, now_ms=at_ms))
        forwarder = ID.from_base58(Identity.generate().peer_id)
        assert validate(forwarder, msg(now - 2000)) is True
        for too_soon in (now - 1600, now - 3000):
            try:
                validate(forwarder, msg(too_soon))
                raise AssertionError("accepted an announcement inside the gap")
            except Ignored:
                pass
        assert validate(forwarder, msg(now - 1000)) is True
        assert service.counters["ignored_announce_too_soon"] == 2
        assert service.counters["received_announce"] == 2
        assert service.table.created_ms(sender.peer_id) == now - 1000
        assert service.table.entry_ttl(service.table.live()[0]) == 3 * 42.0
    trio.run(main)


def following(c: FeedClient) -> list[ID]:
    """Replace ``c._follow`` by one that opens at once and, like the real one, removes its
    feed when its scope is cancelled; returns the list of sources followed."""
    followed: list[ID] = []

    async def follow(info: Any, feed: Any) -> None:
        followed.append(info.peer_id)
        try:
            with feed.scope:
                c._opened(feed)
                await trio.sleep_forever()
        finally:
            if c._feeds.get(info.peer_id) is feed:
                del c._feeds[info.peer_id]
    c._follow = follow  # type: ignore[method-assign]
    return followed


async def hold_live(c: FeedClient, me: ID, nursery: trio.Nursery, keys: list[str]) -> None:
    """The learner reports valid groups from ``keys`` (no signal anywhere), and ``c`` opens
    its four feeds to them: four live sources."""
    c.rate({}, {k: 1 for k in keys}, 0)
    c._last_rotation = trio.current_time()
    for _ in range(2):
        c._maintain(me, nursery)
        await trio.testing.wait_all_tasks_blocked()
    assert set(c.sources()) == set(keys) and c.kinds()["live"] == 4, c.kinds()


@check
def sources_that_deliver_hold_all_but_the_exploration_slot_and_idle_ones_are_dropped() -> None:
    """Issue 32: 3 honest sources among 20 fresh keys. Before the learner reports, picks
    are uniform; once it reports who delivered valid groups, the honest sources hold k - 1
    slots (live before their groups carry signal) and the keys only the exploration slot; a
    key's feed that brings no frame is closed after feeds.probe_rounds reports and its
    source cooled, longer each time; a rotation never trades a live or proven slot for a
    key."""
    async def main() -> None:
        table, ids = table_of(23)
        honest = ids[:3]
        c = client(table, feeds=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3,
                                             probe_rounds=2, probe_s=1e-9))
        followed = following(c)
        me = ID.from_base58(Identity.generate().peer_id)
        assert c._want([]) is None  # no report yet: any
        uniform = collections.Counter(str(c._pick(me).peer_id) in honest for _ in range(2000))
        assert uniform[True] < 2000 * 3 / 23 * 1.4, uniform  # by keys: ~13 % honest
        c.rate({}, {h: 5 for h in honest})  # valid groups, none with signal yet
        async with trio.open_nursery() as nursery:
            c._last_rotation = trio.current_time()
            for _ in range(2):
                c._maintain(me, nursery)
                await trio.testing.wait_all_tasks_blocked()
            assert set(honest) < set(c.sources()) and len(c.sources()) == 4, c.sources()
            assert c.kinds() == {"proven": 0, "live": 3, "trial": 1, "idle": 0}
            key = next(s for s in c.sources() if s not in honest)
            # a rotation: the oldest is live and no proven source is free, so it stays and
            # the oldest stranger (the key) is replaced, by another key
            for f in c._feeds.values():
                f.started = 0.0 if str(f.peer) == honest[0] else 5.0
            c._last_rotation -= 10.0
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert set(honest) < set(c.sources()) and key not in c.sources(), c.sources()
            assert len(c.sources()) == 4 and len(followed) == 5
            key = next(s for s in c.sources() if s not in honest)
            # the honest sources' groups carry signal now; the key never sent a frame: two
            # reports later it is closed, cooled and no longer a candidate
            for n in (1, 2):
                c.rate({h: n for h in honest}, {h: 5 + n for h in honest})
            await trio.testing.wait_all_tasks_blocked()
            assert key not in c.sources() and ID.from_base58(key) in c._cooldown
            assert c.counters["feed_dropped_idle"] == 1
            assert c.counters["feed_idle_slot_rounds"] == 1  # the key, in the second report
            assert c.kinds() == {"proven": 3, "live": 0, "trial": 0, "idle": 0}
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert len(c.sources()) == 4 and c.kinds()["trial"] == 1
            # a farm that mints fresh keys: every new one is a stranger, never proven
            for _ in range(10):
                fresh = Identity.generate().peer_id
                table.update(PeerAnnouncement(
                    peer_id=fresh, addrs=(f"/ip4/127.0.0.1/tcp/1/p2p/{fresh}",)), 0.0)
            # every proven source is held: a rotation finds none, a gap fill a stranger
            assert c._pick(me, want=Kind.PROVEN, at_least=Kind.PROVEN) is None
            assert str(c._pick(me, want=Kind.LIVE).peer_id) not in honest
            assert c._want(list(c._feeds.values())) is Kind.STRANGER  # k - 1 proven held
            # a key dropped idle again is cooled twice as long (its strikes survive reopening)
            assert c.standing.dropped(key, Verdict.IDLE) == 2
            nursery.cancel_scope.cancel()
        # while no source delivers anything new (a quiet swarm), known sources keep their
        # slots; then a source that stops delivering while another goes on loses its slot,
        # and is a stranger until it delivers again
        table2, honest = table_of(2)
        c2 = client(table2, feeds=FeedsConfig(sources=2, trial_rounds=2, explore_slots=1,
                                              probe_s=1e-9))
        following(c2)
        c2.rate({}, {h: 1 for h in honest})
        async with trio.open_nursery() as nursery:
            c2._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert set(c2.sources()) == set(honest), c2.sources()
            for _ in range(3):
                c2.rate({}, {h: 1 for h in honest})
            await trio.testing.wait_all_tasks_blocked()
            assert set(c2.sources()) == set(honest) and not c2.counters["feed_dropped_idle"]
            for n in (2, 3):  # two reports in which the other delivered
                c2.rate({}, {honest[0]: n, honest[1]: 1})
            await trio.testing.wait_all_tasks_blocked()
            assert c2.sources() == [honest[0]]
            assert c2.standing.kind(honest[1]) is Kind.STRANGER
            assert c2.counters["feed_dropped_idle"] == 1
            nursery.cancel_scope.cancel()
    trio.run(main)


@check
def the_exploration_slot_rotates_even_when_every_held_source_is_live() -> None:
    """Measured: four keys that each sent one valid batch held all four slots as live
    sources and nothing rotated. Beyond the reserved slots, the live source that delivered
    least recently is rotated out like a stranger."""
    async def main() -> None:
        table, ids = table_of(8)
        honest, keys = ids[:3], ids[3:]
        c = client(table, feeds=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3))
        following(c)
        me = ID.from_base58(Identity.generate().peer_id)
        c.rate({}, {h: 1 for h in honest})
        async with trio.open_nursery() as nursery:
            c._last_rotation = trio.current_time()
            for _ in range(2):
                c._maintain(me, nursery)
                await trio.testing.wait_all_tasks_blocked()
            key = next(s for s in c.sources() if s not in honest)
            c.rate({}, {**{h: 1 for h in honest}, key: 1})  # the key's one valid batch
            for n in (2, 3):  # the honest sources go on delivering, the key does not
                c.rate({}, {**{h: n for h in honest}, key: 1})
            assert c.kinds()["live"] == 4 and key in c.sources()
            c._last_rotation -= 10.0
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert key not in c.sources() and set(honest) < set(c.sources()), c.sources()
            assert set(c.sources()) - set(honest) <= set(keys)
            nursery.cancel_scope.cancel()
    trio.run(main)


@check
def while_signal_flows_live_candidates_go_uniform_and_silent_live_sources_rotate() -> None:
    """Issue 32: keys sending valid all-wrong groups were live from their first batch, and
    once rotated out were picked again ahead of never-tried honest peers; keys trickling a
    valid batch every 15 s held every slot as live sources while no signal flowed, and only
    the stalest rotated. Once our own groups carry signal, a live candidate is picked like
    a stranger; a held live source silent for feeds.probe_s is rotated like a stranger,
    one that delivers keeps its slot."""
    async def main() -> None:
        table, ids = table_of(8)
        wrong = ids[0]
        c = client(table, feeds=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=3,
                                             probe_rounds=2, probe_s=0.2))
        following(c)
        me = ID.from_base58(Identity.generate().peer_id)
        c.rate({}, {wrong: 1}, 0)  # a hard task's first rounds: no signal anywhere
        assert all(str(c._pick(me, want=Kind.LIVE).peer_id) == wrong for _ in range(50))
        c.rate({}, {wrong: 2}, 1)  # our own groups carry signal
        picks = collections.Counter(str(c._pick(me, want=Kind.LIVE).peer_id) for _ in range(800))
        assert len(picks) == 8 and picks[wrong] < 800 / 8 * 1.5, picks
        # held: two live sources, one goes on delivering, one falls silent
        table2, ids2 = table_of(8)
        talks, silent = ids2[:2]
        c2 = client(table2, feeds=FeedsConfig(sources=4, rotate_s=10.0, trial_rounds=10,
                                              probe_rounds=2, probe_s=0.2))
        following(c2)
        c2.rate({}, {talks: 1, silent: 1}, 0)
        async with trio.open_nursery() as nursery:
            c2._last_rotation = trio.current_time()
            for _ in range(2):
                c2._maintain(me, nursery)
                await trio.testing.wait_all_tasks_blocked()
            assert {talks, silent} < set(c2.sources()) and c2.kinds()["live"] == 2
            for n in (2, 3, 4):
                c2.rate({}, {talks: n, silent: 1}, 0)
            await trio.sleep(0.3)  # probe_s
            c2.rate({}, {talks: 5, silent: 1}, 0)
            for f in c2._feeds.values():  # the live sources are the oldest
                f.started = 0.0 if str(f.peer) in (talks, silent) else 5.0
            c2._last_rotation -= 10.0
            c2._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert talks in c2.sources() and silent not in c2.sources(), c2.sources()
            # rotated out (resting, still live), not closed as idle (a stranger again)
            assert c2.counters["feed_rotated"] == 1 and c2.standing.kind(silent) is Kind.LIVE
            nursery.cancel_scope.cancel()
    trio.run(main)


@check
def while_nothing_arrives_rotations_come_every_wait() -> None:
    """Issue 32: 50 keys whose valid all-wrong groups the shared re-scoring budget mostly
    left unchecked held every slot of a node as silent live sources for 25 of its 60 rounds
    (two honest peers among 52, one rotation per feeds.rotate_s). While every held feed is
    silent for the wait (3 of the swarm's publishing intervals, at least 1 s), a rotation
    comes every wait and takes a never-tried peer; while one feed delivers, every
    feeds.rotate_s as before."""
    async def main() -> None:
        table, keys = table_of(4)
        c = client(table, feeds=FeedsConfig(sources=4, rotate_s=60.0, trial_rounds=3,
                                             probe_rounds=2, probe_s=30.0))
        following(c)
        me = ID.from_base58(Identity.generate().peer_id)
        async with trio.open_nursery() as nursery:
            await hold_live(c, me, nursery, keys)
            others = []
            for _ in range(4):  # never-tried peers join
                fresh = Identity.generate().peer_id
                others.append(fresh)
                table.update(PeerAnnouncement(
                    peer_id=fresh, addrs=(f"/ip4/127.0.0.1/tcp/1/p2p/{fresh}",)), 0.0)
            for t in range(8):  # the swarm publishes every 0.1 s: the wait is MIN_WAIT_S
                c.standing.frame(keys[0], t * 0.1)
            assert c.standing.wait_s() == MIN_WAIT_S
            for n in (2, 3):  # one held feed still delivers: no early rotation
                c.rate({}, {**{k: 1 for k in keys}, keys[0]: n}, 0)
            await trio.sleep(MIN_WAIT_S + 0.1)
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert set(c.sources()) == set(keys) and not c.counters["feed_rotated"]
            for _ in range(2):  # now none does
                c.rate({}, {**{k: 1 for k in keys}, keys[0]: 3}, 0)
            await trio.sleep(MIN_WAIT_S + 0.1)
            assert c._starved([f for f in c._feeds.values() if f.open], trio.current_time())
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert c.counters["feed_rotated"] == 1, c.counters
            assert len(c.sources()) == 4 and len(set(c.sources()) & set(others)) == 1
            nursery.cancel_scope.cancel()
    trio.run(main)


@check
def while_searching_every_slot_not_proven_tries_a_stranger_for_one_wait() -> None:
    """Issue 32: a node that joined where 50 keys sending valid all-wrong groups already sat
    held four of them as live sources for its whole run (one stranger tried per
    feeds.rotate_s) and never met its two honest peers, while its own groups carried signal
    in most rounds. Then (Standing.searching) every feed whose source is not proven is
    replaced by a stranger once it has been open for the wait, oldest first; a proven
    source keeps its slot, and once a held feed brings signal the search ends."""
    async def main() -> None:
        table, ids = table_of(12)
        keys = ids[:4]
        c = client(table, feeds=FeedsConfig(sources=4, rotate_s=60.0, trial_rounds=3,
                                             probe_rounds=2, probe_s=30.0))
        following(c)
        me = ID.from_base58(Identity.generate().peer_id)
        for k in ids:  # every candidate but the keys is cooling: the keys are held
            if k not in keys:
                c._cooldown[ID.from_base58(k)] = trio.current_time() + 0.5
        async with trio.open_nursery() as nursery:
            await hold_live(c, me, nursery, keys)
            for t in range(8):  # the swarm publishes every 0.1 s: the wait is MIN_WAIT_S
                c.standing.frame(keys[0], t * 0.1)
            c.rate({}, {k: 2 for k in keys}, 0)  # no signal anywhere: nobody is behind
            await trio.sleep(MIN_WAIT_S + 0.1)
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert not c.counters["feed_rotated"]  # (rotate_s is 60 s)
            c.rate({}, {k: 3 for k in keys}, 1)  # our own groups carry signal
            for _ in range(8):  # one rotation at a time, each a tick
                c._maintain(me, nursery)
                await trio.testing.wait_all_tasks_blocked()
            assert c.counters["feed_search_rotations"] == 4 == c.counters["feed_rotated"]
            assert not set(c.sources()) & set(keys), c.sources()
            # the strangers just opened stay for the wait
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert c.counters["feed_rotated"] == 4
            # one of them brings signal: proven, and the search is over
            held = c.sources()
            c.rate({held[0]: 1}, {**{k: 3 for k in keys}, **{h: 1 for h in held}}, 2)
            await trio.sleep(MIN_WAIT_S + 0.1)
            c._maintain(me, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert c.counters["feed_rotated"] == 4 and held[0] in c.sources()
            nursery.cancel_scope.cancel()
    trio.run(main)


def main() -> None:
    names = sys.argv[1:] or list(CHECKS)
    out = {}
    for name in names:
        try:
            CHECKS[name]()
            out[name] = "ok"
        except Exception:
            out[name] = traceback.format_exc(limit=6)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
