"""Probe one peer the way ``join`` reaches its bootstrap peer (``swarm-node doctor`` uses it).

The probe builds our own host (``swarm.host.build_stack``: Noise, yamux, gossipsub) with a
fresh, throwaway identity, dials the full multiaddr (so the peer must prove the peer id at its
end, as ``Dialer.bootstrap`` requires), and then reads the gossipsub subscriptions the peer
sends on connecting: every swarm-node peer, bootstrap-only ones included, subscribes to the
topics ``/swarm-node/<protocol version>/<swarm id>/<type>`` (swarm.topics). Those name its
protocol version and swarm id. Nothing is published and no announcement is read: a probe
leaves no trace in the swarm but one short connection. It also asks the peer the time
(swarm.clock): the clock offset doctor checks.

With ``listen`` (the address the node would listen on) the probe also asks the peer what the
node itself asks its bootstrap peers (swarm.reachability): to dial it back on that port. The
probe's host listens there, so the answer is the node's: ``public`` when the peer reached it;
when not, ``relayed`` if the peer serves a circuit relay (the hop protocol is negotiated and
the stream closed: no reservation is taken, a doctor run must not hold one of the relay's
slots for an hour) and ``unreachable`` if it does not; empty when the peer gave no usable
answer (it refuses dial-backs it cannot afford, at most one per identity per 10 s).

``python -m swarm.probe MADDR [--timeout S] [--listen MADDR] [--port P]`` prints one JSON
line, ``ProbeResult.to_dict``, and exits at once (py-libp2p's teardown after a failed upgrade
can hang; only the outcome matters).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.tools.anyio_service import background_trio_service

from protocol import Identity
from swarm.clock import ask_time
from swarm.config import GossipConfig
from swarm.host import Stack, build_stack, parse_peer_addr
from swarm.reachability import FAILED, REACHED, ask_dial_back

__all__ = ["ProbeResult", "probe", "swarms_of"]

TOPIC_PREFIX = "/swarm-node/"
TEARDOWN_S = 5.0
"""Bound on closing the host after the result is known."""
SETTLE_S = 0.3
"""After the first topic of the peer arrived, how long to wait for the rest (one hello RPC
carries them all; this only covers a slow reader)."""
DIAL_BACK_S = 15.0
"""Bound on the dial-back question: the peer's own dial is bounded by its
``peers.dial_timeout_s`` (10 s by default), as when a node asks (swarm.nat)."""
TIME_S = 5.0
"""Bound on the time question (one 8-byte answer)."""
REACHABILITY = ("public", "relayed", "unreachable")


@dataclass(frozen=True)
class ProbeResult:
    """What one probe learned. ``swarms``: (protocol version, swarm id) of every swarm-node
    topic the peer subscribes to, sorted; empty when it is not connected or sent none."""

    connected: bool
    error: str
    swarms: tuple[tuple[int, str], ...]
    seconds: float
    reachability: str = ""
    """One of REACHABILITY when asked (``listen``) and answered, else empty."""
    observed_ip: str = ""
    """The IP the peer saw the probe at (its dial-back answer)."""
    port: int = 0
    """The port the peer was asked to dial back."""
    reach_error: str = ""
    """Why ``reachability`` is empty when it was asked."""
    clock_offset_ms: int | None = None
    """The peer's clock minus ours (swarm.clock), when it told its time."""
    clock_rtt_ms: int = 0
    """The round trip of the time question: the offset is exact to within half of it."""
    clock_error: str = ""
    """Why ``clock_offset_ms`` is None when connected (e.g. an older peer without the time
    protocol)."""

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "swarms": [list(s) for s in self.swarms]}


def swarms_of(topics: list[str]) -> tuple[tuple[int, str], ...]:
    """(protocol version, swarm id) of the swarm-node topics among ``topics``."""
    found = set()
    for topic in topics:
        parts = topic[len(TOPIC_PREFIX):].split("/") if topic.startswith(TOPIC_PREFIX) else []
        if len(parts) == 3 and parts[0].isdigit() and parts[1]:
            found.add((int(parts[0]), parts[1]))
    return tuple(sorted(found))


async def probe(addr: str, *, timeout_s: float, listen: str | None = None, port: int = 0,
                on_result: Callable[[ProbeResult], None] | None = None) -> ProbeResult:
    """Dial ``addr`` (a full multiaddr ending in /p2p/<peer id>) and collect the swarm-node
    topics it subscribes to, within ``timeout_s``; with ``listen``, listen there and ask the
    peer to dial us back on ``port`` (0: the port we listen on). ``on_result`` is called with
    the result while the connection is still open (py-libp2p's teardown can hang; ``main``
    exits there)."""
    start = time.monotonic()
    info = parse_peer_addr(addr)  # ConfigError for a bad address
    config = GossipConfig(data_dir=".", listen=(listen or "/ip4/127.0.0.1/tcp/0",))
    stack = build_stack(Identity.generate(), config)
    result = ProbeResult(connected=False, error=f"no answer within {timeout_s:g} s", swarms=(),
                         seconds=timeout_s)
    with trio.move_on_after(timeout_s + TEARDOWN_S):
        async with stack.host.run([multiaddr.Multiaddr(config.listen[0])]):
            async with background_trio_service(stack.pubsub), \
                    background_trio_service(stack.router):
                await stack.pubsub.wait_until_ready()
                error = ""
                with trio.move_on_after(timeout_s):
                    try:
                        await stack.host.connect(info)
                    except Exception as e:  # py-libp2p raises many unrelated types for a dial
                        error = f"{type(e).__name__}: {e}"
                    else:
                        while not _topics_of(stack, info.peer_id):
                            await trio.sleep(0.05)
                        await trio.sleep(SETTLE_S)
                connected = info.peer_id in stack.host.get_connected_peers()
                if not connected and not error:
                    error = f"no answer within {timeout_s:g} s"
                result = ProbeResult(connected=connected, error=error[:300],
                                     swarms=swarms_of(_topics_of(stack, info.peer_id)),
                                     seconds=round(time.monotonic() - start, 3))
                if connected:
                    result = replace(result, **await _clock(stack, info.peer_id))
                if connected and listen is not None:
                    reach = await _reachability(stack, info.peer_id, port or _listen_port(stack))
                    result = replace(result, **reach)
                if on_result is not None:
                    on_result(result)
    return result


async def _reachability(stack: Stack, peer: ID, port: int) -> dict[str, Any]:
    """The ``reachability`` fields of a ProbeResult: ask ``peer`` to dial us back on ``port``;
    if it could not, whether it serves a circuit relay (module docstring)."""
    try:
        verdict = await ask_dial_back(stack.host, peer, port, timeout_s=DIAL_BACK_S)
    except Exception as e:  # noqa: BLE001 - an old peer without the protocol, gone, slow
        return {"port": port, "reach_error": f"the dial-back request failed: "
                                             f"{type(e).__name__}: {e}"[:300]}
    out: dict[str, Any] = {"port": port, "observed_ip": verdict.observed_ip}
    if verdict.status == REACHED:
        return {**out, "reachability": "public"}
    if verdict.status != FAILED:
        return {**out, "reach_error": "the peer refused to dial us back now (it limits "
                                      "dial-backs)"}
    try:
        with trio.fail_after(DIAL_BACK_S):
            stream = await stack.host.new_stream(peer, [HOP_PROTOCOL])
        await stream.close()
    except Exception:  # noqa: BLE001 - no hop protocol: not a relay
        return {**out, "reachability": "unreachable"}
    return {**out, "reachability": "relayed"}


async def _clock(stack: Stack, peer: ID) -> dict[str, Any]:
    """The ``clock_*`` fields of a ProbeResult."""
    try:
        told = await ask_time(stack.host, peer, timeout_s=TIME_S)
    except Exception as e:  # noqa: BLE001 - an older peer without the protocol, gone, slow
        return {"clock_error": f"{type(e).__name__}: {e}"[:300]}
    return {"clock_offset_ms": told.offset_ms, "clock_rtt_ms": told.rtt_ms}


def _listen_port(stack: Stack) -> int:
    for addr in stack.host.get_transport_addrs():
        try:
            return int(addr.value_for_protocol("tcp"))
        except Exception:  # noqa: BLE001 - no tcp part
            continue
    return 0


def _topics_of(stack: Stack, peer: ID) -> list[str]:
    return [t for t, peers in list(stack.pubsub.peer_topics.items()) if peer in peers]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swarm.probe", description=__doc__)
    parser.add_argument("addr", help="full multiaddr of the peer, ending in /p2p/<peer id>")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for dial + topics")
    parser.add_argument("--listen", default=None,
                        help="listen here and ask the peer to dial us back (reachability)")
    parser.add_argument("--port", type=int, default=0,
                        help="the port to be dialled back (default: the one we listen on)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.ERROR)

    def report(result: ProbeResult) -> None:
        print(json.dumps(result.to_dict()), flush=True)
        os._exit(0)

    report(trio.run(functools.partial(probe, args.addr, timeout_s=args.timeout,
                                      listen=args.listen, port=args.port, on_result=report)))


if __name__ == "__main__":
    main()
