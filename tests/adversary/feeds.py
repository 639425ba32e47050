"""A farm of fresh identities against the feeds (issue 32): hosts built like ours that
announce themselves as honest peers do and serve the feeds they are asked for, badly.

Each identity runs its own host (``swarm.host.build_stack``), connects to the victims,
publishes a signed ``PeerAnnouncement`` every few seconds (its listen address, the victims'
model fingerprint, ``train``) and answers every feed request ``OK``, then:

- ``idle``: sends nothing (a slot held for nothing);
- ``wrong``: one valid, signed batch a second of all-wrong groups (every completion scores
  0: no signal after re-scoring);
- ``trickle``: the same, one batch every ``trickle_s`` seconds;
- ``mixed``: identity i serves as ``idle``, ``wrong`` and ``trickle`` in turn (i mod 3).

Both send their first batch as soon as the feed opens (a feed that brings nothing at first is
closed early: swarm.feed_standing's probe).

``model``: the fingerprint to announce, from the start (the swarm's model is public; else the
farm waits until it hears it from the victims' announcements, and the honest nodes have the
swarm to themselves until then). ``arrive_after_s``: the farm announces itself and serves that
long after (a farm arriving in a running swarm). ``mint_every_s`` > 0: one more fresh identity
joins the farm that often (a farm that keeps minting never-seen keys). Each identity owns its
host in a task of its own: a failure of one host (py-libp2p raises from a background dial to a
victim that has finished) ends that identity, counted as ``identity_failed``, not the farm and
its report. Runs until ``duration_s`` or SIGTERM; reports how many feeds each mode served and
how many identities it used.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import sys
import time
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import multiaddr
import trio
from libp2p.abc import INetStream
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from protocol import Identity, PeerAnnouncement, seal
from swarm.feeds import FEED_PROTOCOL, MAX_REQUEST, OK
from swarm.host import Stack
from swarm.topics import topic_for
from tests.adversary.gossip import (
    TINY_ADD_CONFIG,
    Observer,
    _line,
    _open,
    _reach,
    _until_signal,
)
from tests.adversary.payloads import steering_batch

__all__ = ["run_feed_sybils"]

MODES = ("idle", "wrong", "trickle")
ANNOUNCE_S = 4.0
"""Between two announcements of one identity (honest peers: ``announcements.interval_s`` 5 s)."""


class Farm:
    """The identities, their hosts and what they served."""

    def __init__(self, args: dict[str, Any], observer: Observer) -> None:
        self.args, self.observer = args, observer
        self.mode = str(args.get("mode", "idle"))
        if self.mode not in (*MODES, "mixed"):
            raise ValueError(f"mode must be idle, wrong, trickle or mixed, not {self.mode!r}")
        self.served: collections.Counter[str] = collections.Counter()
        self.peer_ids: list[str] = []
        self.rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        self.round = 0
        self.model = "unknown"
        self.serving = trio.Event()
        """Set once the victims' model is known (or given up on): identities serve from then."""
        self.announce = topic_for(args["swarm_id"], "announce")

    async def member(self, me: Identity, index: int, *, observe: bool = False,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """One identity until cancelled: its host, connected to the victims (``started``
        then, or when that failed), then serving feeds and announcing itself. ``observe``:
        its host also learns the victims' model from their announcements."""
        started = False
        try:
            async with AsyncExitStack() as exit_stack:
                stack = await _open(exit_stack, me, self.args, index)
                async with trio.open_nursery() as nursery:
                    if observe:
                        stack.pubsub.set_topic_validator(self.announce, self.observer.see, False)
                        nursery.start_soon(self.observer.drain,
                                           await stack.pubsub.subscribe(self.announce))
                    try:
                        await _reach(stack, list(self.args["victims"]), self.announce)
                    except Exception:  # noqa: BLE001 - e.g. a victim that finished: serve on
                        self.served["unreached"] += 1
                    task_status.started()
                    started = True
                    await self.serving.wait()
                    self.peer_ids.append(me.peer_id)
                    mode = MODES[index % len(MODES)] if self.mode == "mixed" else self.mode
                    stack.host.set_stream_handler(FEED_PROTOCOL,
                                                  lambda s: self._serve(s, me, mode))
                    await self._announce(stack, me)
        except* Exception as group:  # its host failed: this identity ends, the farm goes on
            self.served["identity_failed"] += 1
            sys.stderr.write(f"identity {me.peer_id} ended: {group.exceptions[0]!r}\n")
        finally:
            if not started:
                task_status.started()

    async def _announce(self, stack: Stack, me: Identity) -> None:
        addrs = tuple(f"{a}/p2p/{me.peer_id}" for a in stack.host.get_addrs()
                      if "/p2p/" not in str(a)) or tuple(str(a) for a in stack.host.get_addrs())
        while True:
            ann = PeerAnnouncement(peer_id=me.peer_id, addrs=addrs[:4], model=self.model,
                                   capabilities=("train",), interval_s=ANNOUNCE_S)
            await stack.pubsub.publish(self.announce,
                                       seal(me, ann, swarm_id=self.args["swarm_id"]))
            self.served["announcements"] += 1
            await trio.sleep(ANNOUNCE_S)

    async def _serve(self, stream: INetStream, me: Identity, mode: str) -> None:
        try:
            with trio.fail_after(10):
                await read_varint_prefixed_bytes_limited(stream, MAX_REQUEST)
                await stream.write(encode_varint_prefixed(OK))
            self.served["feeds"] += 1
            if mode == "idle":
                await trio.sleep_forever()
            period = 1.0 if mode == "wrong" else float(self.args.get("trickle_s", 15.0))
            while True:  # the first batch at once: it passes a probe for a first frame
                self.round += 1
                batch = await trio.to_thread.run_sync(lambda: steering_batch(
                    model=self.model, round_=self.round, seed=self.rng.randrange(2**31),
                    group_sizes=(8, 8), task_config=TINY_ADD_CONFIG, answer="?"))
                await stream.write(encode_varint_prefixed(
                    seal(me, batch, swarm_id=self.args["swarm_id"])))
                self.served["batches"] += 1
                await trio.sleep(period)
        except Exception:  # noqa: BLE001 - the victim closed the feed: count it, serve on
            self.served["feeds_closed"] += 1
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await stream.close()
                except Exception:  # noqa: BLE001 - already gone
                    pass


async def run_feed_sybils(args: dict[str, Any]) -> dict[str, Any]:
    """Run the farm (see the module docstring); what it served."""
    if args.get("listen_ip"):
        # a farm on a machine of its own: its dials come from its address too (on loopback
        # the kernel would pick 127.0.0.1 for every source), so a victim sees one network
        trio.open_tcp_stream = partial(trio.open_tcp_stream,  # type: ignore[assignment]
                                       local_address=str(args["listen_ip"]))
    ids = [Identity.generate() for _ in range(int(args["identities"]))]
    observer = Observer(own={ids[0].peer_id}, swarm_id=args["swarm_id"],
                        watched=frozenset(), own_ids=frozenset())
    farm = Farm(args, observer)
    _line("loaded")
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as starting:  # every identity connected (or failed)
            for i, me in enumerate(ids):
                starting.start_soon(nursery.start, partial(farm.member, me, i, observe=i == 0))
        if args.get("model"):  # the swarm's model is public: announce it from the start
            farm.model = str(args["model"])
        else:
            with trio.move_on_after(120):
                await observer.model_known.wait()
            farm.model = observer.model or "unknown"
        # a farm that arrives in a running swarm: the honest nodes found each other first
        await trio.sleep(float(args.get("arrive_after_s", 0.0)))
        farm.serving.set()
        await trio.sleep(0)  # the identities register before the ready line lists them
        _line("ready", model=farm.model, peer_ids=list(farm.peer_ids), at=time.time())
        with trio.move_on_after(float(args["duration_s"])) as scope:
            nursery.start_soon(_until_signal, scope)
            mint = float(args.get("mint_every_s", 0.0))
            for index in itertools.count(len(ids)):
                if mint <= 0:
                    await trio.sleep_forever()
                await trio.sleep(mint)
                nursery.start_soon(farm.member, Identity.generate(), index)
        nursery.cancel_scope.cancel()
    return {"peer_ids": farm.peer_ids, "identities": len(farm.peer_ids),
            "sent": dict(farm.served)}
