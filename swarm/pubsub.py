"""py-libp2p's Pubsub with every drop counted and scored, and graylisted peers ignored cheaply.

Upstream (libp2p 0.8.1, ``pubsub.Pubsub``) drops several kinds of input with at most a debug
log line: a message whose pubsub signature fails is dropped before any topic validator runs,
so it moves no counter and costs its sender no score; a graylisted peer's RPCs are still
decoded and each of its messages spawns a task before the publish gate drops it. Here:

- a peer whose score falls below the graylist threshold is disconnected and banned for
  ``ban_s`` (``rejected_graylisted`` counts the RPC that found it there; ``banned_peers`` in
  stats): py-libp2p resets a peer's score when it disconnects, so the ban is what remembers,
  and reading a flood's frames, even unparsed, costs a yamux window update per few frames
  (measured: most of a graylisted flood's CPU). A banned peer's new streams are reset at
  once and we do not open ours to it. After ~``graylist / P4 weight`` invalid messages a
  flooding identity costs nothing more until its ban expires;
- a message with a bad pubsub signature is counted (``rejected_bad_pubsub_signature``) and
  charged to the forwarder's P4 like any invalid message (an honest peer never forwards one:
  it checks signatures before relaying);
- our own publishes skip re-verifying the signature we just made, and a copy of a message
  already seen is dropped as it is read, before a task is spawned for it;
- a peer's signed peer record (sent with every RPC) is verified once per distinct record,
  not once per RPC;
- outbound RPCs the router drops are ``dropped_outbound_queue_full`` (a peer's queue of 32
  is full) or ``dropped_outbound_oversized`` (``CountingGossipSub``);
- an RPC that is not protobuf is counted (``rejected_malformed_rpc``) and charged like an
  invalid message (upstream let the exception end the stream);
- the remaining silent drops are counted: ``rejected_bad_peer_record``,
  ``rejected_rpc_too_large``, ``rejected_blacklisted``, ``rejected_spoofed_self``,
  ``dropped_unsubscribed_topic``; redundant copies of a message are ``gossip_duplicates``
  (and ``gossip_duplicates_<label>`` per topic named in ``topic_labels``, e.g.
  ``gossip_duplicates_rollouts``).

Messages reach the learner from the topic validator (``GossipService._accept``), so the
per-topic subscription channels (32 slots, dropped silently when full) are not fed at all.
"""

from __future__ import annotations

import collections
import time
import logging
from collections import OrderedDict
from typing import Any

import trio
from google.protobuf.message import DecodeError as ProtobufDecodeError

from libp2p.abc import IHost, INetStream, IPubsubRouter
from libp2p.exceptions import ValidationError
from libp2p.io.exceptions import IOException, MessageTooLarge
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamEOF, StreamError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import GossipsubEvent, Pubsub
from libp2p.pubsub.utils import maybe_consume_signed_record
from libp2p.pubsub.validators import signature_validator
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

__all__ = ["CountingGossipSub", "GuardedPubsub", "Ignored"]

logger = logging.getLogger(__name__)

MAX_BANNED = 10_000
"""Bans remembered at once (the oldest is forgotten first): fresh identities are free, so
this bounds memory, not what an attacker can do."""


class Ignored(Exception):
    """Raised by a topic validator for a message to drop without penalising its forwarder
    (gossipsub's "ignore"; py-libp2p's validators can only say valid or invalid)."""


class CountingGossipSub(GossipSub):
    """GossipSub that counts the outbound RPCs it drops (upstream logs them at debug)."""

    def __init__(self, *args: Any, counters: collections.Counter[str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.counters = counters

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        self.counters[f"dropped_outbound_{reason}"] += 1  # queue_full or oversized
        super()._handle_dropped_rpc(peer_id, rpc, reason)


class GuardedPubsub(Pubsub):
    """``Pubsub`` that counts every drop in ``counters`` and scores bad signatures (P4)."""

    def __init__(self, host: IHost, router: IPubsubRouter, *,
                 counters: collections.Counter[str], ban_s: float, **kw: Any) -> None:
        super().__init__(host, router, **kw)
        # py-libp2p starts seqnos at int(time.time()) and adds 1 per publish: a node restarted
        # with the same key after publishing more messages than seconds elapsed reuses seqnos,
        # and peers drop its new messages as already seen (msg id = peer + seqno) for the
        # seen-cache TTL. Nanoseconds leave room for a billion publishes a second.
        self.counter = time.time_ns()
        self.counters = counters
        self.ban_s = ban_s
        self._records: dict[ID, bytes] = {}  # the last peer record verified, per peer
        self._banned: OrderedDict[ID, float] = OrderedDict()  # peer -> ban end (trio time)
        self.topic_labels: dict[str, str] = {}
        """Topic -> short name for the per-topic duplicate counters (set by the service)."""

    def _count_duplicate(self, msg: rpc_pb2.Message) -> None:
        self.counters["gossip_duplicates"] += 1
        for topic in msg.topicIDs:
            label = self.topic_labels.get(topic)
            if label is not None:
                self.counters[f"gossip_duplicates_{label}"] += 1

    # -- bans ------------------------------------------------------------------------------
    def is_banned(self, peer: ID) -> bool:
        until = self._banned.get(peer)
        if until is None:
            return False
        if trio.current_time() < until:
            return True
        del self._banned[peer]
        return False

    def banned_peers(self) -> int:
        return sum(self.is_banned(p) for p in list(self._banned))

    def _ban(self, peer: ID) -> None:
        """Ban a graylisted peer and close its connection (once; later calls are no-ops)."""
        if self.is_banned(peer):
            return
        self._banned[peer] = trio.current_time() + self.ban_s
        while len(self._banned) > MAX_BANNED:
            self._banned.popitem(last=False)
        logger.info("peer %s fell below the graylist threshold: disconnected, banned for "
                       "%.0f s", peer, self.ban_s)
        self.manager.run_task(self._disconnect, peer)

    async def _disconnect(self, peer: ID) -> None:
        try:
            await self.host.disconnect(peer)
        except Exception as e:  # already gone, or torn down concurrently
            logger.debug("disconnecting %s: %s", peer, e)

    async def _handle_new_peer(self, peer_id: ID) -> None:
        if self.is_banned(peer_id):
            self.counters["rejected_banned_peer"] += 1
            self.manager.run_task(self._disconnect, peer_id)
            return
        await super()._handle_new_peer(peer_id)

    # -- scoring ---------------------------------------------------------------------------
    def _graylisted(self, peer: ID) -> bool:
        scorer = getattr(self.router, "scorer", None)
        if scorer is None:
            return False
        return scorer.score(peer, list(self.topic_ids)) < scorer.params.graylist_threshold

    def _penalise(self, peer: ID, msg: rpc_pb2.Message) -> None:
        for topic in msg.topicIDs:
            if topic in self.topic_ids:  # never grow the scorer's maps on a peer's word
                self._penalise_topic(peer, topic)

    def _penalise_topic(self, peer: ID, topic: str) -> None:
        scorer = getattr(self.router, "scorer", None)
        if scorer is not None:
            scorer.on_invalid_message(peer, topic)

    # -- inbound RPCs ----------------------------------------------------------------------
    async def continuously_read_stream(self, stream: INetStream) -> None:
        peer_id = stream.muxed_conn.peer_id
        if self.is_banned(peer_id):
            self.counters["rejected_banned_peer"] += 1
            await self._disconnect(peer_id)
            return
        try:
            while self.manager.is_running:
                incoming = await read_varint_prefixed_bytes_limited(
                    stream, self.max_inbound_rpc_size)
                if self._graylisted(peer_id):
                    self.counters["rejected_graylisted"] += 1
                    self._ban(peer_id)
                    return
                rpc = rpc_pb2.RPC()
                try:
                    rpc.ParseFromString(incoming)
                except ProtobufDecodeError:
                    self.counters["rejected_malformed_rpc"] += 1
                    for topic in self.topic_ids:
                        self._penalise_topic(peer_id, topic)
                    continue
                if not self._consume_record(rpc, peer_id):
                    self.counters["rejected_bad_peer_record"] += 1
                    continue
                event = GossipsubEvent()
                event.peer_id = peer_id.pretty()
                event.message_size = len(incoming)
                if rpc.publish:
                    event.publish = True
                    for msg in rpc.publish:
                        if not self._is_subscribed_to_msg(msg):
                            self.counters["dropped_unsubscribed_topic"] += 1
                            continue
                        if self._is_msg_seen(msg):  # most copies in a mesh: skip the task
                            self._count_duplicate(msg)
                            continue
                        if self.manager.is_running:
                            self.manager.run_task(self.push_msg, peer_id, msg)
                if rpc.subscriptions:
                    event.subopts = True
                    if len(rpc.subscriptions) > self.max_subscriptions_per_rpc:
                        logger.warning("peer %s sent %d subscriptions in one RPC (limit %d)",
                                       peer_id, len(rpc.subscriptions),
                                       self.max_subscriptions_per_rpc)
                    else:
                        for sub in rpc.subscriptions:
                            self.handle_subscription(peer_id, sub)
                if rpc.HasField("control"):
                    event.control = True
                    await self.router.handle_rpc(rpc, peer_id)
                if stream.metric_send_channel is not None:
                    await stream.metric_send_channel.send(event)
        except MessageTooLarge as e:
            self.counters["rejected_rpc_too_large"] += 1
            logger.warning("pubsub RPC from %s over %d bytes: %s", peer_id,
                           self.max_inbound_rpc_size, e)
            try:
                await stream.reset()
            except Exception:  # the stream may already be gone; nothing to do
                pass
            self._handle_dead_peer(peer_id)
        except (StreamEOF, StreamError, IOException, RawConnError) as e:
            logger.debug("pubsub stream of %s ended: %s", peer_id, e)

    def _consume_record(self, rpc: rpc_pb2.RPC, peer_id: ID) -> bool:
        """Verify the RPC's signed peer record unless it is the one verified last time."""
        if not rpc.HasField("senderRecord"):
            return True
        if self._records.get(peer_id) == rpc.senderRecord:
            return True
        if not maybe_consume_signed_record(rpc, self.host, peer_id):
            return False
        self._records[peer_id] = rpc.senderRecord
        return True

    def _handle_dead_peer(self, peer_id: ID) -> None:
        self._records.pop(peer_id, None)
        super()._handle_dead_peer(peer_id)

    # -- one message -----------------------------------------------------------------------
    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        """Upstream's ``push_msg`` with each drop counted and bad signatures scored."""
        own = msg_forwarder == self.my_id
        if not own and self._graylisted(msg_forwarder):
            self.counters["rejected_graylisted"] += 1  # graylisted after the RPC was read
            self._ban(msg_forwarder)
            return
        if self.is_peer_blacklisted(msg_forwarder) or self.is_peer_blacklisted(ID(msg.from_id)):
            self.counters["rejected_blacklisted"] += 1
            return
        if self._is_msg_seen(msg):
            self._count_duplicate(msg)
            return
        if self.strict_signing and not own and not _signature_ok(msg):
            self.counters["rejected_bad_pubsub_signature"] += 1
            self._penalise(msg_forwarder, msg)
            return
        try:
            await self.validate_msg(msg_forwarder, msg)
        except Ignored:
            return  # counted by our validator; not cached, so a later copy is checked again
        except ValidationError:
            self._penalise(msg_forwarder, msg)  # our validator counted the reason
            return
        self._mark_msg_seen(msg)
        scorer = getattr(self.router, "scorer", None)
        if scorer is not None:
            for topic in msg.topicIDs:
                if topic in self.topic_ids:
                    scorer.on_first_delivery(msg_forwarder, topic)
        if not own and ID(msg.from_id) == self.my_id:
            self.counters["rejected_spoofed_self"] += 1
            return
        await self.router.publish(msg_forwarder, msg)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        """Nothing to do: the topic validator already delivered the message (see above)."""


def _signature_ok(msg: rpc_pb2.Message) -> bool:
    try:
        return bool(signature_validator(msg))
    except Exception:  # a malformed key makes upstream raise rather than return False
        return False
