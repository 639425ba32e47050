"""Probe one peer the way ``join`` reaches its bootstrap peer (``swarm-node doctor`` uses it).

The probe builds our own host (``swarm.host.build_stack``: Noise, yamux, gossipsub) with a
fresh, throwaway identity, dials the full multiaddr (so the peer must prove the peer id at its
end, as ``Dialer.bootstrap`` requires), and then reads the gossipsub subscriptions the peer
sends on connecting: every swarm-node peer, bootstrap-only ones included, subscribes to the
topics ``/swarm-node/<protocol version>/<swarm id>/<type>`` (swarm.topics). Those name its
protocol version and swarm id. Nothing is published and no announcement is read: a probe
leaves no trace in the swarm but one short connection.

``python -m swarm.probe MADDR [--timeout S]`` prints one JSON line, ``ProbeResult.to_dict``,
and exits at once (py-libp2p's teardown after a failed upgrade can hang; only the outcome
matters).
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
from dataclasses import asdict, dataclass

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service

from protocol import Identity
from swarm.config import GossipConfig
from swarm.host import Stack, build_stack, parse_peer_addr

__all__ = ["ProbeResult", "probe", "swarms_of"]

TOPIC_PREFIX = "/swarm-node/"
TEARDOWN_S = 5.0
"""Bound on closing the host after the result is known."""
SETTLE_S = 0.3
"""After the first topic of the peer arrived, how long to wait for the rest (one hello RPC
carries them all; this only covers a slow reader)."""


@dataclass(frozen=True)
class ProbeResult:
    """What one probe learned. ``swarms``: (protocol version, swarm id) of every swarm-node
    topic the peer subscribes to, sorted; empty when it is not connected or sent none."""

    connected: bool
    error: str
    swarms: tuple[tuple[int, str], ...]
    seconds: float

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


async def probe(addr: str, *, timeout_s: float,
                on_result: Callable[[ProbeResult], None] | None = None) -> ProbeResult:
    """Dial ``addr`` (a full multiaddr ending in /p2p/<peer id>) and collect the swarm-node
    topics it subscribes to, within ``timeout_s``. ``on_result`` is called with the result
    while the connection is still open (py-libp2p's teardown can hang; ``main`` exits there)."""
    start = time.monotonic()
    info = parse_peer_addr(addr)  # ConfigError for a bad address
    config = GossipConfig(data_dir=".", listen=("/ip4/127.0.0.1/tcp/0",))
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
                if on_result is not None:
                    on_result(result)
    return result


def _topics_of(stack: Stack, peer: ID) -> list[str]:
    return [t for t, peers in list(stack.pubsub.peer_topics.items()) if peer in peers]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swarm.probe", description=__doc__)
    parser.add_argument("addr", help="full multiaddr of the peer, ending in /p2p/<peer id>")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for dial + topics")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.ERROR)

    def report(result: ProbeResult) -> None:
        print(json.dumps(result.to_dict()), flush=True)
        os._exit(0)

    report(trio.run(functools.partial(probe, args.addr, timeout_s=args.timeout,
                                      on_result=report)))


if __name__ == "__main__":
    main()
