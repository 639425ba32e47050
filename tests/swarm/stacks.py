"""Hosts for the in-process child checks (dialback_check, time_check): our own stack
(swarm.host.build_stack) on loopback, pubsub and router running until the exit stack closes."""

from __future__ import annotations

from contextlib import AsyncExitStack

import multiaddr
from libp2p.tools.anyio_service import background_trio_service

from protocol import Identity
from swarm.config import GossipConfig
from swarm.host import Stack, build_stack


async def open_stacks(ex: AsyncExitStack, n: int, *, ip: str = "127.0.0.1") -> list[Stack]:
    """``n`` stacks listening on ``ip`` (any 127/8 address is loopback on Linux)."""
    cfg = GossipConfig(data_dir="/nonexistent")
    stacks = [build_stack(Identity.generate(), cfg) for _ in range(n)]
    for s in stacks:
        await ex.enter_async_context(s.host.run([multiaddr.Multiaddr(f"/ip4/{ip}/tcp/0")]))
        await ex.enter_async_context(background_trio_service(s.pubsub))
        await ex.enter_async_context(background_trio_service(s.router))
    return stacks
