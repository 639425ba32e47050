"""Transport.connect dials a circuit address's target, not its relay (issue 33 item 4).

A unit test of address handling: p2pd's client is replaced by a recorder of what it was asked
to dial (a real p2pd cannot reach circuit peers here: py relays carry the swarm's connection,
and p2pd runs without a relay; shared/notes/holepunch.md §2.4)."""

from __future__ import annotations

import asyncio

from multiaddr import Multiaddr

from collectives.transport import Transport
from protocol import Identity

RELAY = Identity.generate().peer_id
TARGET = Identity.generate().peer_id
OURS = Identity.generate().peer_id
CIRCUIT = f"/ip4/10.213.0.2/tcp/4002/p2p/{RELAY}/p2p-circuit/p2p/{TARGET}"
DIRECT = f"/ip4/10.213.0.3/tcp/4002/p2p/{TARGET}"


class _RecordingClient:
    def __init__(self) -> None:
        self.dialled: list[tuple[str, list[str]]] = []

    async def connect(self, peer_id, addrs) -> None:  # noqa: ANN001 - hivemind's signature
        self.dialled.append((peer_id.to_base58(), [str(a) for a in addrs]))


class _P2P:
    def __init__(self) -> None:
        self._client = _RecordingClient()


def _transport() -> Transport:
    t = Transport.__new__(Transport)  # no p2pd, no DHT: only connect()'s address handling
    t.peer_id = OURS
    t.p2p = _P2P()  # type: ignore[assignment]
    return t


def test_circuit_address_dials_the_target_through_the_relay():
    t = _transport()
    asyncio.run(t.connect([CIRCUIT]))
    assert t.p2p._client.dialled == [(TARGET, [f"/ip4/10.213.0.2/tcp/4002/p2p/{RELAY}/p2p-circuit"])]


def test_circuit_and_direct_addresses_of_one_peer_are_one_dial():
    t = _transport()
    asyncio.run(t.connect([DIRECT, CIRCUIT, f"/ip4/10.213.0.9/tcp/1/p2p/{OURS}"]))
    assert t.p2p._client.dialled == [(TARGET, ["/ip4/10.213.0.3/tcp/4002",
                                               f"/ip4/10.213.0.2/tcp/4002/p2p/{RELAY}/p2p-circuit"])]


def test_dial_target_of_plain_and_malformed_addresses():
    from collectives.transport import _dial_target

    assert _dial_target(Multiaddr(DIRECT)) == (TARGET, Multiaddr("/ip4/10.213.0.3/tcp/4002"))
    try:
        _dial_target(Multiaddr("/ip4/10.213.0.3/tcp/4002"))
    except ValueError as e:
        assert "names no /p2p/ peer" in str(e)
    else:
        raise AssertionError("an address without /p2p/ was accepted")
