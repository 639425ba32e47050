"""Child-interpreter half of tests/swarm/test_feed_resubscribe.py (libp2p cannot be imported
into a pytest process that may already hold hivemind). Prints one JSON line of observations.

``python -m tests.swarm.feed_resubscribe_check``: two hosts of our own stack on loopback, a
source S serving its feed (swarm.feeds.FeedServer) and a subscriber C holding one feed
(FeedClient) from it. S publishes numbered batches, one at a time, each waited for at C.
Then S ends C's feed stream from its side while the connection stays up — what hole punching
does when it closes the relayed connection a feed ran on — three times:

1. ``reset``: C must subscribe again at once, in the same slot, and keep receiving;
2. ``eof`` within ``feeds.cooldown_s`` of that: C must not (the failure path: cooled down,
   picked again after ``RETRY_S``), so a source that keeps closing cannot make it spin;
3. ``disconnect`` (S closes the whole connection), past ``feeds.cooldown_s``: C must not
   subscribe again on a connection it no longer has, nor dial for it.
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID

from protocol import PeerAnnouncement
from swarm.config import FeedsConfig, GossipConfig
from swarm.feeds import FEED_PROTOCOL, FeedClient, FeedServer
from swarm.peers import PeerTable
from tests.swarm.stacks import open_stacks

COOLDOWN_S = 10.0
"""``feeds.cooldown_s``: the resubscription window (and the cap of failure cool-downs)."""
WAIT_S = 30.0
"""Bound on each awaited condition (generous: a loaded 2-core box)."""


async def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> float:
    """Seconds until ``cond()`` held; AssertionError naming ``what`` after ``timeout_s``."""
    start = trio.current_time()
    with trio.move_on_after(timeout_s):
        while not cond():
            await trio.sleep(0.02)
        return trio.current_time() - start
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def end_feed_streams(source: IHost, subscriber: ID, how: str) -> int:
    """End, from the source's side, every feed stream it serves ``subscriber`` (``reset``,
    ``eof``), or close their connections (``disconnect``); how many it ended."""
    n = 0
    for conn in source.get_network().get_connections(subscriber):
        if how == "disconnect":
            await conn.close()
            n += 1
            continue
        for stream in conn.get_streams():
            if stream.get_protocol() == FEED_PROTOCOL:
                await (stream.reset() if how == "reset" else stream.close())
                n += 1
    return n


async def main() -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncExitStack() as ex:
        src, sub = await open_stacks(ex, 2)
        sid, cid = src.host.get_id(), sub.host.get_id()
        cfg = GossipConfig(data_dir="/nonexistent", swarm_id="resubscribe-check",
                           feeds=FeedsConfig(sources=1, cooldown_s=COOLDOWN_S))
        server = FeedServer(config=cfg, counters=collections.Counter())
        src.host.set_stream_handler(FEED_PROTOCOL, server.handle)
        table = PeerTable(ttl_s=3600)
        addr = f"{src.host.get_transport_addrs()[0]}/p2p/{sid.to_base58()}"
        table.update(PeerAnnouncement(peer_id=sid.to_base58(), addrs=(addr,)), trio.current_time())
        got: list[bytes] = []

        def on_frame(_peer: ID, data: bytes) -> bool:
            got.append(data)
            return True

        client = FeedClient(config=cfg, host=sub.host, table=table,
                            counters=collections.Counter(), on_frame=on_frame)
        sent: list[bytes] = []

        async def deliver(n: int, what: str) -> list[float]:
            """Publish ``n`` batches one at a time; seconds each took to arrive."""
            took = []
            for _ in range(n):
                data = b"batch-%d" % len(sent)
                sent.append(data)
                server.publish(data)
                took.append(await wait_for(lambda: data in got, f"{data!r} arrives {what}"))
            return took

        def counts() -> dict[str, int]:
            keys = ("feed_opened", "feed_resubscribed", "feed_failed", "feed_refused")
            return {k: client.counters[k] for k in keys} | {
                "accepted": server.counters["feed_subscribers_accepted"],
                "rejected_rate": server.counters["rejected_feed_request_rate"]}

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.run, cid)
            await wait_for(lambda: client.sources() == [sid.to_base58()]
                           and server.subscribers() == 1, "the feed opens")
            out["before"] = await deliver(3, "before any end")
            trial = client._feeds[sid].trial
            # 1. reset by the source, still connected: subscribed again at once
            ended_at = trio.current_time()
            out["reset_ended"] = await end_feed_streams(src.host, cid, "reset")
            out["after_reset"] = await deliver(5, "after the reset")
            out["reset_gap_s"] = out["after_reset"][0]
            out["reset_counts"] = counts()
            out["same_slot"] = sid in client._feeds and client._feeds[sid].trial is trial
            out["cooling_after_reset"] = sid in client._cooldown
            # 2. EOF from the source soon after: within cooldown_s, the failure path
            out["eof_within_window_s"] = trio.current_time() - ended_at
            out["eof_ended"] = await end_feed_streams(src.host, cid, "eof")
            await wait_for(lambda: client.counters["feed_failed"] >= 1, "the feed fails")
            out["cooling_after_eof"] = sid in client._cooldown
            out["eof_counts"] = counts()
            await wait_for(lambda: client.counters["feed_opened"] >= 2,
                           "the source is picked again after its cool-down")
            out["after_eof"] = await deliver(2, "after the cool-down")
            # 3. past the window, the source closes the connection: no resubscription
            await trio.sleep(max(0.0, ended_at + COOLDOWN_S + 0.5 - trio.current_time()))
            failed = client.counters["feed_failed"]
            out["disconnect_after_s"] = trio.current_time() - ended_at
            out["disconnect_ended"] = await end_feed_streams(src.host, cid, "disconnect")
            await wait_for(lambda: client.counters["feed_failed"] > failed,
                           "the feed fails with its connection")
            await trio.sleep(0.5)  # a wrong resubscription would be counted by now
            out["disconnect_counts"] = counts()
            nursery.cancel_scope.cancel()
    return out


if __name__ == "__main__":
    result = trio.run(main)
    sys.stdout.write(json.dumps(result) + "\n")
