"""Gossip attacks: hosts built like ours (``swarm.host.build_stack``), crafted publishes.

One process runs one attack from ``identities`` fresh keys (one host each). Host 0 also
subscribes to the rollouts topic and records what the honest peers publish, so a test can
tell whether their own generations were hijacked (``observed``). The attack runs until
``duration_s`` is over or the process gets SIGTERM/SIGINT, then reports what it sent.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from protocol import Identity, PeerAnnouncement, ProtocolError, RolloutBatch, open_envelope, seal
from swarm.config import GossipConfig
from swarm.host import Stack, build_stack, parse_peer_addr
from swarm.pubsub import Ignored
from swarm.topics import topic_for
from tests.adversary.attacks import Attack
from tests.adversary.payloads import (
    STEER_ANSWER,
    Bloated,
    bloat_junk,
    code_exec_batch,
    cpu_bomb_batch,
    steering_batch,
)

__all__ = ["run_gossip_attack"]

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
CONNECT_TIMEOUT_S = 120.0
BAD_SIGNATURE_BATCH = 1
"""Messages per RPC in the bad-signature flood (the receiver pays per RPC: it verifies
the signed peer record each one carries, so one message per RPC costs it the most)."""
TINY_ADD_CONFIG = {"max_operand": 9, "closeness": 0.5}
"""The honest nodes' tiny_add config as their specs carry it (defaults merged)."""


@dataclass
class Observer:
    """What host 0 hears: the victims' model fingerprint (from their announcements) and
    their own completions, counting those that are the steered answer."""

    own: set[str]
    swarm_id: str
    watched: frozenset[bytes] = frozenset()
    """Pubsub ``from`` ids (bytes) of the peers to observe; empty: everyone."""
    own_ids: frozenset[bytes] = frozenset()
    """Pubsub ``from`` ids (bytes) of ``own``: what we publish goes through ``see`` too."""
    model: str = ""
    model_known: trio.Event = field(default_factory=trio.Event)
    by_sender: dict[str, dict[int, list[float]]] = field(
        default_factory=lambda: collections.defaultdict(dict))

    def see(self, _peer: Any, msg: Any) -> bool:
        """Topic validator (swarm.pubsub delivers through validators, not subscriptions):
        record a watched peer's message and let it through; ignore (drop, no penalty, not
        relayed) everyone else's unread. Reading every message of the flood, the observer
        fell 50 s behind the victims on a loaded box and missed their last rounds."""
        if self.watched and msg.from_id not in self.watched | self.own_ids:
            raise Ignored("not a watched peer")  # our own publishes pass: validators see them
        try:
            env = open_envelope(msg.data, swarm_id=self.swarm_id)
        except ProtocolError:
            return True
        sender, message = env.sender_peer_id, env.message
        if sender in self.own:
            return True
        if isinstance(message, PeerAnnouncement) and message.model:
            self.model = message.model
            self.model_known.set()
        if isinstance(message, RolloutBatch):
            counts = self.by_sender[sender].setdefault(message.round,
                                                       [0, 0, round(time.time(), 1)])
            for rollout in message.rollouts:
                counts[0] += len(rollout.completions)
                counts[1] += sum(c.strip() == STEER_ANSWER for c in rollout.completions)
        return True

    async def drain(self, subscription: Any) -> None:
        async for _ in subscription:
            pass  # swarm.pubsub feeds no subscription channel; ``see`` recorded it

    def summary(self) -> dict[str, dict[str, list[float]]]:
        """sender -> round -> [completions, completions equal to the steered answer, when
        the first batch of that round was heard (unix time)]."""
        return {s: {str(r): c for r, c in sorted(rounds.items())}
                for s, rounds in self.by_sender.items()}


async def _open(exit_stack: AsyncExitStack, me: Identity, args: dict[str, Any], i: int) -> Stack:
    """One identity's host, listening on ``args["listen_ip"]`` (default 127.0.0.1)."""
    listen = LOOPBACK.replace("127.0.0.1", str(args.get("listen_ip", "127.0.0.1")))
    config = GossipConfig(data_dir=os.path.join(args["data_dir"], str(i)), listen=(listen,),
                          swarm_id=args["swarm_id"])
    stack = build_stack(me, config)
    await exit_stack.enter_async_context(stack.host.run([multiaddr.Multiaddr(listen)]))
    await exit_stack.enter_async_context(background_trio_service(stack.pubsub))
    await exit_stack.enter_async_context(background_trio_service(stack.router))
    await stack.pubsub.wait_until_ready()
    return stack


async def _listening(addr: str) -> None:
    """Until the victim's TCP port accepts (libp2p's own dial gives up on a port for good
    once it has failed, so it is only tried when the port is up)."""
    parts = addr.split("/")
    host, port = parts[2], int(parts[4])
    while True:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            await trio.sleep(0.5)
            continue
        await stream.aclose()
        return


async def _reach(stack: Stack, victims: list[str], topic: str) -> None:
    """Connect to every victim once it listens and wait until its subscription to
    ``topic`` is known."""
    with trio.fail_after(CONNECT_TIMEOUT_S):
        for addr in victims:
            await _listening(addr)
            for attempt in range(5):
                try:
                    await stack.host.connect(parse_peer_addr(addr))
                    break
                except Exception:  # noqa: BLE001 - listening but not yet serving
                    if attempt == 4:
                        raise
                    await trio.sleep(1.0)
        for victim in map(parse_peer_addr, victims):
            while victim.peer_id not in stack.pubsub.peer_topics.get(topic, set()) or \
                    victim.peer_id not in stack.router.peer_protocol:
                await trio.sleep(0.05)


class Sender:
    """Publishes one attack's payloads at ``rate_per_s`` per identity and counts them."""

    def __init__(self, attack: Attack, args: dict[str, Any], identities: list[Identity],
                 topic: str) -> None:
        self.attack, self.args, self.ids, self.topic = attack, dict(args), identities, topic
        self.sent: collections.Counter[str] = collections.Counter()
        self.rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        self.round = 0
        self._bad_sig_data: bytes | None = None
        self._sender_record: bytes | None = None

    async def run(self, stacks: list[Stack], *, model: str) -> None:
        """Attack from every identity (one host each), claiming the victims' ``model``."""
        self.args["model"] = model
        if self.attack is Attack.OBSERVE:
            return
        async with trio.open_nursery() as nursery:
            for stack, me in zip(stacks, self.ids):
                nursery.start_soon(self._loop, stack, me)

    async def _loop(self, stack: Stack, me: Identity) -> None:
        per_call = BAD_SIGNATURE_BATCH if self.attack is Attack.BAD_SIGNATURES else 1
        period = per_call / float(self.args["rate_per_s"])
        build = self._builder()
        limit = int(self.args.get("messages", 0)) or None
        while limit is None or self.sent["messages"] < limit:
            started = trio.current_time()
            await build(stack, me)
            await trio.sleep(max(0.0, period - (trio.current_time() - started)))

    def _builder(self) -> Callable[[Stack, Identity], Awaitable[None]]:
        if self.attack is Attack.BAD_SIGNATURES:
            return self._bad_signature
        return self._sealed

    def _batch(self) -> Any:
        a, model = self.args, self.args.get("model", "unknown")
        self.round += 1
        if self.attack is Attack.CODE_EXEC:
            return code_exec_batch(a["marker_dir"], model=model, round_=self.round)
        if self.attack is Attack.CPU_BOMB:
            return cpu_bomb_batch(model=model, round_=self.round, specs=int(a["specs"]),
                                  max_n=int(a["max_n"]))
        if self.attack is Attack.UNKNOWN_KEYS:  # a valid (zero-advantage) batch + junk
            inner = steering_batch(model=model, round_=self.round, seed=self._seed(),
                                   group_sizes=(8,), task_config=TINY_ADD_CONFIG, answer="?")
            return Bloated(inner, bloat_junk(int(a["objects"])))
        return steering_batch(model=model, round_=self.round, seed=self._seed(),
                              group_sizes=tuple(a["group_sizes"]), task_config=TINY_ADD_CONFIG)

    def batch_for_warm_up(self) -> None:
        """Build (and drop) one payload: imports its task code before the clock starts."""
        if self.attack not in (Attack.BAD_SIGNATURES, Attack.OBSERVE):
            self._batch()
        self.round = 0

    def _seed(self) -> int:
        return self.rng.randrange(2**31)  # fresh tasks: no dedupe by spec or prompt

    async def _sealed(self, stack: Stack, me: Identity) -> None:
        batch = await trio.to_thread.run_sync(self._batch)
        data = seal(me, batch, swarm_id=self.args["swarm_id"])
        await stack.pubsub.publish(self.topic, data)
        self.sent["messages"] += 1
        self.sent["bytes"] += len(data)
        self.sent["rollouts"] += len(getattr(batch, "inner", batch).rollouts)

    async def _bad_signature(self, stack: Stack, me: Identity) -> None:
        """BAD_SIGNATURE_BATCH messages with a valid envelope whose pubsub signature is 64
        random bytes, in one RPC to every pubsub peer (our own pubsub would refuse to send
        them, and the router's publish signs a fresh peer record per call: too slow)."""
        pubsub = stack.pubsub
        if self._bad_sig_data is None:
            self._bad_sig_data = seal(me, steering_batch(
                model=self.args["model"], round_=0, seed=self._seed(), group_sizes=(8,),
                task_config=TINY_ADD_CONFIG, answer="?"), swarm_id=self.args["swarm_id"])
        key = stack.host.get_public_key().serialize()
        msgs = [rpc_pb2.Message(data=self._bad_sig_data, topicIDs=[self.topic],
                                from_id=pubsub.my_id.to_bytes(), seqno=pubsub._next_seqno(),
                                key=key, signature=os.urandom(64))
                for _ in range(BAD_SIGNATURE_BATCH)]
        rpc = rpc_pb2.RPC(publish=msgs, senderRecord=self._record(stack))
        for peer in list(pubsub.peers):
            stack.router.send_rpc(peer, rpc)
        self.sent["messages"] += len(msgs)
        await trio.sleep(0)


    def _record(self, stack: Stack) -> bytes:
        if self._sender_record is None:
            self._sender_record, _ = env_to_send_in_RPC(stack.host)
        return self._sender_record


def _line(event: str, **data: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


async def _until_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def run_gossip_attack(attack: Attack, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``attack`` (see hostile.py for ``args``); what was sent and observed."""
    n = int(args.get("identities", 1)) if attack is Attack.SYBIL else 1
    identities = [Identity.generate() for _ in range(n)]
    victims = list(args["victims"])
    topic = topic_for(args["swarm_id"], "rollouts")
    observer = Observer(own={me.peer_id for me in identities}, swarm_id=args["swarm_id"],
                        watched=frozenset(parse_peer_addr(a).peer_id.to_bytes() for a in victims),
                        own_ids=frozenset(ID.from_base58(me.peer_id).to_bytes()
                                          for me in identities))
    links: dict[str, list[list[Any]]] = collections.defaultdict(list)
    sender = Sender(attack, args, identities, topic)
    await trio.to_thread.run_sync(sender.batch_for_warm_up)  # slow imports happen now
    _line("loaded")
    async with AsyncExitStack() as exit_stack:
        stacks = [await _open(exit_stack, me, args, i) for i, me in enumerate(identities)]
        async with trio.open_nursery() as nursery:
            for type_ in ("rollouts", "announce"):
                topic_name = topic_for(args["swarm_id"], type_)
                stacks[0].pubsub.set_topic_validator(topic_name, observer.see, False)
                subscription = await stacks[0].pubsub.subscribe(topic_name)
                nursery.start_soon(observer.drain, subscription)
            nursery.start_soon(_watch_links, stacks[0], victims, links)
            async with trio.open_nursery() as connecting:
                for stack in stacks:
                    connecting.start_soon(_reach, stack, victims, topic)
            await trio.sleep(1.0)  # one gossipsub heartbeat: meshes include the victims
            with trio.move_on_after(CONNECT_TIMEOUT_S):  # claim the victims' model
                await observer.model_known.wait()
            model = observer.model or "unknown"
            _line("ready", model=model, peer_ids=[me.peer_id for me in identities])
            with trio.move_on_after(float(args["duration_s"])) as scope:
                nursery.start_soon(_until_signal, scope)
                await sender.run(stacks, model=model)
                await trio.sleep_forever()  # a bounded attack (messages) waits for the end
            await trio.sleep(0.5)  # let the outbound queues drain
            nursery.cancel_scope.cancel()
    return {"peer_ids": [me.peer_id for me in identities], "sent": dict(sender.sent),
            "observed": observer.summary(), "links": dict(links),
            "observer_counters": dict(stacks[0].counters)}


async def _watch_links(stack: Stack, victims: list[str],
                       history: dict[str, list[list[Any]]]) -> None:
    """Victim -> [[unix time, state], ...] whenever what host 0 knows of it changes (to tell
    a lost connection from a lost pubsub stream or a forgotten subscription when an
    observer stops hearing a victim)."""
    peers = [parse_peer_addr(addr).peer_id for addr in victims]
    while True:
        for peer in peers:
            topics = sorted(t.rsplit("/", 1)[-1] for t, subscribed in
                            stack.pubsub.peer_topics.items() if peer in subscribed)
            mesh = sorted(t.rsplit("/", 1)[-1] for t, members in stack.router.mesh.items()
                          if peer in members)
            state = (f"connected={peer in stack.host.get_connected_peers()} "
                     f"pubsub={peer in stack.pubsub.peers} topics={topics} mesh={mesh}")
            seen = history[str(peer)]
            if not seen or seen[-1][1] != state:
                seen.append([round(time.time(), 1), state])
        await trio.sleep(0.5)
