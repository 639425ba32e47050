"""The delay router's queueing on datagram socket pairs (no root, no devices)."""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest

from bench.wan.router import Port, Router


def ipv4(dst: str, payload: bytes = b"", src: str = "10.0.0.9", proto: int = 17) -> bytes:
    """A minimal IPv4 header (the router reads version, protocol, addresses)."""
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + payload


def syn(src: str, sport: int, dst: str, dport: int, *, ack: bool = False) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x12 if ack else 0x02, 1000, 0, 0)
    return ipv4(dst, tcp, src=src, proto=6)


@pytest.fixture
def wires():
    """Two ports: the router holds one end of each pair, the test the other."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
    for inner, _ in pairs:
        inner.setblocking(False)
    yield pairs
    for a, b in pairs:
        a.close()
        b.close()


def make(wires, *, delay_s=(0.0, 0.0), jitter_s=(0.0, 0.0)) -> Router:
    ports = [Port(tun=f"t{i}", addr=f"10.0.0.{i + 1}", delay_s=delay_s[i], jitter_s=jitter_s[i])
             for i in range(2)]
    return Router(ports, [w[0].fileno() for w in wires], seed=1)


def test_delay_is_sum_of_both_ends_and_unknown_or_non_ipv4_is_dropped(wires):
    r = make(wires, delay_s=(0.03, 0.02))
    (a_in, a_out), (b_in, b_out) = wires
    a_out.send(ipv4("10.0.0.2", b"hello"))
    a_out.send(ipv4("10.0.0.77"))
    a_out.send(b"\x60" + bytes(39))  # IPv6
    t0 = time.monotonic()
    r.receive(a_in.fileno(), t0)
    assert r.stats["dropped_no_route"] == 1 and r.stats["dropped_not_ipv4"] == 1
    wait = r.deliver_due(t0 + 0.049)
    assert wait == pytest.approx(0.001, abs=1e-6)
    b_out.setblocking(False)
    with pytest.raises(BlockingIOError):
        b_out.recv(100)
    assert r.deliver_due(t0 + 0.05) is None
    assert b_out.recv(100).endswith(b"hello") and r.stats["forwarded"] == 1


def test_jitter_varies_delay_but_never_reorders_a_flow(wires):
    r = make(wires, delay_s=(0.05, 0.05), jitter_s=(0.04, 0.0))
    (a_in, a_out), (b_in, b_out) = wires
    n = 50
    for i in range(n):
        a_out.send(ipv4("10.0.0.2", struct.pack("!I", i)))
    t0 = time.monotonic()
    r.receive(a_in.fileno(), t0)
    times = sorted(t for t, *_ in r._heap)
    assert times[0] >= t0 + 0.06 - 1e-9 and times[-1] <= t0 + 0.14 + 1e-9
    assert len({round(t, 6) for t in times}) > 1  # jitter changed something
    r.deliver_due(t0 + 1.0)
    got = [struct.unpack("!I", b_out.recv(100)[-4:])[0] for _ in range(n)]
    assert got == list(range(n))


def test_write_error_counts_a_loss_and_the_router_goes_on(wires):
    r = make(wires)
    (a_in, a_out), (b_in, b_out) = wires
    b_out.close()  # the far end is gone: writing to its wire fails
    a_out.send(ipv4("10.0.0.2"))
    r.receive(a_in.fileno(), time.monotonic())
    assert r.deliver_due(time.monotonic() + 1) is None
    assert r.stats["write_errors"] == 1 and r.stats["forwarded"] == 0
    os.write(a_out.fileno(), ipv4("10.0.0.1"))  # a packet back to its own port still flows
    r.receive(a_in.fileno(), time.monotonic())
    r.deliver_due(time.monotonic() + 1)
    assert r.stats["forwarded"] == 1


def test_crossing_syns_are_counted_as_simultaneous_open(wires):
    r = make(wires)
    (a_in, a_out), (b_in, b_out) = wires
    a_out.send(syn("10.0.0.1", 4001, "10.0.0.2", 4002))
    a_out.send(syn("10.0.0.1", 5555, "10.0.0.2", 4002))  # an ordinary dial
    r.receive(a_in.fileno(), time.monotonic())
    b_out.send(syn("10.0.0.2", 4002, "10.0.0.1", 5555, ack=True))  # its SYN-ACK: normal
    b_out.send(syn("10.0.0.2", 4002, "10.0.0.1", 4001))  # b dials a from the same ports
    r.receive(b_in.fileno(), time.monotonic())
    assert r.stats["tcp_simultaneous_open"] == 1 and r.stats["forwarded"] == 0
