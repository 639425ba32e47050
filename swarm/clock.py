"""Clock offset against a peer: ``swarm-node doctor`` asks its bootstrap peer the time.

Every signed message carries its creation time, and a receiver rejects one created more than
``limits.max_future_s`` ahead of its own clock (``future``) or older than
``limits.replay_window_s`` (``stale``): a node whose clock is off by that much publishes into
the void and is told nothing. Doctor measures the offset before that happens.

Time protocol ``/swarm-node/time/1.0.0`` (one request per stream, served by every swarm
process, bootstrap-only ones included):

    request   nothing (the client opens the stream and waits)
    response  8 bytes  the server's wall clock, unix milliseconds (big endian, signed)

The client takes the offset against the midpoint of its own send and receive times (NTP's
estimate; its error is at most half the round trip, which is reported with it). The answer
is the server's word and is used only for advice: nothing in the swarm trusts a peer's
clock. Costs are budgeted like the dial-back: one answer per peer id per ``min_interval_s``
and a global token bucket (fresh ids are free); beyond, the stream is reset unanswered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from swarm.ratelimit import PeerGate

__all__ = ["TIME_PROTOCOL", "Offset", "TimeServer", "ask_time"]

logger = logging.getLogger(__name__)

TIME_PROTOCOL = TProtocol("/swarm-node/time/1.0.0")
ANSWER_BYTES = 8


@dataclass(frozen=True)
class Offset:
    """The peer's clock minus ours (ms; positive: the peer is ahead), and the round trip
    of the question (ms): the offset is exact to within half of it."""

    offset_ms: int
    rtt_ms: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TimeServer:
    """Answers time requests with budgets (see module docstring); ``now_ms`` is the clock
    told (tests give a skewed one)."""

    def __init__(self, host: IHost, *, min_interval_s: float = 1.0, rate_per_s: float = 5.0,
                 burst: int = 20, now_ms: Callable[[], int] = _now_ms) -> None:
        self.host = host
        self.now_ms = now_ms
        self._gate = PeerGate(min_interval_s=min_interval_s, rate_per_s=rate_per_s, burst=burst)
        self.served = 0
        self.refused = 0

    def install(self) -> None:
        self.host.set_stream_handler(TIME_PROTOCOL, self.handle)

    async def handle(self, stream: INetStream) -> None:
        try:
            if not self._gate.admit(str(stream.muxed_conn.peer_id), time.monotonic()):
                self.refused += 1
                await stream.reset()
                return
            with trio.fail_after(5.0):
                await stream.write(self.now_ms().to_bytes(ANSWER_BYTES, "big", signed=True))
            self.served += 1
        except Exception as e:  # noqa: BLE001 - a broken or vanished requester
            logger.debug("time request failed: %s: %s", type(e).__name__, e)
        finally:
            try:
                await stream.close()
            except Exception:  # noqa: BLE001 - already reset
                pass


async def ask_time(host: IHost, peer: ID, *, timeout_s: float,
                   now_ms: Callable[[], int] = _now_ms) -> Offset:
    """``peer``'s clock offset from ours; raises on transport errors, a refusal (reset) or a
    short answer."""
    with trio.fail_after(timeout_s):
        sent = now_ms()  # the peer answers as the stream opens: opening is in the round trip
        stream = await host.new_stream(peer, [TIME_PROTOCOL])
        try:
            answer = b""
            while len(answer) < ANSWER_BYTES:
                chunk = await stream.read(ANSWER_BYTES - len(answer))
                if not chunk:
                    raise EOFError(f"time answer of {len(answer)} bytes")
                answer += chunk
            received = now_ms()
        finally:
            try:
                await stream.close()
            except Exception:  # noqa: BLE001
                pass
    told = int.from_bytes(answer, "big", signed=True)
    return Offset(offset_ms=told - (sent + received) // 2, rtt_ms=received - sent)
