"""Child-interpreter half of tests/swarm/test_feed_networks.py (libp2p cannot be imported into
a pytest process that may already hold hivemind). Prints one JSON line of observations.

``python -m tests.swarm.feed_networks_check``: real hosts of our own stack on loopback, in
three networks (``feeds.loopback_networks`` on; any 127/8 address is loopback on Linux): a
farm of ``FARM`` keys on 127.0.1.1 and two honest sources, on 127.0.2.1 and 127.0.3.1.

1. ``spread``: a subscriber holding 4 feeds with ``feeds.max_per_network`` 2, the farm being
   ``FARM`` of the ``FARM + 2`` keys it knows, ends with both honest sources and 2 farm keys
   (uniform picks over keys give both honest ones about 1 time in 15);
2. ``placed``: a farm key that announces an address in a free network besides its own is
   picked for it, but once its feed's connection shows the farm's network (full), the feed
   is not opened and the key is not picked again while an honest source is left.
"""

from __future__ import annotations

import collections
import json
import sys
from contextlib import AsyncExitStack
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from protocol import PeerAnnouncement
from swarm.config import FeedsConfig, GossipConfig
from swarm.feeds import FEED_PROTOCOL, FeedClient, FeedServer, _Feed
from swarm.host import Stack
from swarm.networks import Networks
from swarm.peers import PeerTable
from tests.swarm.feed_resubscribe_check import wait_for
from tests.swarm.stacks import open_stacks

FARM = 6
FARM_IP, HONEST_IPS = "127.0.1.1", ("127.0.2.1", "127.0.3.1")


def serve(stacks: list[Stack], cfg: GossipConfig) -> None:
    for s in stacks:
        s.host.set_stream_handler(FEED_PROTOCOL, FeedServer(
            config=cfg, counters=collections.Counter()).handle)


def addr(stack: Stack) -> str:
    return f"{stack.host.get_transport_addrs()[0]}/p2p/{stack.host.get_id().to_base58()}"


def client(sub: Stack, cfg: GossipConfig, table: PeerTable) -> FeedClient:
    return FeedClient(config=cfg, host=sub.host, table=table, counters=collections.Counter(),
                      on_frame=lambda _peer, _data: True)


async def main() -> dict[str, Any]:
    out: dict[str, Any] = {}
    nets, looped = Networks(), Networks(loopback=True)
    out["of"] = [nets.of_ip("203.0.113.77"), nets.of_ip("2001:db8:1:2::5"),
                 nets.of_ip("::ffff:198.51.100.9"), nets.of_ip("127.0.1.1"),
                 looped.of_ip("127.0.1.1"), nets.of_ip("not an ip"),
                 nets.of_addr("/ip4/198.51.100.9/tcp/4001/p2p/R/p2p-circuit/p2p/X"),
                 nets.of_addr("/dns4/example.org/tcp/4001")]
    async with AsyncExitStack() as ex:
        farm = await open_stacks(ex, FARM, ip=FARM_IP)
        honest = [(await open_stacks(ex, 1, ip=ip))[0] for ip in HONEST_IPS]
        sub, sub2 = await open_stacks(ex, 2)
        cfg = GossipConfig(data_dir="/nonexistent", swarm_id="networks-check",
                           feeds=FeedsConfig(sources=4, max_per_network=2, rotate_s=1000.0,
                                             loopback_networks=True))
        serve(farm + honest, cfg)
        honest_ids = {h.host.get_id().to_base58() for h in honest}
        farm_ids = {f.host.get_id().to_base58() for f in farm}

        # 1. spread
        table = PeerTable(ttl_s=3600)
        for s in farm + honest:
            table.update(PeerAnnouncement(peer_id=s.host.get_id().to_base58(),
                                          addrs=(addr(s),)), trio.current_time())
        c = client(sub, cfg, table)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.run, sub.host.get_id())
            await wait_for(lambda: len(c.sources()) == 4, "4 feeds open")
            await trio.sleep(1.0)  # a feed over the cap would have been opened by now
            held = set(c.sources())
            out["spread"] = {"honest": len(held & honest_ids), "farm": len(held & farm_ids),
                             "networks": sorted(str(f.network) for f in c._feeds.values()),
                             "network_full": c.counters["feed_network_full"]}
            nursery.cancel_scope.cancel()

        # 2. placed: the farm key announces a free network's address before its own
        liar = farm[0]
        liar_id = liar.host.get_id()
        table2 = PeerTable(ttl_s=3600)
        port = str(liar.host.get_transport_addrs()[0]).split("/")[4]
        table2.update(PeerAnnouncement(
            peer_id=liar_id.to_base58(),
            addrs=(f"/ip4/127.0.9.1/tcp/{port}/p2p/{liar_id.to_base58()}", addr(liar))),
            trio.current_time())
        for s in (farm[1], farm[2], honest[0]):
            table2.update(PeerAnnouncement(peer_id=s.host.get_id().to_base58(),
                                           addrs=(addr(s),)), trio.current_time())
        c2 = client(sub2, cfg, table2)
        c2._self = sub2.host.get_id()
        # two farm feeds hold the farm network's slots
        for s in (farm[1], farm[2]):
            pid = s.host.get_id()
            await sub2.host.connect(PeerInfo(pid, s.host.get_transport_addrs()))
            stream = await sub2.host.new_stream(pid, [FEED_PROTOCOL])
            held_feed = _Feed(peer=pid, started=0.0, scope=trio.CancelScope())
            c2._feeds[pid] = held_feed
            out.setdefault("held_refused", []).append(c2._network_full(held_feed, stream))
            held_feed.open = True
        cands = {i.peer_id: i for i in c2._candidates(sub2.host.get_id())}
        out["liar_placed_before"] = sorted(map(str, c2._placed(cands[liar_id])))
        picks_before = collections.Counter(
            str(c2._pick(sub2.host.get_id()).peer_id) for _ in range(200))  # type: ignore[union-attr]
        out["liar_picked_before"] = picks_before[liar_id.to_base58()]
        await sub2.host.connect(PeerInfo(liar_id, liar.host.get_transport_addrs()))
        stream = await sub2.host.new_stream(liar_id, [FEED_PROTOCOL])
        feed = _Feed(peer=liar_id, started=0.0, scope=trio.CancelScope())
        c2._feeds[liar_id] = feed
        out["liar_refused"] = c2._network_full(feed, stream)
        del c2._feeds[liar_id]
        c2._cooldown.clear()  # its cool-down aside: the network alone keeps it out
        out["liar_placed_after"] = sorted(map(str, c2._placed(cands[liar_id])))
        picks_after = collections.Counter(
            str(c2._pick(sub2.host.get_id()).peer_id) for _ in range(200))  # type: ignore[union-attr]
        out["liar_picked_after"] = picks_after[liar_id.to_base58()]
        out["honest_picked_after"] = picks_after[honest[0].host.get_id().to_base58()]
        out["network_full"] = c2.counters["feed_network_full"]
    return out


if __name__ == "__main__":
    result = trio.run(main)
    sys.stdout.write(json.dumps(result) + "\n")
