"""Child-interpreter half of tests/swarm/test_time.py (libp2p cannot be imported into a pytest
process that may already hold hivemind). Prints one JSON line of observations.

``python -m tests.swarm.time_check SKEW_MS``: three in-process hosts on loopback. A server S
whose clock runs SKEW_MS ahead; a client C asks S the time twice at once (the second is over
S's per-peer budget), then asks a host that does not serve the protocol (an older peer).
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import AsyncExitStack

import trio
from libp2p.peer.peerinfo import PeerInfo

from swarm.clock import TimeServer, ask_time
from tests.swarm.stacks import open_stacks


async def main(skew_ms: int) -> dict:
    out: dict = {}
    async with AsyncExitStack() as ex:
        server, client, old = (s.host for s in await open_stacks(ex, 3))
        clock = TimeServer(server, now_ms=lambda: time.time_ns() // 1_000_000 + skew_ms)
        clock.install()
        for peer in (server, old):
            await client.connect(PeerInfo(peer.get_id(), [peer.get_transport_addrs()[0]]))
        told = await ask_time(client, server.get_id(), timeout_s=10)
        out["offset_ms"], out["rtt_ms"] = told.offset_ms, told.rtt_ms
        for name, peer in (("again", server), ("old", old)):
            try:
                await ask_time(client, peer.get_id(), timeout_s=10)
                out[name] = "answered"
            except Exception as e:  # noqa: BLE001 - what the probe reports
                out[name] = type(e).__name__
        out["served"], out["refused"] = clock.served, clock.refused
    return out


if __name__ == "__main__":
    result = trio.run(main, int(sys.argv[1]))
    sys.stdout.write(json.dumps(result) + "\n")
