"""User-space delay router: the "internet" between the hosts of a WAN bed.

One process owns one TUN device per public attachment (a host, or the gateway of a NATed
host). Each device is moved into its namespace, where it is that namespace's only link to
the others. The router reads IPv4 packets from every device, looks up the device that owns
the destination address, and writes the packet there once its delay has passed:

    delay(src -> dst) = delay_ms[src] + delay_ms[dst] + jitter, jitter ~ U(-j, +j) with
    j = jitter_ms[src] + jitter_ms[dst], never below 0 in total,

so the RTT between two hosts is ``2 * (delay_src + delay_dst)``. Packets wait in one
time-ordered heap; a packet never overtakes an earlier one of the same (src, dst) pair
(jitter varies the spacing, it does not reorder a TCP stream). Unknown destinations and
non-IPv4 packets are dropped. Rate limits are not done here: ``tbf`` on each host's egress.

Run by :class:`bench.wan.bed.WanBed` inside the bed's core namespace::

    python -m bench.wan.router CONFIG_JSON

CONFIG_JSON: ``{"ports": [{"tun": NAME, "addr": "10.213.0.1", "delay_ms": 20.0,
"jitter_ms": 0.0}], "seed": 0, "owner_pid": PID|null, "stats": PATH|null}``.
It creates the devices, prints ``ready`` on stdout, and forwards until SIGTERM/SIGINT or
until ``owner_pid`` is gone (then the kernel removes the devices with the process).
"""

from __future__ import annotations

import fcntl
import heapq
import json
import logging
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
READ_BATCH = 64  # packets read from one device per wake-up before serving the others


@dataclass(frozen=True, kw_only=True)
class Port:
    """One attachment to the router."""

    tun: str
    """Interface name of the TUN device (<= 15 characters)."""
    addr: str
    """IPv4 address behind this device: packets to it are written here."""
    delay_s: float
    """One-way delay added to every packet leaving and every packet entering this port."""
    jitter_s: float
    """Half-width of the uniform jitter this port adds to each packet's delay."""


def open_tun(name: str) -> int:
    """Create TUN device ``name`` (no packet-info header) and return its non-blocking fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Router:
    """Forwards packets between TUN fds with per-port delay and jitter."""

    def __init__(self, ports: list[Port], fds: list[int], *, seed: int = 0) -> None:
        self._ports = {fd: p for fd, p in zip(fds, ports)}
        self._route = {socket.inet_aton(p.addr): fd for fd, p in self._ports.items()}
        self._rng = random.Random(seed)
        self._heap: list[tuple[float, int, int, bytes]] = []
        self._last: dict[tuple[int, int], float] = {}
        self._seq = 0
        self._syns: dict[bytes, float] = {}
        self.stats = {"forwarded": 0, "bytes": 0, "dropped_no_route": 0, "dropped_not_ipv4": 0,
                      "write_errors": 0, "max_queue": 0, "tcp_simultaneous_open": 0}

    def _delay(self, src: Port, dst: Port) -> float:
        d = src.delay_s + dst.delay_s
        j = src.jitter_s + dst.jitter_s
        if j > 0:
            d += self._rng.uniform(-j, j)
        return max(0.0, d)

    def receive(self, fd: int, now: float) -> None:
        """Read up to READ_BATCH packets from ``fd`` and queue them for their destination."""
        src = self._ports[fd]
        for _ in range(READ_BATCH):
            try:
                pkt = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if len(pkt) < 20 or pkt[0] >> 4 != 4:
                self.stats["dropped_not_ipv4"] += 1
                continue
            out = self._route.get(pkt[16:20])
            if out is None:
                self.stats["dropped_no_route"] += 1
                continue
            if pkt[9] == 6:  # TCP
                self._watch_syn(pkt, now)
            key = (fd, out)
            t = max(now + self._delay(src, self._ports[out]), self._last.get(key, 0.0))
            self._last[key] = t
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, out, pkt))
        if len(self._heap) > self.stats["max_queue"]:
            self.stats["max_queue"] = len(self._heap)

    def _watch_syn(self, pkt: bytes, now: float) -> None:
        """Count SYNs that cross a SYN of the reverse 4-tuple (TCP simultaneous open).

        Two peers dialling each other from their listening ports (SO_REUSEPORT) at the same
        moment make one TCP connection with two initiators; libp2p's security handshake
        then fails. Visible only with latency: on loopback the window is microseconds.
        """
        ihl = (pkt[0] & 0x0F) * 4
        if len(pkt) < ihl + 14 or pkt[ihl + 13] & 0x12 != 0x02:  # SYN without ACK only
            return
        src, dst = pkt[12:16] + pkt[ihl:ihl + 2], pkt[16:20] + pkt[ihl + 2:ihl + 4]
        if self._syns.get(dst + src, -1e9) > now - 3.0:
            self.stats["tcp_simultaneous_open"] += 1
        if len(self._syns) > 4096:
            self._syns = {k: t for k, t in self._syns.items() if t > now - 3.0}
        self._syns[src + dst] = now

    def deliver_due(self, now: float) -> float | None:
        """Write every packet whose time has come; return seconds until the next one."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, out, pkt = heapq.heappop(heap)
            try:
                os.write(out, pkt)
            except OSError:  # device down or its queue full: the packet is lost, as on a wire
                self.stats["write_errors"] += 1
                continue
            self.stats["forwarded"] += 1
            self.stats["bytes"] += len(pkt)
        return heap[0][0] - now if heap else None

    def serve(self, *, owner_pid: int | None, stats_path: Path | None) -> None:
        ep = select.epoll()
        for fd in self._ports:
            ep.register(fd, select.EPOLLIN)
        next_check = time.monotonic() + 1.0
        while True:
            wait = self.deliver_due(time.monotonic())
            timeout = 1.0 if wait is None else min(1.0, wait)
            for fd, _ in ep.poll(max(0.0, timeout)):
                self.receive(fd, time.monotonic())
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1.0
                if owner_pid is not None and not pid_alive(owner_pid):
                    log.info("owner %d is gone; router exits", owner_pid)
                    return
                if stats_path is not None:
                    write_stats(stats_path, self.stats)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_stats(path: Path, stats: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="wan-router %(message)s")
    cfg = json.loads(argv[0])
    ports = [Port(tun=p["tun"], addr=p["addr"], delay_s=float(p["delay_ms"]) / 1000,
                  jitter_s=float(p["jitter_ms"]) / 1000) for p in cfg["ports"]]
    fds = [open_tun(p.tun) for p in ports]
    router = Router(ports, fds, seed=int(cfg.get("seed", 0)))

    def stop(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    stats = Path(cfg["stats"]) if cfg.get("stats") else None
    try:
        router.serve(owner_pid=cfg.get("owner_pid"), stats_path=stats)
    finally:
        if stats is not None:
            write_stats(stats, router.stats)
        log.info("stats %s", json.dumps(router.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
