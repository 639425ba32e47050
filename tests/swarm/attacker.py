"""A real attacker process: our host builder, then raw publishes of crafted payloads.

``python -m tests.swarm.attacker '<json>'`` with keys: data_dir, victim (full multiaddr),
swarm_id, topic_type, rate_burst (how many valid messages to send back to back), plan
("all", "invalid_only": rate_burst malformed payloads, or "flood": see below), pause_s. It
prints one JSON line ``{"event": "done", "peer_id": ..., "sent": {...}}`` and exits.

The "flood" plan writes ``count`` RPCs straight onto the victim's pubsub stream (no outbound
queue to drop them) at ``rate`` per second, each with one message of ``kind``:

- ``bad_pubsub_sig``: a valid sealed batch whose pubsub signature is wrong;
- ``unknown_key_bomb``: a validly signed batch (fresh nonce each) with ~63k msgpack integers
  under an unknown key.

Every RPC carries our signed peer record, as py-libp2p's own RPCs do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import multiaddr
import trio
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.tools.anyio_service import background_trio_service

from protocol import Identity, load_or_create_identity, seal
from protocol.envelope import _signed_bytes
from protocol.limits import packb, unpackb
from protocol.version import PROTOCOL_VERSION
from swarm.config import GossipConfig
from swarm.host import build_stack, parse_peer_addr
from swarm.topics import topic_for
from tests.swarm.conftest import batch


def sealed_body(me: Identity, swarm_id: str, wire: dict[str, Any]) -> bytes:
    """Sign an arbitrary rollouts body with our own key: only its content is hostile."""
    body = packb(wire)
    ts, n = int(time.time() * 1000), os.urandom(16)
    sig = me.sign(_signed_bytes(PROTOCOL_VERSION, "rollouts", me.public_key, swarm_id, ts, n, body))
    return packb({"v": PROTOCOL_VERSION, "t": "rollouts", "pk": me.public_key, "sw": swarm_id,
                  "ts": ts, "n": n, "b": body, "s": sig})


def unknown_key_bomb(me: Identity, swarm_id: str, label: str, objects: int) -> bytes:
    """A valid, self-signed batch carrying ``objects`` msgpack integers under an unknown key."""
    return sealed_body(me, swarm_id, batch(label, 0).to_wire()
                       | {"x": [[0] * 1000] * (objects // 1000)})


def crafted(me: Identity, swarm_id: str, burst: int) -> list[tuple[str, bytes]]:
    """(label, payload) in sending order; the label is also the batch's model name."""
    now = int(time.time() * 1000)

    def good(label: str, **kw: Any) -> bytes:
        return seal(me, batch(label, 0), swarm_id=kw.pop("swarm", swarm_id), **kw)

    forged = unpackb(good("forged"))
    forged["s"] = bytes(64 - 1) + b"\x01"
    replay = good("replay", now_ms=now - 200_000)  # old but inside the 300 s window
    out = [
        ("forged", packb(forged)),
        ("wrong_swarm", good("wrong_swarm", swarm="another-swarm")),
        ("oversized", unknown_key_bomb(me, swarm_id, "oversized", 63_000)),  # issue 11's bomb
        ("unknown_fields", unknown_key_bomb(me, swarm_id, "unknown_fields", 5_000)),
        ("malformed", b"\xc1 not msgpack"),
        ("wrong_sender", seal(Identity.generate(), batch("wrong_sender", 0), swarm_id=swarm_id)),
        ("replay", replay),
        ("replay", replay),  # the same envelope again, under a new pubsub seqno
        ("stale", good("stale", now_ms=now - 400_000)),
    ]
    out += [("burst", good("burst")) for _ in range(burst)]
    return out


async def flood(stack: Any, me: Identity, victim: Any, topic: str, args: dict[str, Any]) -> int:
    """Write ``count`` single-message RPCs to the victim at ``rate``/s; return how many went."""
    kind, count, rate = args["kind"], int(args["count"]), float(args["rate"])
    record, _ = env_to_send_in_RPC(stack.host)
    stream = stack.pubsub.peers[victim.peer_id]
    start = trio.current_time()
    for i in range(count):
        if kind == "bad_pubsub_sig":
            msg = rpc_pb2.Message(data=seal(me, batch(f"badsig{i}", 0), swarm_id=args["swarm_id"]),
                                  topicIDs=[topic], from_id=stack.host.get_id().to_bytes(),
                                  seqno=stack.pubsub._next_seqno())
            msg.key = stack.host.get_public_key().serialize()
            msg.signature = bytes(64)
        elif kind == "unknown_key_bomb":
            bomb = unknown_key_bomb(me, args["swarm_id"], f"bomb{i}", 63_000)  # fresh nonce
            msg = rpc_pb2.Message(data=bomb, topicIDs=[topic],
                                  from_id=stack.host.get_id().to_bytes(),
                                  seqno=stack.pubsub._next_seqno())
            msg.signature = stack.pubsub.sign_key.sign(  # signs data, topics, from, seqno
                PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
            msg.key = stack.host.get_public_key().serialize()
        else:
            raise ValueError(f"unknown flood kind {kind!r}")
        try:
            if not await stack.pubsub.write_msg(stream, rpc_pb2.RPC(publish=[msg],
                                                                    senderRecord=record)):
                return i
        except Exception:  # the victim closed the connection: py-libp2p raises several types
            return i
        await trio.sleep_until(start + (i + 1) / rate)
    return count


async def reconnect(stack: Any, victim: Any, topic: str) -> bool:
    """Whether the victim lets us back in: a connection whose pubsub stream stays open."""
    try:
        with trio.fail_after(5):
            await stack.host.connect(victim)
            while victim.peer_id not in stack.pubsub.peers:
                await trio.sleep(0.05)
        await trio.sleep(1.0)
    except Exception:
        return False
    return victim.peer_id in stack.host.get_connected_peers() and victim.peer_id in stack.pubsub.peers


async def attack(args: dict[str, Any]) -> dict[str, Any]:
    me = load_or_create_identity(args["data_dir"])
    config = GossipConfig(data_dir=args["data_dir"], listen=("/ip4/127.0.0.1/tcp/0",),
                          swarm_id=args["swarm_id"])
    stack = build_stack(me, config)
    victim = parse_peer_addr(args["victim"])
    topic = topic_for(args["swarm_id"], args.get("topic_type", "rollouts"))
    sent: dict[str, int] = {}
    async with stack.host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        async with background_trio_service(stack.pubsub), background_trio_service(stack.router):
            await stack.pubsub.wait_until_ready()
            with trio.fail_after(30):
                await stack.host.connect(victim)
                # publish through fanout: wait until the victim's subscription is known
                while victim.peer_id not in stack.pubsub.peer_topics.get(topic, set()) or \
                        victim.peer_id not in stack.router.peer_protocol:
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            if args.get("plan") == "flood":
                print(json.dumps({"event": "flood_start"}), flush=True)  # bench/flood_cost.py
                sent[args["kind"]] = await flood(stack, me, victim, topic, args)
                await trio.sleep(1.0)
                back = await reconnect(stack, victim, topic) if args.get("reconnect") else None
                return {"event": "done", "peer_id": me.peer_id, "sent": sent, "let_back_in": back}
            plan = crafted(me, args["swarm_id"], int(args["rate_burst"]))
            if args.get("plan") == "invalid_only":
                plan = [("malformed", b"\xc1 not msgpack")] * int(args["rate_burst"])
            for label, payload in plan:
                await stack.pubsub.publish(topic, payload)
                sent[label] = sent.get(label, 0) + 1
                await trio.sleep(0.01 if label == "burst" else 0.05)
            await trio.sleep(float(args.get("pause_s", 2.5)))  # let the victim's bucket refill
            await stack.pubsub.publish(topic, seal(me, batch("good", 1), swarm_id=args["swarm_id"]))
            sent["good"] = 1
            await trio.sleep(1.0)  # let the outbound queue drain before leaving
    return {"event": "done", "peer_id": me.peer_id, "sent": sent}


def main() -> None:
    args = json.loads(sys.argv[1])
    result = trio.run(attack, args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
