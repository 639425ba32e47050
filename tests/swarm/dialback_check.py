"""Child-interpreter half of tests/swarm/test_reachability.py (libp2p cannot be imported into
a pytest process that may already hold hivemind). Prints one JSON line of observations.

Three in-process hosts on loopback: a server S, clients C1 and C2.
- dial-back (swarm.reachability): C1 asks for its real port, C2 for a port where nobody
  listens, C1 asks again at once (rate limit);
- py-libp2p 0.8.1's AutoNAT for comparison: C2 advertises only that dead port and asks S.
"""

from __future__ import annotations

import json
import socket
import sys
from contextlib import AsyncExitStack

import multiaddr
import trio
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.peerinfo import PeerInfo

from swarm.reachability import DialBackServer, ask_dial_back
from tests.swarm.stacks import open_stacks


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nobody listens there


async def main() -> dict:
    out: dict = {}
    async with AsyncExitStack() as ex:
        server, c1, c2 = (s.host for s in await open_stacks(ex, 3))
        dialback = DialBackServer(server, dial_timeout_s=5.0)
        dialback.install()
        AutoNATService(server)  # type: ignore[arg-type]  # registers py-libp2p's server side
        addr = server.get_transport_addrs()[0]
        for c in (c1, c2):
            await c.connect(PeerInfo(server.get_id(), [addr]))
        c1_port = int(c1.get_transport_addrs()[0].value_for_protocol("tcp"))
        dead = dead_port()
        with trio.fail_after(30):
            v1 = await ask_dial_back(c1, server.get_id(), c1_port, timeout_s=10)
            v2 = await ask_dial_back(c2, server.get_id(), dead, timeout_s=10)
            v3 = await ask_dial_back(c1, server.get_id(), c1_port, timeout_s=10)
        out["dialback"] = [v1.status, v2.status, v3.status]
        out["observed_ip"] = v1.observed_ip
        out["served"], out["refused"] = dialback.served, dialback.refused
        # the server's dial-back must not have left a second connection to C1
        out["server_conns_to_c1"] = len(server.get_network().get_connections(c1.get_id()))
        client = AutoNATService(c2, serve=False)  # type: ignore[arg-type]
        with trio.fail_after(30):
            status, _ = await client.query_server(
                server.get_id(), [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{dead}").to_bytes()])
        out["autonat_dead_port_status_ok"] = status == int(Message.OK)
    return out


if __name__ == "__main__":
    result = trio.run(main)
    sys.stdout.write(json.dumps(result) + "\n")
