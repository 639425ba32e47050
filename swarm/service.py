"""The swarm process: host, gossip, validation, discovery and the learner's IPC server.

``serve(config)`` is the trio entry point (``nursery.start``-able; it reports ``Ready`` once
listening, subscribed, bootstrapped and serving IPC). ``run(config)`` wraps it for a process:
it prints the ready line on stdout, stops cleanly on SIGTERM/SIGINT (exit 0) and turns a
SwarmError into one line on stderr and a non-zero exit status.

Task tree (one nursery, closed on shutdown)::

    serve ─ host.run ─ pubsub ─ router
          ├── drain <topic>      × topics   (subscribes; deliveries come from the validator;
          │                                  no rollouts topic in feeds mode)
          ├── serve_ipc                      (if ipc_path)
          ├── publish loop                   (spaces this peer's publishes; rollouts go to
          │                                  our feed subscribers in feeds mode)
          ├── FeedClient.run                 (feeds mode: k rotating feeds, swarm.feeds)
          ├── announce loop                  (signed PeerAnnouncement; period grows with the
          │                                  peer table, swarm.peers.announce_interval)
          ├── NatManager.run                 (reachability, relay service and reservations,
          │                                  UPnP port mappings: swarm.upnp)
          └── Dialer.maintain                (expiry, re-dial, top up to peers.target)
"""

from __future__ import annotations

import collections
import logging
import signal
import sys
import time
from typing import Any, TextIO, TypedDict

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from protocol import (
    PROTOCOL_VERSION,
    SOFTWARE_VERSION,
    Identity,
    IdentityError,
    Message,
    PeerAnnouncement,
    ProtocolError,
    ReplayGuard,
    TooLarge,
    envelope_map,
    load_or_create_identity,
    seal,
)
from protocol.events import Ready
from protocol.ipc import (
    MAX_LINKS,
    MAX_RECEIVE_ITEMS,
    MAX_SOURCES,
    RECEIVE_BYTES,
    Request,
    delivery_to_ipc,
    message_from_ipc,
)
from swarm.clock import TimeServer
from swarm.config import GossipConfig
from swarm.discovery import Dialer
from swarm.errors import ListenError, SwarmError
from swarm.feeds import FEED_PROTOCOL, FeedClient, FeedServer
from swarm.holepunch import link_of
from swarm.host import Stack, build_stack, check_listen, dialable_addrs, parse_listen, parse_peer_addr
from swarm.inbox import Delivery, Inbox
from swarm.nat import NatManager
from swarm.ipc_server import RequestError, serve_ipc
from swarm.peers import PeerTable, announce_interval
from swarm.pubsub import Ignored
from swarm.ratelimit import TokenBuckets
from swarm.topics import topics
from swarm.tunnel import TunnelHub, p2pd_target
from swarm.validation import Rejected, Validator

__all__ = ["GossipService", "run", "serve"]

logger = logging.getLogger(__name__)

PUBLISHABLE = ("rollouts",)


class Profile(TypedDict):
    """What our announcements say about us; the learner may change it (op ``announce``)."""

    model: str
    capabilities: tuple[str, ...]
    collective_addrs: tuple[str, ...]


class GossipService:
    """The state of one swarm process and the tasks that act on it."""

    def __init__(self, config: GossipConfig, identity: Identity, stack: Stack, *,
                 bootstrap_peers: list[PeerInfo]) -> None:
        self.config = config
        self.identity = identity
        self.stack = stack
        self.self_id = stack.host.get_id()
        self.counters: collections.Counter[str] = stack.counters  # pubsub's drops count here too
        self.inbox = Inbox(size=config.pubsub.inbox_size, counters=self.counters)
        self.table = PeerTable(ttl_s=config.peers.ttl_s,
                               max_interval_s=config.announcements.interval_max_s)
        self.validator = Validator(
            swarm_id=config.swarm_id, counters=self.counters, log_every_s=config.log_every_s,
            buckets=TokenBuckets(rate=config.limits.rate_per_s, burst=config.limits.rate_burst),
            guard=ReplayGuard(max_age_ms=int(config.limits.replay_window_s * 1000),
                              max_future_ms=int(config.limits.max_future_s * 1000)))
        self.nat = NatManager(host=stack.host, config=config,
                              bootstrap=[i.peer_id for i in bootstrap_peers], on_addrs=self._set_addrs)
        self.clock = TimeServer(stack.host)  # tells peers our time (doctor's skew check)
        self.dialer = Dialer(host=stack.host, config=config, table=self.table,
                             bootstrap_peers=bootstrap_peers, is_banned=stack.pubsub.is_banned,
                             relay_dial=self.nat.relay.dial)
        self.tunnels = TunnelHub(host=stack.host, ensure_connected=self._ensure_connected,
                                 local_target=lambda: p2pd_target(
                                     self.profile["collective_addrs"]),
                                 bind_host=_bind_host(config.listen))
        self.nat.watch_tunnels(self.tunnels.last_io)  # a punched peer's busy tunnels hold its relay
        self.topics = topics(config.swarm_id)
        stack.pubsub.topic_labels = {topic: type_ for type_, topic in self.topics.items()}
        self.feeds = config.rollout_mode == "feeds"
        self.subscribed = [t for t in self.topics if not (self.feeds and t == "rollouts")]
        self.feed_server = FeedServer(config=config, counters=self.counters,
                                      is_banned=stack.pubsub.is_banned)
        self.feed_client = FeedClient(config=config, host=stack.host, table=self.table,
                                      counters=self.counters, on_frame=self._feed_frame,
                                      is_banned=stack.pubsub.is_banned,
                                      dial=lambda info: self.dialer.dial(info, force=True))
        self.addrs: list[str] = []
        self.profile: Profile = {"model": config.model, "capabilities": config.capabilities,
                        "collective_addrs": config.collective_addrs}
        self._outbox_send, self._outbox_recv = trio.open_memory_channel[tuple[str, bytes]](
            config.pubsub.outbox_size)
        self._announce_now = trio.Event()

    # -- inbound -------------------------------------------------------------------------
    def make_validator(self, type_: str) -> Any:
        def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            if msg.from_id == self.self_id.to_bytes():
                return True  # our own publish
            try:
                from_peer = ID(msg.from_id).to_base58()
                data: bytes | dict[str, Any] = msg.data
                if type_ == "announce":  # before validation records the nonce: see below
                    data = self._check_announce_gap(from_peer, msg.data)
                env = self.validator.check(data, from_peer=from_peer, expected_type=type_)
            except Rejected as e:
                if not e.penalise:
                    raise Ignored(e.reason) from None
                return False
            self._accept(env.type, from_peer, env.message, len(msg.data), env.created_ms)
            return True
        return validate

    def _check_announce_gap(self, sender: str, data: bytes) -> bytes | dict[str, Any]:
        """An honest peer spaces its announcements by ``announcements.min_gap_s``: one signed less
        than half of that after the sender's latest recorded one (by the sender's own clock,
        so network delays do not matter; an older one arriving late included) is ignored, not
        relayed, so one key makes the swarm relay at most one announcement per half gap.
        Checked before validation (a copy costs a decode, not a signature check nor a token
        of the sender's bucket): an ignored message is not marked seen, so its other copies
        come here again and are ignored again, rather than counted as replays. The creation
        time is read unverified; the pubsub signature already binds the data to ``sender``,
        and validation proper follows, from the map decoded here (returned; ``data`` itself
        when there was nothing to check or it does not decode: validation rejects it)."""
        last = self.table.created_ms(sender)
        if last is None:
            return data
        try:
            raw = envelope_map(data)
        except ProtocolError:
            return data
        created = raw.get("ts")
        if type(created) is int and created - last < 500 * self.config.announcements.min_gap_s:
            self.counters["ignored_announce_too_soon"] += 1
            raise Rejected("announce_too_soon", "announcement sooner than the minimum gap")
        return raw

    def _feed_frame(self, source: ID, data: bytes) -> bool:
        """A frame from a feed we opened: the source must have signed it (it serves only its
        own batches). False (close the feed) when it is invalid rather than merely ignored."""
        sender = source.to_base58()
        try:
            env = self.validator.check(data, from_peer=sender, expected_type="rollouts")
        except Rejected as e:
            return not e.penalise
        self._accept(env.type, sender, env.message, len(data), env.created_ms)
        return True

    def _accept(self, type_: str, sender: str, message: Message, size: int,
                created_ms: int) -> None:
        # Delivered here, at validation time, rather than from the subscription channel:
        # pubsub drops silently when that 32-slot channel is full (docs/notes/py-libp2p.md).
        self.counters[f"received_{type_}"] += 1
        if isinstance(message, PeerAnnouncement):
            if self.table.update(message, trio.current_time(), created_ms=created_ms):
                logger.info("discovered peer %s (%s)", sender,
                            "bootstrap" if message.bootstrap_only else message.model or "no model")
        if type_ in PUBLISHABLE and not self.config.bootstrap_only:
            self.inbox.put(type_, Delivery(sender=sender, message=message,
                                           received_ms=int(time.time() * 1000), size=size))

    async def drain(self, type_: str, *, task_status: trio.TaskStatus[None]) -> None:
        topic = self.topics[type_]
        self.stack.pubsub.set_topic_validator(topic, self.make_validator(type_), False)
        subscription = await self.stack.pubsub.subscribe(topic)
        task_status.started()
        async for _ in subscription:
            pass  # swarm.pubsub feeds no subscription channel: the validator delivered it

    # -- outbound ------------------------------------------------------------------------
    async def enqueue(self, message: Message) -> None:
        try:
            data = seal(self.identity, message, swarm_id=self.config.swarm_id)
        except TooLarge as e:
            raise RequestError(f"message too large for gossip: {e}; publish fewer rollouts "
                               "per batch") from None
        await self._outbox_send.send((message.TYPE, data))

    async def publish_loop(self) -> None:
        async for type_, data in self._outbox_recv:
            self.counters[f"published_{type_}"] += 1
            if self.feeds and type_ == "rollouts":
                self.feed_server.publish(data)  # queued per subscriber: nothing to space
                continue
            await self.stack.pubsub.publish(self.topics[type_], data)
            await trio.sleep(self.config.pubsub.publish_interval_s)

    def announce_interval(self) -> float:
        """This peer's announcement period now (grows with the live table: swarm.peers)."""
        c = self.config.announcements
        return announce_interval(self.table.on_schedule(trio.current_time()),
                                 base_s=c.interval_s, max_s=c.interval_max_s,
                                 rate_per_s=c.rate_per_s)

    def announcement(self, interval_s: float = 0.0) -> PeerAnnouncement:
        return PeerAnnouncement(
            peer_id=self.identity.peer_id, addrs=tuple(self.addrs[:16]),
            model=self.profile["model"], capabilities=tuple(self.profile["capabilities"]),
            version=SOFTWARE_VERSION,
            collective_addrs=tuple(self.nat.collective_addrs(self.profile["collective_addrs"])[:16]),
            bootstrap_only=self.config.bootstrap_only, interval_s=round(interval_s, 3))

    async def _ensure_connected(self, peer: ID) -> bool:
        """For a tunnel: connect to ``peer`` from its announced addresses if needed."""
        if peer in self.dialer.connected():
            return True
        info = next((i for i in self.dialer.announced() if i.peer_id == peer), None)
        return info is not None and await self.dialer.dial(info, force=True)

    def _set_addrs(self, addrs: list[str]) -> None:
        """New addresses to advertise (swarm.nat: relayed, or as peers see us)."""
        self.addrs = addrs
        self._announce_now.set()

    async def announce_loop(self) -> None:
        """Announce every ``announce_interval()`` (stated in the announcement), at once when
        the profile or addresses change, but never twice within ``announcements.min_gap_s``."""
        while True:
            self._announce_now = trio.Event()  # a change from here on is in the next one
            interval = self.announce_interval()
            await self.enqueue(self.announcement(interval))
            sent = trio.current_time()
            with trio.move_on_after(interval):
                await self._announce_now.wait()
            await trio.sleep_until(sent + self.config.announcements.min_gap_s)

    # -- the learner's requests ----------------------------------------------------------
    async def handle(self, request: Request) -> Any:
        args = request.args
        if request.op == "publish":
            message = message_from_ipc(args)
            if message.TYPE not in PUBLISHABLE:
                raise RequestError(f"publish takes {PUBLISHABLE}, not {message.TYPE!r}")
            await self.enqueue(message)
            return None
        if request.op == "receive":
            type_, n = args.get("type"), args.get("max_items", 256)
            if not isinstance(type_, str) or type(n) is not int or not 1 <= n <= MAX_RECEIVE_ITEMS:
                raise RequestError(f"receive needs type: str and max_items in 1..{MAX_RECEIVE_ITEMS}")
            return [delivery_to_ipc(d.sender, d.message, d.received_ms)
                    for d in self.inbox.take(type_, n, max_bytes=RECEIVE_BYTES)]
        if request.op == "announce":
            self._set_profile(args)
            self._announce_now.set()
            return None
        if request.op == "peers":
            return [a.to_wire() for a in self.table.live() if a.peer_id != self.identity.peer_id]
        if request.op == "stats":
            return self.stats()
        if request.op == "tunnel":
            peer = args.get("peer_id")
            if not isinstance(peer, str) or not 1 <= len(peer) <= 128:
                raise RequestError("tunnel needs peer_id: str")
            try:
                port = await self.tunnels.port_for(peer)
            except ValueError as e:
                raise RequestError(f"tunnel: {e}") from None
            return {"host": self.tunnels.bind_host, "port": port}
        if request.op == "sources":
            delivered, valid = args.get("delivered"), args.get("valid", None)
            own = args.get("own", None)
            if not isinstance(delivered, dict) or not _sender_counts(delivered) or \
                    not (valid is None or _sender_counts(valid)) or \
                    not (own is None or (type(own) is int and 0 <= own < 2**53)):
                raise RequestError(f"sources needs delivered (and optionally valid): "
                                   f"{{peer_id: int >= 0}}, at most {MAX_SOURCES}; "
                                   f"own: int >= 0")
            if self.feeds:
                self.feed_client.rate(delivered, valid, own)
            return None
        if request.op == "links":
            return self.links()
        raise RequestError(f"unknown op {request.op!r}")

    def _set_profile(self, args: dict[str, Any]) -> None:
        probe = PeerAnnouncement.from_wire({"peer_id": self.identity.peer_id, "addrs": [],
                                            **{k: args[k] for k in self.profile if k in args}})
        self.profile = {"model": probe.model, "capabilities": probe.capabilities,
                        "collective_addrs": probe.collective_addrs}
        self.nat.want_collective(probe.collective_addrs)  # UPnP maps the collective port too

    def links(self) -> dict[str, str]:
        """Each connected peer's link: ``direct``, or ``relayed`` when every connection to it
        goes through a circuit relay (at most MAX_LINKS peers)."""
        out: dict[str, str] = {}
        for peer in self.stack.host.get_connected_peers():
            link = link_of(self.stack.host, peer)
            if link is not None:
                out[peer.to_base58()] = link
                if len(out) >= MAX_LINKS:
                    break
        return out

    def stats(self) -> dict[str, int]:
        out = dict(self.counters)
        out["peers"] = len(self.stack.host.get_connected_peers())
        out["known_peers"] = len(self.table)
        out["inbox"] = len(self.inbox)
        out["pubsub_peers"] = len(self.stack.pubsub.peers)
        out["banned_peers"] = self.stack.pubsub.banned_peers()
        out["connections"] = sum(len(c) for c in
                                 self.stack.host.get_network().get_connections_map().values())
        out.update(self.nat.stats())
        out["time_served"], out["time_refused"] = self.clock.served, self.clock.refused
        out.update(self.tunnels.stats())
        for type_ in self.subscribed:
            out[f"mesh_{type_}"] = len(self.stack.router.mesh.get(self.topics[type_], ()))
            out[f"subscribers_{type_}"] = len(self.stack.pubsub.peer_topics.get(
                self.topics[type_], ()))
        if self.feeds:
            out["feed_sources"] = len(self.feed_client.sources())
            out.update({f"feed_sources_{k}": n for k, n in self.feed_client.kinds().items()})
            out["feed_subscribers"] = self.feed_server.subscribers()
        return out


def _sender_counts(value: Any) -> bool:
    """A ``sources`` report's map: at most MAX_SOURCES peer ids to counts >= 0."""
    return isinstance(value, dict) and len(value) <= MAX_SOURCES and all(
        isinstance(p, str) and 1 <= len(p) <= 128 and type(n) is int and n >= 0
        for p, n in value.items())


async def serve(config: GossipConfig, *,
                task_status: trio.TaskStatus[Ready] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the swarm process's trio side until cancelled; ``started(Ready)`` when up."""
    try:
        identity = load_or_create_identity(config.data_dir)
    except IdentityError as e:
        raise SwarmError(str(e)) from None
    listen = parse_listen(config.listen)
    bootstrap_peers = [parse_peer_addr(b) for b in config.bootstrap]
    check_listen(listen)
    stack = build_stack(identity, config)
    service = GossipService(config, identity, stack, bootstrap_peers=bootstrap_peers)
    async with stack.host.run(listen):
        if not stack.host.get_transport_addrs():
            raise ListenError(f"cannot listen on {', '.join(config.listen)}")
        service.addrs = dialable_addrs(stack.host)
        async with background_trio_service(stack.pubsub), background_trio_service(stack.router):
            await stack.pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                for type_ in service.subscribed:
                    await nursery.start(service.drain, type_)
                if service.feeds and not config.bootstrap_only:
                    stack.host.set_stream_handler(FEED_PROTOCOL, service.feed_server.handle)
                service.clock.install()
                nursery.start_soon(service.publish_loop)
                await service.dialer.bootstrap()
                await nursery.start(service.nat.run, service.addrs)
                service.tunnels.install(nursery)
                if config.ipc_path is not None and not config.bootstrap_only:
                    await nursery.start(serve_ipc, config.ipc_path, service.handle,
                                        service.counters)
                nursery.start_soon(service.announce_loop)
                nursery.start_soon(service.dialer.maintain, service.self_id)
                if service.feeds and not config.bootstrap_only:
                    nursery.start_soon(service.feed_client.run, service.self_id)
                logger.info("swarm process %s up: %s (protocol %d, swarm %r)", identity.peer_id,
                            service.addrs, PROTOCOL_VERSION, config.swarm_id)
                task_status.started(Ready(peer_id=identity.peer_id, addrs=tuple(service.addrs),
                                          ipc=config.ipc_path))


async def _watch_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("received %s: leaving", signal.Signals(signum).name)
            scope.cancel()
            return


async def _main(config: GossipConfig, out: TextIO) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, nursery.cancel_scope)
        ready = await nursery.start(serve, config)
        out.write(ready.line() + "\n")
        out.flush()


def _bind_host(listen: tuple[str, ...]) -> str:
    """Tunnel listeners bind where the swarm listens (loopback for a wildcard)."""
    for text in listen:
        parts = text.split("/")
        if len(parts) > 2 and parts[1] == "ip4" and parts[2] != "0.0.0.0":
            return parts[2]
    return "127.0.0.1"


if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup


def _first_swarm_error(e: BaseException) -> SwarmError | None:
    if isinstance(e, SwarmError):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            found = _first_swarm_error(sub)
            if found is not None:
                return found
    return None


def run(config: GossipConfig, *, out: TextIO | None = None) -> int:
    """Run a swarm process in this thread until SIGTERM/SIGINT; return the exit status.

    A SwarmError (bad address, port in use, bootstrap unreachable) is one line on stderr and
    its ``exit_code``; anything else is a bug and propagates with its traceback.
    """
    try:
        trio.run(_main, config, out or sys.stdout)
    except BaseException as e:
        found = _first_swarm_error(e)
        if found is None:
            raise
        print(f"swarm: error: {found}", file=sys.stderr)
        return found.exit_code
    return 0
