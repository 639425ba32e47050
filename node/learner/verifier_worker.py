"""The verifier worker: a fresh interpreter that rebuilds tasks and scores untrusted text.

Started by ``verifier.VerifierClient`` as ``python -m node.learner.verifier_worker
--memory-mb M --cpu-s S [--preload-rgym]`` (never forked from the trainer). It moves the
protocol off fd 1 (a library printing to stdout cannot corrupt it), limits its address space
(RLIMIT_AS = M MiB) and core dumps, imports the task registry (and reasoning_gym), then sets
RLIMIT_NPROC = 0 so that it cannot start programs (not enforced for root) and says ready.
Each call raises the soft RLIMIT_CPU to S seconds more than used so far (SIGXCPU kills it).

Frames on the pipes are ``protocol.ipc`` frames (4-byte big-endian length + msgpack map)::

    worker  -> {"ready": true}                                  once, after the imports
    client  -> {"id": int, "items": [{"family", "config", "seed", "index",
                                      "prompt", "completions"}, ...]}
    worker  -> {"id": int, "i": k, "rewards": [float, ...]}     per item, in order, or
               {"id": int, "i": k, "reason": str}                its TaskError reason /
                                                                 ``verify_memory``
    worker  -> {"id": int, "done": true}                         after the last item

The worker exits after reporting ``verify_memory`` (a MemoryError leaves it in doubt) and
when its stdin closes. It holds no state the client depends on besides the dataset cache.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
from typing import Any, BinaryIO

__all__ = ["main"]

log = logging.getLogger(__name__)
MAX_REQUEST = 64 * 1024 * 1024
"""Largest request frame read (a round's rollouts are far smaller)."""


def _limit_memory(memory_mb: int) -> None:
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _forbid_processes() -> None:
    # after the imports: thread pools started at import time count against NPROC too
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (ValueError, OSError):  # pragma: no cover - some systems refuse; AS/CPU still hold
        log.warning("RLIMIT_NPROC could not be set")


def _cpu_budget(cpu_s: int) -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime) + cpu_s
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _read_exact(f: BinaryIO, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _write(f: BinaryIO, obj: dict[str, Any]) -> None:
    from protocol.limits import packb

    data = packb(obj)
    f.write(len(data).to_bytes(4, "big") + data)
    f.flush()


def score_item(item: dict[str, Any]) -> dict[str, Any]:
    """Rebuild one rollout's task (prompt must match) and score its completions."""
    from node.learner.errors import TaskError
    from node.learner.tasks import build_task
    from protocol import TaskSpec

    try:
        spec = TaskSpec(family=item["family"], config=dict(item["config"]), seed=item["seed"],
                        index=item["index"])
        task = build_task(spec, prompt=item["prompt"])
    except TaskError as e:
        return {"reason": e.reason}
    return {"rewards": [float(task.score(c)) for c in item["completions"]]}


def _address_space_mb() -> float:
    """Virtual size (what RLIMIT_AS limits); 0 where /proc is absent."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize() / (1024 * 1024)
    except OSError:  # pragma: no cover - not Linux
        return 0.0


def serve(fin: BinaryIO, fout: BinaryIO, *, cpu_s: int, memory_mb: int = 0) -> int:
    """Answer requests until stdin closes; exit code 0, or 3 after a MemoryError."""
    from node.learner.tasks.rgym import clear_cache
    from protocol.limits import Limits, unpackb

    limits = Limits(max_message_bytes=MAX_REQUEST, max_str=1024 * 1024, max_list=4096, max_depth=8)
    _write(fout, {"ready": True})
    while True:
        header = _read_exact(fin, 4)
        if header is None:
            return 0
        n = int.from_bytes(header, "big")
        if n > MAX_REQUEST:
            log.error("request of %d bytes refused", n)
            return 2
        payload = _read_exact(fin, n)
        if payload is None:
            return 0
        request = unpackb(payload, limits)
        call_id = request["id"]
        _cpu_budget(cpu_s)
        for i, item in enumerate(request["items"]):
            if memory_mb and _address_space_mb() > 0.6 * memory_mb:
                clear_cache()  # the cache must never be what pushes us into RLIMIT_AS
            try:
                reply = score_item(item)
            except MemoryError:
                _write(fout, {"id": call_id, "i": i, "reason": "verify_memory"})
                return 3
            _write(fout, {"id": call_id, "i": i, **reply})
        _write(fout, {"id": call_id, "done": True})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node.learner.verifier_worker")
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--cpu-s", type=int, required=True)
    parser.add_argument("--preload-rgym", action="store_true")
    args = parser.parse_args(argv)
    # the protocol gets private copies of fds 0 and 1; fd 1 then points at stderr and fd 0
    # at /dev/null, so nothing a library prints or reads can touch the frames
    fin = os.fdopen(os.dup(0), "rb", buffering=0)
    fout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s verifier %(name)s: %(message)s")
    _limit_memory(args.memory_mb)
    import node.learner.tasks  # noqa: F401  - import cost paid before "ready"

    if args.preload_rgym:
        import reasoning_gym  # noqa: F401
    _forbid_processes()

    return serve(fin, fout, cpu_s=args.cpu_s, memory_mb=args.memory_mb)


if __name__ == "__main__":
    sys.exit(main())
