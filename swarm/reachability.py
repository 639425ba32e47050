"""Reachability: can other peers dial this node? Learned by asking peers to dial us back.

Why our own protocol and not py-libp2p 0.8.1's AutoNAT (``libp2p.host.autonat``): its server
"dials back" with ``host.connect``, which returns at once when a connection to the peer
already exists, and one always does (the request came over it). Every requester is told
``OK``: a node behind NAT would believe it is public (tests/wan/test_nat.py shows the bug).

Dial-back protocol ``/swarm-node/dialback/1.0.0`` (one request per stream):

    request   2 bytes  the TCP port the requester listens on (big endian)
    response  1 byte   status: 0 reached, 1 dial failed, 2 refused (rate, relayed, busy)
              1 byte   n, then n ASCII bytes: the requester's IP as the server sees it

The server dials **only the IP it observes the request from** (never an address the requester
names: no amplification), on a fresh TCP connection that is not registered with the host, and
completes a Noise handshake that must prove the requester's peer id; then it closes. The
request is authenticated by the Noise connection it arrives on. Costs are budgeted: one
request per peer id per ``min_interval_s``, a global token bucket (fresh ids are free), at
most ``max_concurrent`` dials at once, each under ``dial_timeout_s``; requests over relayed
connections are refused (the observed address is the relay's).

Verdict (``decide``): answers from bootstrap peers decide (the operator chose them); other
peers are asked only when no bootstrap peer gave a usable answer, and then all their answers
must agree (a lying peer can only leave us undecided; fresh identities buy nothing). The state
is ``public`` when dialled back; otherwise ``relayed`` while a relay reservation is held
(swarm.relay), else ``unreachable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from swarm.ratelimit import PeerGate

__all__ = ["DIALBACK_PROTOCOL", "REACHED", "FAILED", "REFUSED", "STATES", "DialBackServer",
           "Reachability", "Verdict", "ask_dial_back", "decide"]

logger = logging.getLogger(__name__)

DIALBACK_PROTOCOL = TProtocol("/swarm-node/dialback/1.0.0")
REACHED, FAILED, REFUSED = 0, 1, 2
STATES = ("unknown", "public", "relayed", "unreachable")
"""What ``stats()`` and the node report say (``reachability``)."""
MAX_IP_LEN = 45


@dataclass(frozen=True)
class Verdict:
    """One server's answer: ``status`` (REACHED/FAILED/REFUSED) and the IP it saw us at."""

    server: str
    status: int
    observed_ip: str


class DialBackServer:
    """Serves dial-back requests with budgets (see module docstring)."""

    def __init__(self, host: IHost, *, dial_timeout_s: float, min_interval_s: float = 10.0,
                 rate_per_s: float = 1.0, burst: int = 8, max_concurrent: int = 2) -> None:
        self.host = host
        self.dial_timeout_s = dial_timeout_s
        self._gate = PeerGate(min_interval_s=min_interval_s, rate_per_s=rate_per_s, burst=burst)
        self._limiter = trio.CapacityLimiter(max_concurrent)
        self.served = 0
        self.refused = 0

    def install(self) -> None:
        self.host.set_stream_handler(DIALBACK_PROTOCOL, self.handle)

    async def handle(self, stream: INetStream) -> None:
        try:
            with trio.fail_after(self.dial_timeout_s + 5):
                request = await _read_exact(stream, 2)
                peer = stream.muxed_conn.peer_id
                remote = _remote_ip(stream)
                status = REFUSED
                if remote is not None and self._gate.admit(str(peer), time.monotonic()):
                    try:
                        self._limiter.acquire_nowait()
                    except trio.WouldBlock:
                        pass
                    else:
                        try:
                            port = int.from_bytes(request, "big")
                            ok = port > 0 and await self._dial(peer, remote, port)
                            status = REACHED if ok else FAILED
                            self.served += 1
                        finally:
                            self._limiter.release()
                if status == REFUSED:
                    self.refused += 1
                ip = (remote or "").encode("ascii", "replace")[:MAX_IP_LEN]
                await stream.write(bytes([status, len(ip)]) + ip)
                # the client closes first: a reply followed by our close can be lost
                await _read_exact(stream, 1, allow_eof=True)
        except Exception as e:  # noqa: BLE001 - a hostile or broken requester
            logger.debug("dial-back request failed: %s: %s", type(e).__name__, e)
        finally:
            await _close(stream)

    async def _dial(self, peer: ID, ip: str, port: int) -> bool:
        """A fresh TCP connection to ip:port whose Noise handshake proves ``peer``."""
        proto = "ip6" if ":" in ip else "ip4"
        addr = multiaddr.Multiaddr(f"/{proto}/{ip}/tcp/{port}")
        network = self.host.get_network()
        transport = network.transport_manager.transport_for_dialing(addr)  # type: ignore[attr-defined]
        if transport is None:
            return False
        raw = None
        try:
            with trio.fail_after(self.dial_timeout_s):
                raw = await transport.dial(addr)
                secured = await network.upgrader.upgrade_security(raw, True, peer)  # type: ignore[attr-defined]
                await secured.close()
                return True
        except Exception as e:  # noqa: BLE001 - any failure means "not reachable there"
            logger.debug("dial-back to %s at %s failed: %s: %s", peer, addr, type(e).__name__, e)
            if raw is not None:
                await _close(raw)
            return False


async def ask_dial_back(host: IHost, server: ID, port: int, *, timeout_s: float) -> Verdict:
    """Ask ``server`` to dial us back on ``port``; raises on transport errors."""
    with trio.fail_after(timeout_s):
        stream = await host.new_stream(server, [DIALBACK_PROTOCOL])
        try:
            await stream.write(port.to_bytes(2, "big"))
            head = await _read_exact(stream, 2)
            if head[0] not in (REACHED, FAILED, REFUSED) or head[1] > MAX_IP_LEN:
                raise ValueError(f"bad dial-back answer {head!r}")
            ip = (await _read_exact(stream, head[1])).decode("ascii", "replace") if head[1] else ""
        finally:
            await _close(stream)
    return Verdict(server=str(server), status=head[0], observed_ip=ip)


def decide(bootstrap: Sequence[Verdict], others: Sequence[Verdict]) -> bool | None:
    """True: dialled back; False: not; None: nobody gave a usable answer.

    Bootstrap peers' answers decide (the operator chose them): reached by any of them wins.
    Without one, other peers decide only when all their usable answers agree (a lying peer
    can then only make us undecided, and fresh identities buy nothing)."""
    usable = [v for v in bootstrap if v.status != REFUSED]
    if usable:
        return any(v.status == REACHED for v in usable)
    answers = {v.status == REACHED for v in others if v.status != REFUSED}
    return answers.pop() if len(answers) == 1 else None


@dataclass
class Reachability:
    """The node's current view: ``state`` in STATES, the IP peers see, and why."""

    state: str = "unknown"
    observed_ip: str = ""
    reason: str = "not checked yet"
    checked_at: float = 0.0
    """Unix time of the last decided check."""

    def stats(self) -> dict[str, int]:
        return {f"reachability_{s}": int(s == self.state) for s in STATES}


def _remote_ip(stream: INetStream) -> str | None:
    """The requester's IP, or None over a relayed or unknown connection."""
    conn = stream.muxed_conn
    try:
        addrs = conn.get_transport_addresses()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return None
    if not addrs or any("p2p-circuit" in str(a) for a in addrs):
        return None
    try:
        remote = stream.get_remote_address()
    except Exception:  # noqa: BLE001
        return None
    return remote[0] if remote else None


async def _read_exact(stream: INetStream, n: int, *, allow_eof: bool = False) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = await stream.read(n - len(buf))
        if not chunk:
            if allow_eof:
                return buf
            raise EOFError(f"stream closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


async def _close(closable: object) -> None:
    try:
        await closable.close()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
