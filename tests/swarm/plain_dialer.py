"""Dial a peer offering only /plaintext/2.0.0 (or Noise, with 'noise'); print the outcome.

``python -m tests.swarm.plain_dialer <full multiaddr> plaintext|noise`` prints
``{"connected": bool, "error": str}`` and exits at once (os._exit: py-libp2p's teardown after
a refused upgrade can hang, and only the outcome matters here).
"""

from __future__ import annotations

import json
import os
import sys

import multiaddr
import trio
from libp2p import new_host
from libp2p.custom_types import TProtocol
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport

from libp2p.crypto.x25519 import create_new_key_pair as x25519
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from protocol import Identity
from swarm.host import key_pair, parse_peer_addr


async def main(target: str, mode: str) -> None:
    kp = key_pair(Identity.generate())
    if mode == "noise":  # a bare host with the same security as ours (no pubsub running)
        sec = {TProtocol(NOISE_ID): NoiseTransport(kp, noise_privkey=x25519().private_key)}
    else:
        sec = {TProtocol(PLAINTEXT_PROTOCOL_ID): InsecureTransport(kp)}
    host = new_host(key_pair=kp, sec_opt=sec)
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        error = ""
        try:
            with trio.fail_after(15):
                await host.connect(parse_peer_addr(target))
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        connected = parse_peer_addr(target).peer_id in host.get_connected_peers()
        print(json.dumps({"connected": connected, "error": error[:300]}), flush=True)
        os._exit(0)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
