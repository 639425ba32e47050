"""Atomic checkpoints of the learner: weights, optimizer, round counter and RNG state.

Layout under ``<data_dir>/checkpoints/``::

    round-00000012/
        model.safetensors     trained weights (safetensors, no pickle)
        optimizer.pt          optimizer state_dict (tensors/numbers only; weights_only load)
        rng.pt                torch RNG state (weights_only load)
        outer.safetensors     θ_global and momentum of the node's outer state (fp32, flat),
                              only once the node has applied an outer step (version >= 1)
        meta.json             round, fingerprint, sha256 of every file above, and
                              ``provenance`` (base model name, swarm id, task families) and
                              ``outer`` (version and state hash, ``OuterState.hash``) when
                              the learner knows them, and ``heldout``: the newest held-out
                              score the learner had measured by this round (a round
                              record's ``heldout``, ``after_rounds`` <= round), once it has one

A checkpoint is written into a temp dir, every file fsynced, then renamed into place, so a
crash leaves either the old or the new one. The newest ``keep`` are kept; on load a corrupt
newest one (bad checksum, unreadable file) is skipped with a warning naming the file, and the
previous good one is used. If checkpoints exist but none loads, ``CheckpointError`` names them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from node.learner.errors import CheckpointError
from protocol.files import fsync_path

if TYPE_CHECKING:  # importing collectives starts hivemind's import: only its type here
    from collectives.state import OuterState

__all__ = ["Checkpoint", "OUTER_FILE", "Snapshot", "checkpoint_dirs", "file_sha256", "load_checkpoint",
           "save_checkpoint", "snapshot", "write_snapshot"]

log = logging.getLogger(__name__)
_FILES = ("model.safetensors", "optimizer.pt", "rng.pt")
OUTER_FILE = "outer.safetensors"
"""θ_global ("theta") and the momentum ("momentum") of the outer state, flat fp32."""


@dataclass
class Checkpoint:
    """What ``load_checkpoint`` restored."""

    round: int
    path: Path
    fingerprint: str
    heldout: dict[str, Any] | None = None
    """The newest held-out score recorded with it (meta.json ``heldout``), if any."""


def _ckpt_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / "checkpoints"


def file_sha256(path: Path) -> str:
    """The sha256 that meta.json records for a checkpoint file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_dirs(data_dir: str | Path) -> list[Path]:
    """The data dir's checkpoints, newest first (complete ones: each appeared by a rename)."""
    root = _ckpt_dir(data_dir)
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("round-")]
    return sorted(dirs, key=lambda p: p.name, reverse=True)


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint's content copied to CPU memory: later training steps cannot change it."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: torch.Tensor
    provenance: dict[str, Any] = field(default_factory=dict)
    """JSON-able facts about where these weights come from (meta.json ``provenance``)."""
    outer: OuterState | None = None
    """The node's outer state at the snapshot (a copy, its hash already known), if any."""
    heldout: dict[str, Any] | None = None
    """The newest held-out score measured by the snapshot's round (meta.json ``heldout``)."""


def _cpu_copy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


def snapshot(model: Any, optimizer: torch.optim.Optimizer, *,
             provenance: dict[str, Any] | None = None, outer: OuterState | None = None,
             heldout: dict[str, Any] | None = None) -> Snapshot:
    """Copy weights, optimizer state and RNG state to CPU (the only part that blocks training).
    ``outer`` must already be a copy (``OuterLoop.state``): training does not move it."""
    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    return Snapshot(model=_dedupe_shared(state), optimizer=_cpu_copy(optimizer.state_dict()),
                    rng=torch.get_rng_state(), provenance=dict(provenance or {}), outer=outer,
                    heldout=dict(heldout) if heldout is not None else None)


def save_checkpoint(data_dir: str | Path, *, round: int, fingerprint: str, model: Any,
                    optimizer: torch.optim.Optimizer, keep: int = 2,
                    provenance: dict[str, Any] | None = None,
                    outer: OuterState | None = None) -> Path:
    """Write the checkpoint for ``round`` (rounds completed) atomically; prune to ``keep``."""
    return write_snapshot(data_dir, snapshot(model, optimizer, provenance=provenance, outer=outer),
                          round=round, fingerprint=fingerprint, keep=keep)


def write_snapshot(data_dir: str | Path, snap: Snapshot, *, round: int, fingerprint: str,
                   keep: int = 2) -> Path:
    """Write ``snap`` as the checkpoint of ``round`` atomically (fsynced); prune to ``keep``.
    Safe to run in a background thread while training goes on."""
    root = _ckpt_dir(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    final = root / f"round-{round:08d}"
    try:
        save_file(snap.model, str(tmp / "model.safetensors"))
        torch.save(snap.optimizer, tmp / "optimizer.pt")
        torch.save({"cpu": snap.rng}, tmp / "rng.pt")
        files: tuple[str, ...] = _FILES
        meta: dict[str, Any] = {"round": round, "fingerprint": fingerprint}
        if snap.provenance:
            meta["provenance"] = snap.provenance
        if snap.heldout is not None:
            meta["heldout"] = snap.heldout
        if snap.outer is not None:
            meta["outer"] = {"version": snap.outer.version, "state_hash": snap.outer.hash()}
            if snap.outer.version >= 1:  # version 0 is the base model: nothing to keep
                save_file({"theta": snap.outer.theta, "momentum": snap.outer.momentum},
                          str(tmp / OUTER_FILE))
                files = (*_FILES, OUTER_FILE)
        meta["sha256"] = {name: file_sha256(tmp / name) for name in files}
        (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        for name in (*files, "meta.json"):
            fsync_path(tmp / name)
        fsync_path(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoint_dirs(data_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint saved: %s", final)
    return final


def _dedupe_shared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing storage (tied embeddings): clone duplicates."""
    seen: set[int] = set()
    out = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def load_checkpoint(data_dir: str | Path, *, model: Any, optimizer: torch.optim.Optimizer,
                    fingerprint: str) -> Checkpoint | None:
    """Restore the newest good checkpoint into ``model``/``optimizer``; None if there is none."""
    failures = []
    for path in checkpoint_dirs(data_dir):
        try:
            ckpt = _load_one(path, model, optimizer, fingerprint)
        except CheckpointError as e:
            log.warning("skipping checkpoint %s: %s; trying the previous one", path, e)
            failures.append(str(e))
            continue
        if failures:
            log.warning("resumed from older checkpoint %s after %d failure(s)", path, len(failures))
        return ckpt
    if failures:
        raise CheckpointError("no usable checkpoint: " + "; ".join(failures))
    return None


def _load_one(path: Path, model: Any, optimizer: torch.optim.Optimizer, fingerprint: str) -> Checkpoint:
    meta_path = path / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
        expected = meta["sha256"]
        round_ = int(meta["round"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path}: unreadable ({e})") from None
    if meta.get("fingerprint") != fingerprint:
        raise CheckpointError(f"{meta_path}: checkpoint is for model {meta.get('fingerprint')!r}, "
                              f"not {fingerprint!r}")
    for name in _FILES:
        file = path / name
        try:
            ok = file_sha256(file) == expected.get(name)
        except OSError as e:
            raise CheckpointError(f"{file}: unreadable ({e})") from None
        if not ok:
            raise CheckpointError(f"{file}: checksum mismatch (corrupt)")
    try:
        state = load_file(str(path / "model.safetensors"))
        opt_state = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
        rng = torch.load(path / "rng.pt", weights_only=True)
    except Exception as e:  # checksum matched, yet unreadable: report which file
        raise CheckpointError(f"{path}: cannot load ({type(e).__name__}: {e})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise CheckpointError(f"{path / 'model.safetensors'}: keys do not match the model "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    optimizer.load_state_dict(opt_state)
    torch.set_rng_state(rng["cpu"])
    heldout = meta.get("heldout")
    return Checkpoint(round=round_, path=path, fingerprint=fingerprint,
                      heldout=heldout if isinstance(heldout, dict) else None)
