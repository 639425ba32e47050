"""TCP probes run inside bed hosts: RTT by echo, throughput by a timed bulk send.

    python -m bench.wan.probe serve ADDR        # prints the port, serves until killed
    python -m bench.wan.probe rtt ADDR PORT N   # prints JSON {"rtt_ms": [...]}
    python -m bench.wan.probe send ADDR PORT NBYTES   # prints JSON {"seconds", "mbit_s"}
    python -m bench.wan.probe dial ADDR PORT    # prints JSON {"ok": bool, "peer": ..., "error"}

The server answers each connection by its first byte: ``e`` echo every byte back, ``s`` sink
everything and answer ``k`` at EOF, ``w`` write back the address it sees the client at.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def _handle(c: socket.socket, peer: tuple[str, int]) -> None:
    with c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = c.recv(1)
        if mode == b"e":
            while b := c.recv(65536):
                c.sendall(b)
        elif mode == b"s":
            while c.recv(1 << 20):
                pass
            c.sendall(b"k")
        elif mode == b"w":
            c.sendall(f"{peer[0]}:{peer[1]}".encode())


def serve(addr: str) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    s.listen(16)
    print(s.getsockname()[1], flush=True)
    while True:
        c, peer = s.accept()
        threading.Thread(target=_handle, args=(c, peer), daemon=True).start()


def rtt(addr: str, port: int, n: int) -> dict:
    c = socket.create_connection((addr, port), timeout=10)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"e")
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.sendall(b"x")
        if c.recv(1) != b"x":
            raise RuntimeError("echo broke")
        out.append(round((time.perf_counter() - t) * 1000, 3))
    c.close()
    return {"rtt_ms": out}


def send(addr: str, port: int, nbytes: int) -> dict:
    c = socket.create_connection((addr, port), timeout=60)
    c.sendall(b"s")
    buf = b"x" * (1 << 20)
    t = time.perf_counter()
    left = nbytes
    while left > 0:
        k = min(left, len(buf))
        c.sendall(buf[:k])
        left -= k
    c.shutdown(socket.SHUT_WR)
    if c.recv(1) != b"k":
        raise RuntimeError("sink did not acknowledge")
    dt = time.perf_counter() - t
    c.close()
    return {"bytes": nbytes, "seconds": round(dt, 4), "mbit_s": round(nbytes * 8 / dt / 1e6, 2)}


def dial(addr: str, port: int, timeout_s: float = 3.0) -> dict:
    try:
        c = socket.create_connection((addr, port), timeout=timeout_s)
    except OSError as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    with c:
        c.sendall(b"w")
        return {"ok": True, "seen_as": c.recv(100).decode()}


def main(argv: list[str]) -> int:
    cmd, addr, rest = argv[0], argv[1], argv[2:]
    if cmd == "serve":
        serve(addr)
        return 0
    fn = {"rtt": rtt, "send": send, "dial": dial}[cmd]
    print(json.dumps(fn(addr, *map(int, rest))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
