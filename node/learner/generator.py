"""The asynchronous generator: a process that samples the next rounds while the trainer steps.

With ``engine.staleness`` (eta) >= 1 the learner does not generate in its own round: a
``Generator`` runs ``python -m node.learner.generator`` (a fresh interpreter, never a fork
of the trainer) with its own copy of the policy on ``engine.generation_device`` and its own
CPU threads, and the learner keeps up to eta + 1 rounds' requests in flight (``loop.py``).

Weights travel through a ``WeightBuffer``: one shared-memory block laid out like the
policy's ``state_dict`` plus an 8-byte version, written by the trainer after every step that
moved the weights (a training round or an outer step) and read by the worker before each
request, both under an ``flock`` on a lock file, so the worker never samples from a half
copied state. Every reply names the version its completions were sampled from; the
learner drops (and counts) a group older than eta versions when it is trained.

Frames on the pipes are 4-byte big-endian lengths and msgpack maps (nothing is pickled)::

    client -> {"init": {source, device, dtype, threads, engine: EngineConfig fields,
                        shm, lock, layout: [[name, dtype, shape, offset, nbytes], ...]}}
    worker -> {"ready": true}
    client -> {"id": int, "keys": [str], "prompts": [str], "n": int, "seed": int, "want": int}
    worker -> {"id": int, "seconds": float, "resumed_tokens": int, "pending": int,
               "groups": [[key, version, [[text, token_count, [ids], [logprobs]], ...]], ...],
               "unused": [key], "dropped": [key]}

Without partial rollouts a reply's groups are the request's prompts, in order, all sampled at
one version. With ``engine.partial_rollouts`` = F >= 1 (APRIL's over-provisioning, a
``PartialPool``) the worker keeps up to ``ceil(F x want)`` groups going, samples them
``partial_segment_tokens`` at a time (the newest weights before every segment: each token
carries the version that sampled it), and replies with the first ``want`` groups whose
completions all finished, oldest first; the unfinished ones stay for the next request, where
they are resumed first (their prefix prefilled afresh under the then current weights). A
group's version is its oldest token's; a kept group more than ``staleness`` versions old is
dropped (``dropped``), and prompts it had no room for are handed back (``unused``).
    client -> {"hash": true}
    worker -> {"hash": str, "version": int}      sha256 of the weights it samples from

The worker exits when its stdin closes; it dies with the learner (``die_with_parent``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import math
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable, Iterator

import torch

from node.child import die_with_parent
from node.learner.config import EngineConfig
from node.learner.engine import Completion
from node.learner.errors import EngineError
from protocol.limits import Limits, packb, unpackb

__all__ = ["Generator", "Reply", "WeightBuffer", "weights_hash"]

log = logging.getLogger(__name__)

_LIMITS = Limits(max_message_bytes=256 * 1024 * 1024, max_str=16 * 1024 * 1024,
                 max_list=1 << 20, max_depth=6, max_objects=1 << 26)
"""Both ends are this node's own processes; the bounds only catch a corrupted stream."""
_HEADER = 8
"""The buffer starts with the version (int64) of the weights it holds; -1: none yet."""
_DTYPES = {str(t): t for t in (torch.float32, torch.bfloat16, torch.float16, torch.float64,
                               torch.int64, torch.int32, torch.bool, torch.uint8)}


def weights_hash(model: Any) -> str:
    """sha256 over the model's ``state_dict`` (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _write_frame(f: IO[bytes], obj: dict[str, Any]) -> None:
    data = packb(obj)
    f.write(len(data).to_bytes(4, "big") + data)
    f.flush()


def _read_frame(f: IO[bytes]) -> dict[str, Any] | None:
    head = f.read(4)
    if len(head) < 4:
        return None
    n = int.from_bytes(head, "big")
    if not 0 < n <= _LIMITS.max_message_bytes:
        raise EngineError(f"generator: frame of {n} bytes")
    data = f.read(n)
    if len(data) < n:
        return None
    frame = unpackb(data, _LIMITS)
    if not isinstance(frame, dict):
        raise EngineError("generator: frame is not a map")
    return frame


class WeightBuffer:
    """A state_dict in shared memory with the version it holds, guarded by an flock."""

    def __init__(self, layout: list[list[Any]], shm: shared_memory.SharedMemory, lock: str,
                 *, owner: bool) -> None:
        self.layout = layout
        self.shm = shm
        self.lock_path = lock
        self._owner = owner
        self._lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        self._version = torch.frombuffer(shm.buf, dtype=torch.int64, count=1)
        self._views = {name: torch.frombuffer(shm.buf, dtype=_DTYPES[dtype], count=nbytes
                                              // torch.tensor([], dtype=_DTYPES[dtype]).element_size(),
                                              offset=offset).view(shape)
                       for name, dtype, shape, offset, nbytes in layout}

    @classmethod
    def create(cls, model: Any, lock: str) -> WeightBuffer:
        layout, offset = [], _HEADER
        for name, t in model.state_dict().items():
            if str(t.dtype) not in _DTYPES:
                raise EngineError(f"generator: cannot share {name} of dtype {t.dtype}")
            nbytes = t.numel() * t.element_size()
            offset = -(-offset // 16) * 16
            layout.append([name, str(t.dtype), list(t.shape), offset, nbytes])
            offset += nbytes
        shm = shared_memory.SharedMemory(create=True, size=max(offset, _HEADER))
        buf = cls(layout, shm, lock, owner=True)
        buf._version[0] = -1
        return buf

    @classmethod
    def attach(cls, name: str, layout: list[list[Any]], lock: str) -> WeightBuffer:
        # the creator unlinks it; Python's resource tracker must not (3.11 has no track=False)
        shm = shared_memory.SharedMemory(name=name)
        try:
            from multiprocessing import resource_tracker
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        except Exception:  # pragma: no cover - best effort
            pass
        return cls(layout, shm, lock, owner=False)

    def write(self, model: Any, version: int) -> None:
        with self._locked(fcntl.LOCK_EX), torch.no_grad():
            state = model.state_dict()
            for name, view in self._views.items():
                view.copy_(state[name].detach().to("cpu"))
            self._version[0] = version

    def read_into(self, model: Any, have: int) -> int:
        """Copy the weights into ``model`` if they are newer than ``have``; the version held."""
        if int(self._version[0]) <= have:
            return have
        with self._locked(fcntl.LOCK_SH), torch.no_grad():
            version = int(self._version[0])
            state = model.state_dict()
            for name, view in self._views.items():
                state[name].copy_(view)
        return version

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        fcntl.flock(self._lock_fd, how)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._views.clear()
        del self._version
        os.close(self._lock_fd)
        self.shm.close()
        if self._owner:
            self.shm.unlink()
            try:
                os.unlink(self.lock_path)
            except OSError:
                pass


@dataclasses.dataclass(frozen=True)
class Reply:
    """A request's finished groups as ``(key, version, completions)`` (the version is the
    oldest that sampled any of their tokens), the keys it did not start or dropped as too
    stale, the seconds the worker spent sampling, the tokens of the returned groups that an
    earlier request started (resumed partial rollouts), and the groups still kept."""

    groups: list[tuple[str, int, list[Completion]]]
    unused: list[str]
    dropped: list[str]
    seconds: float
    resumed_tokens: int = 0
    pending: int = 0


class Generator:
    """The learner's side: starts the worker, pushes weights, submits requests in order and
    takes their replies in the same order."""

    def __init__(self, *, model: Any, source: str, device: str, dtype: str, threads: int,
                 engine: EngineConfig, run_dir: str | Path, ready_timeout_s: float = 300.0) -> None:
        run = Path(run_dir)
        run.mkdir(parents=True, exist_ok=True)
        self.buffer = WeightBuffer.create(model, str(run / f"generator-{os.getpid()}.lock"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2])] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[k] = str(threads)
        self.proc = subprocess.Popen([sys.executable, "-m", "node.learner.generator"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     close_fds=True, preexec_fn=die_with_parent(signal.SIGKILL))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out: IO[bytes] = self.proc.stdout
        self._next_id = 0
        self._pending: list[int] = []
        self.version = -1
        """The newest version pushed."""
        _write_frame(self._in, {"init": {
            "source": source, "device": device, "dtype": dtype, "threads": threads,
            "engine": dataclasses.asdict(engine), "shm": self.buffer.shm.name,
            "lock": self.buffer.lock_path, "layout": self.buffer.layout}})
        frame = self._read(ready_timeout_s)
        if frame.get("ready") is not True:
            self.close()
            raise EngineError(f"generator did not start: {frame.get('error', frame)}")

    def push(self, model: Any, version: int) -> None:
        """Make ``model``'s weights (at ``version``) the ones the next requests sample from."""
        self.buffer.write(model, version)
        self.version = version

    def submit(self, keys: list[str], prompts: list[str], *, n: int, seed: int, want: int) -> int:
        """Queue a request for ``want`` finished groups (``prompts``, named by ``keys``);
        returns its id (replies come back in submission order)."""
        rid = self._next_id
        self._next_id += 1
        _write_frame(self._in, {"id": rid, "keys": keys, "prompts": prompts, "n": n, "seed": seed,
                                "want": want})
        self._pending.append(rid)
        return rid

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def take(self, timeout_s: float = 3600.0) -> Reply:
        """The oldest pending request's reply (blocks until it is done)."""
        if not self._pending:
            raise EngineError("generator: no request in flight")
        rid = self._pending.pop(0)
        frame = self._read(timeout_s)
        if frame.get("id") != rid:
            raise EngineError(f"generator: reply {frame.get('id')!r} for request {rid}: "
                              f"{frame.get('error', '')}")
        groups = [(str(key), int(version),
                   [Completion(text=str(t), token_count=int(c), token_ids=tuple(int(i) for i in ids),
                               logprobs=tuple(float(x) for x in lps)) for t, c, ids, lps in group])
                  for key, version, group in frame["groups"]]
        return Reply(groups, [str(k) for k in frame["unused"]], [str(k) for k in frame["dropped"]],
                     float(frame["seconds"]), int(frame["resumed_tokens"]), int(frame["pending"]))

    def drain(self) -> None:
        """Wait for and drop every pending reply (after a stop, before a weight change that
        must not mix with them)."""
        while self._pending:
            self.take()

    def worker_hash(self) -> tuple[str, int]:
        """(sha256 of the weights the worker samples from now, their version); only with no
        request in flight."""
        if self._pending:
            raise EngineError("generator: worker_hash with requests in flight")
        _write_frame(self._in, {"hash": True})
        frame = self._read(600.0)
        return str(frame["hash"]), int(frame["version"])

    def _read(self, timeout_s: float) -> dict[str, Any]:
        if not select.select([self._out], [], [], timeout_s)[0]:
            raise EngineError(f"generator: no reply in {timeout_s:.0f} s")
        frame = _read_frame(self._out)
        if frame is None:
            code = self.proc.poll()
            raise EngineError(f"generator process ended (exit code {code})")
        return frame

    def close(self) -> None:
        try:
            self._in.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self.buffer.close()


@dataclasses.dataclass
class _Row:
    """One completion in progress: its tokens so far, their behaviour log-probs and versions."""

    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    done: bool = False


@dataclasses.dataclass
class _Group:
    key: str
    prompt_ids: list[int]
    rows: list[_Row]
    started: int
    """The request that started it (a resumed group's tokens before this one are resumed)."""

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rows)

    def oldest(self, default: int) -> int:
        return min((v for r in self.rows for v in r.versions), default=default)


class PartialPool:
    """APRIL's partial rollouts: over-provision, return the first groups that finish, resume
    the rest next time (within the staleness bound). See the module docstring."""

    def __init__(self, engine: Any, *, over: float, segment: int, staleness: int) -> None:
        self.engine = engine
        self.over = over
        self.segment = segment
        self.staleness = staleness
        self.pending: list[_Group] = []
        self.row_steps = 0
        """Rows x tokens asked of the engine so far (what the long tail costs)."""

    def run(self, req: dict[str, Any], request: int, refresh: Callable[[], int]) -> dict[str, Any]:
        want, n, seed = int(req["want"]), int(req["n"]), int(req["seed"])
        version = refresh()
        dropped = [g.key for g in self.pending if version - g.oldest(version) > self.staleness]
        self.pending = [g for g in self.pending if g.key not in set(dropped)]
        room = max(0, math.ceil(self.over * want) - len(self.pending))
        tok = self.engine.tokenizer
        new = list(zip(req["keys"], req["prompts"]))
        active = self.pending + [_Group(key, tok.encode(prompt, add_special_tokens=False),
                                        [_Row() for _ in range(n)], request)
                                 for key, prompt in new[:room]]
        unused = [key for key, _ in new[room:]]
        segment = 0
        while sum(g.done for g in active) < want:
            rows = [(g, r) for g in active for r in g.rows if not r.done]
            if not rows:
                break
            if segment:
                version = refresh()  # in-flight weight updates: each token keeps its version
            outs = self.engine.continue_ids([g.prompt_ids + r.ids for g, r in rows],
                                            prompt_lengths=[len(g.prompt_ids) for g, _ in rows],
                                            max_new_tokens=self.segment, seed=seed + segment)
            self.row_steps += len(rows) * self.segment
            for (g, r), (ids, lps, finished) in zip(rows, outs):
                r.ids += ids
                r.logprobs += lps
                r.versions += [version] * len(ids)
                r.done = finished
            segment += 1
        taken = [g for g in active if g.done][:want]
        self.pending = [g for g in active if g not in taken]
        resumed = sum(len(r.ids) for g in taken if g.started < request for r in g.rows)
        return {"groups": [[g.key, g.oldest(version),
                            [_wire(self.engine.completion(r.ids, r.logprobs)) for r in g.rows]]
                           for g in taken],
                "unused": unused, "dropped": dropped, "resumed_tokens": resumed,
                "pending": len(self.pending)}


def _wire(c: Completion) -> list[Any]:
    return [c.text, c.token_count, list(c.token_ids), list(c.logprobs)]


def _serve(inp: BinaryIO, out: BinaryIO) -> int:
    init = _read_frame(inp)
    if init is None or "init" not in init:
        return 2
    cfg = init["init"]
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from node.learner.engine import TransformersEngine
        from node.learner.policy import prepare_tokenizer, resolve_device, resolve_dtype

        torch.set_num_threads(max(1, int(cfg["threads"])))
        device = resolve_device(cfg["device"])
        tokenizer = AutoTokenizer.from_pretrained(cfg["source"])
        prepare_tokenizer(tokenizer)
        model = AutoModelForCausalLM.from_pretrained(
            cfg["source"], dtype=resolve_dtype(cfg["dtype"], device)).to(device).eval()
        fields: dict[str, Any] = dict(cfg["engine"])
        if fields.get("stop") is not None:
            fields["stop"] = tuple(fields["stop"])
        engine_cfg = EngineConfig(**fields)
        engine = TransformersEngine(engine_cfg, model, tokenizer)
        buffer = WeightBuffer.attach(cfg["shm"], cfg["layout"], cfg["lock"])
        pool = (PartialPool(engine, over=engine_cfg.partial_rollouts,
                            segment=engine_cfg.partial_segment_tokens, staleness=engine_cfg.staleness)
                if engine_cfg.partial_rollouts else None)
    except Exception as e:  # noqa: BLE001 - reported to the learner, which raises it
        _write_frame(out, {"ready": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    requests: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def reader() -> None:  # requests are queued while a generation runs
        try:
            while (frame := _read_frame(inp)) is not None:
                requests.put(frame)
        finally:
            requests.put(None)

    threading.Thread(target=reader, daemon=True).start()
    _write_frame(out, {"ready": True})
    version = -1

    def refresh() -> int:
        nonlocal version
        version = buffer.read_into(model, version)
        return version

    while (req := requests.get()) is not None:
        refresh()
        if req.get("hash"):
            _write_frame(out, {"hash": weights_hash(model), "version": version})
            continue
        t = time.perf_counter()
        try:
            if pool is not None:
                reply = pool.run(req, int(req["id"]), refresh)
            else:
                groups = engine.generate(list(req["prompts"]), n=int(req["n"]), seed=int(req["seed"]))
                reply = {"groups": [[key, version, [_wire(c) for c in g]]
                                    for key, g in zip(req["keys"], groups)],
                         "unused": [], "dropped": [], "resumed_tokens": 0, "pending": 0}
        except Exception as e:  # noqa: BLE001
            _write_frame(out, {"id": req["id"], "error": f"{type(e).__name__}: {e}"})
            continue
        _write_frame(out, {"id": req["id"], "seconds": time.perf_counter() - t, **reply})
    buffer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # the protocol owns fd 1: a library that prints must not corrupt it
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return _serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    sys.exit(main())
