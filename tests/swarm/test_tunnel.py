"""Collective tunnels (swarm.tunnel) between two swarm processes on loopback."""

from __future__ import annotations

import socket
import threading

import pytest

from node.ipc_client import SocketBridge
from tests.swarm.conftest import Procs
from tests.swarm.procs import wait_until

pytestmark = pytest.mark.slow


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _roundtrip(host: str, port: int, payload: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=30) as c:
        threading.Thread(target=c.sendall, args=(payload,), daemon=True).start()
        got = b""
        while len(got) < len(payload):
            try:
                chunk = c.recv(65536)
            except ConnectionResetError:  # a refused tunnel may reset instead of closing
                break
            if not chunk:
                break
            got += chunk
        return got


def test_tunnel_reaches_the_peers_announced_collective_port(procs: Procs) -> None:
    boot = procs.node("boot", learner=False, bootstrap_only=True)
    a, b = procs.nodes(["a", "b"], bootstrap=(boot.addr,))
    srv, port = _echo_server()
    try:
        with SocketBridge.connect(a.ready["ipc"]) as ba, SocketBridge.connect(b.ready["ipc"]) as bb:
            wait_until(lambda: ba.stats()["peers"] == 2, timeout_s=30, what="a connected to b")
            # the status's links (issue 33): on loopback every connection is direct
            assert ba.links() == {boot.peer_id: "direct", b.peer_id: "direct"}, ba.links()
            # before b's learner announced a collective address, a tunnel to it carries nothing
            host, p = ba.tunnel(b.peer_id)
            assert _roundtrip(host, p, b"x" * 10) == b""
            bb.announce(model="m", collective_addrs=(f"/ip4/127.0.0.1/tcp/{port}/p2p/{b.peer_id}",))
            payload = bytes(range(256)) * 4096  # 1 MiB both ways through the libp2p stream
            assert ba.tunnel(b.peer_id) == (host, p)  # one listener per peer
            got = _roundtrip(host, p, payload)
            assert got == payload, (len(got), a.log()[-2000:], b.log()[-2000:])
            stats = bb.stats()
            assert stats["tunnels_opened"] >= 1 and stats["tunnels_refused"] >= 1, stats
            with pytest.raises(Exception, match="not a peer id"):
                ba.tunnel("not-a-peer-id")
    finally:
        srv.close()
