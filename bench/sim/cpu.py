"""Where a node's CPU work waits: its own core (WAN), or a few cores shared by all (testbed).

A swarm process is one trio loop, so its work is serial and first-come first-served. On a WAN
each node has a core of its own: a job starts when the node's previous job ends. On the
testbed every process shares ``cores`` cores: a node with work queues for a core, runs one job,
and queues again (the OS scheduler at the granularity of one message); other load on the box
(``background_load`` cores' worth) makes every job that much slower.

Both put a job's end on the engine's event queue (``schedule``); the engine calls ``finished``
then runs the job's ``action``. ``OwnCore`` schedules only jobs that have an action (a duplicate
dropped after parsing only takes time); ``SharedCores`` schedules every job, to free its core.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

__all__ = ["OwnCore", "SharedCores"]

Schedule = Callable[[float, int, Any], None]
"""``schedule(t_done, node, action)``: put the end of a job on the event queue."""


class OwnCore:
    """One core per node, jobs ``slowdown`` times longer than alone (other work on it)."""

    def __init__(self, schedule: Schedule, *, slowdown: float = 1.0) -> None:
        self.schedule = schedule
        self.slowdown = slowdown
        self.busy_until: list[float] = []
        self.cpu_ms: list[float] = []

    def add_node(self) -> None:
        self.busy_until.append(0.0)
        self.cpu_ms.append(0.0)

    def submit(self, t: float, node: int, cost_ms: float, action: Any = None) -> None:
        start = max(t, self.busy_until[node])
        end = self.busy_until[node] = start + cost_ms * self.slowdown
        self.cpu_ms[node] += cost_ms
        if action is not None:
            self.schedule(end, node, action)

    def account_later(self, t: float, node: int, cost_ms: float) -> None:
        """A job without an action that will arrive at ``t`` (after jobs not yet submitted):
        if the node is still busy then, it joins the end of the queue; if not, it runs in idle
        time and delays nobody (a sub-millisecond error either way, where it matters)."""
        self.cpu_ms[node] += cost_ms
        if self.busy_until[node] > t:
            self.busy_until[node] += cost_ms * self.slowdown

    def finished(self, t: float, node: int) -> None:
        """Nothing to free: the node's own core is tracked by ``busy_until``."""


class SharedCores:
    """``cores`` cores shared by every node, jobs ``slowdown`` times longer than alone."""

    def __init__(self, schedule: Schedule, *, cores: int, slowdown: float) -> None:
        self.schedule = schedule
        self.free = cores
        self.slowdown = slowdown
        self.cpu_ms: list[float] = []
        self.jobs: list[collections.deque[tuple[float, Any]]] = []
        self.running: list[bool] = []
        self.ready: collections.deque[int] = collections.deque()

    def add_node(self) -> None:
        self.cpu_ms.append(0.0)
        self.jobs.append(collections.deque())
        self.running.append(False)

    def submit(self, t: float, node: int, cost_ms: float, action: Any = None) -> None:
        self.cpu_ms[node] += cost_ms
        self.jobs[node].append((cost_ms * self.slowdown, action))
        if not self.running[node] and len(self.jobs[node]) == 1:
            self.ready.append(node)
        self._dispatch(t)

    def finished(self, t: float, node: int) -> None:
        """A job of ``node`` ended at ``t`` (called by the engine for every job end)."""
        self.free += 1
        self.running[node] = False
        if self.jobs[node]:
            self.ready.append(node)
        self._dispatch(t)

    def _dispatch(self, t: float) -> None:
        while self.free and self.ready:
            node = self.ready.popleft()
            cost, action = self.jobs[node].popleft()
            self.free -= 1
            self.running[node] = True
            self.schedule(t + cost, node, action)
