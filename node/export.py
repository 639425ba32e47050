"""`swarm-node export`: the node's policy as a standard Hugging Face model directory.

What is exported (``version``):

- ``local`` (default): the weights of the newest good checkpoint, i.e. the policy this node
  trains and samples with (θ_global of its last outer step plus its own rounds since).
- ``outer``: θ_global of the node's last applied outer step, kept in the checkpoint
  (``outer.safetensors``) once the node has one; its hash is recomputed with
  ``OuterState.hash`` and must equal the one the node reported.

The directory holds ``model.safetensors`` (+ ``config.json``, ``generation_config.json``),
the base model's tokenizer files (its chat template included), ``README.md`` (a model card
with YAML front matter) and ``provenance.json`` (``PROVENANCE_FIELDS``). The held-out score in
both is the one the checkpoint recorded: the newest the node measured by that checkpoint's
round (``heldout``; None, "not measured", when it had none). It is written into a
temp dir beside ``out`` and renamed into place; an existing ``out`` is replaced only with
``force``.

Reading a checkpoint while the node runs is safe: checkpoints appear by an atomic rename
and are never modified after, every file is checked against the sha256 in meta.json, and a
checkpoint pruned while we read it (the node keeps its newest ``keep_checkpoints``) is a
failed read: we take the newest again. A running node is reported, not refused; its newest
checkpoint lags its live weights by up to ``checkpoint_every_s`` plus a round.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ExportError", "Exported", "HELDOUT_FIELDS", "PROVENANCE_FIELDS", "VERSIONS",
           "export_model", "load_checkpoint_policy"]

log = logging.getLogger(__name__)

VERSIONS = ("local", "outer")
PROVENANCE_FIELDS = ("swarm_id", "base_model", "base_fingerprint", "exported_version", "rounds",
                     "outer_version", "outer_state_hash", "task_families", "checkpoint",
                     "checkpoint_sha256", "exported_at", "heldout")
"""Keys of ``provenance.json`` (None where the checkpoint does not record the fact)."""
HELDOUT_FIELDS = ("after_rounds", "greedy_accuracy", "sampled_accuracy", "questions", "samples",
                  "by_family")
"""What ``provenance.json``'s ``heldout`` keeps of the checkpoint's held-out score."""
CARD_NAME, PROVENANCE_NAME = "README.md", "provenance.json"


class ExportError(Exception):
    """The export cannot be made; the message is one line that says why."""


@dataclass(frozen=True)
class Exported:
    """What ``export_model`` wrote."""

    out: Path
    provenance: dict[str, Any]
    running_pid: int | None
    """The pid of a node running on the data dir when we read it (None: none)."""


def export_model(data_dir: str | Path, out: str | Path, *, version: str = "local",
                 force: bool = False) -> Exported:
    """Write the node's policy (``version``: local | outer) from ``data_dir`` to ``out``."""
    if version not in VERSIONS:
        raise ExportError(f"version must be one of {', '.join(VERSIONS)}, not {version!r}")
    data, out = Path(data_dir), Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} exists; pass --force to replace it")
    from node.locks import lock_holder

    running = lock_holder(data / "learner.lock") or lock_holder(data / "node.lock")
    base_name, fingerprint = _base(data)
    ckpt, meta = _newest_checkpoint(data, fingerprint, version)
    model, tokenizer = _build(data, base_name, ckpt, meta, version)
    prov = _provenance(base_name, fingerprint, ckpt, meta, version)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / PROVENANCE_NAME).write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
        (tmp / CARD_NAME).write_text(model_card(prov))
        _replace(tmp, out, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s policy of round %d from %s to %s", version, prov["rounds"], ckpt, out)
    return Exported(out=out, provenance=prov, running_pid=running)


def load_checkpoint_policy(data_dir: str | Path, *, version: str = "local"
                           ) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, provenance) of the newest good checkpoint in ``data_dir``, as
    ``export_model`` would write them (``swarm-node eval`` scores this without a copy)."""
    if version not in VERSIONS:
        raise ExportError(f"version must be one of {', '.join(VERSIONS)}, not {version!r}")
    data = Path(data_dir)
    base_name, fingerprint = _base(data)
    ckpt, meta = _newest_checkpoint(data, fingerprint, version)
    model, tokenizer = _build(data, base_name, ckpt, meta, version)
    prov = _provenance(base_name, fingerprint, ckpt, meta, version)
    prov["family_config"] = (meta.get("provenance") or {}).get("family_config")
    return model, tokenizer, prov


def _base(data: Path) -> tuple[str, str]:
    """The base model's name and fingerprint, as the node stored them (policy.py)."""
    path = data / "fingerprint.json"
    if not data.is_dir():
        raise ExportError(f"{data} is not a directory")
    try:
        stored = json.loads(path.read_text())
        return str(stored["model"]), str(stored["fingerprint"])
    except FileNotFoundError:
        raise ExportError(f"no checkpoint in {data}: no node has trained with this data dir") \
            from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{path} is unreadable ({e})") from None


def _newest_checkpoint(data: Path, fingerprint: str, version: str) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint whose files match their sha256 (read twice: a node running on
    the dir may prune the one we read)."""
    from node.learner.checkpoint import OUTER_FILE, checkpoint_dirs, file_sha256

    failures: list[str] = []
    for _ in range(2):
        for path in checkpoint_dirs(data):
            try:
                meta = json.loads((path / "meta.json").read_text())
                if meta.get("fingerprint") != fingerprint:
                    raise ValueError(f"it is for model {meta.get('fingerprint')!r}, not {fingerprint!r}")
                if version == "outer" and OUTER_FILE not in meta.get("sha256", {}):
                    raise ExportError(f"{data} holds no outer step (its newest checkpoint "
                                      f"{path.name} has none); export --version local")
                for name in ("model.safetensors", *([OUTER_FILE] if version == "outer" else [])):
                    if file_sha256(path / name) != meta["sha256"].get(name):
                        raise ValueError(f"{name}: checksum mismatch (corrupt)")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                log.warning("skipping checkpoint %s: %s", path, e)
                failures.append(f"{path.name}: {e}")
                continue
            return path, meta
    if failures:
        raise ExportError(f"no usable checkpoint in {data / 'checkpoints'} ({failures[0]})")
    raise ExportError(f"no checkpoint in {data / 'checkpoints'}: run the node until it saves one")


def _build(data: Path, base_name: str, ckpt: Path, meta: dict[str, Any], version: str) -> Any:
    """The base architecture and tokenizer with the checkpoint's (or θ_global's) weights."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from node.learner.checkpoint import OUTER_FILE

    hf_logging.disable_progress_bar()
    source = str(data / "base") if base_name == "embedded" else base_name
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        dtype = f.get_slice(next(iter(f.keys()))).get_dtype()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=_torch_dtype(dtype))
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot load the base model {base_name!r}: {str(e).splitlines()[0]}") \
            from None
    if version == "local":
        state = load_file(str(ckpt / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise ExportError(f"{ckpt / 'model.safetensors'}: keys do not match the base model")
        model.tie_weights()
    else:
        _load_outer(model, ckpt / OUTER_FILE, meta["outer"])
    return model.eval(), tokenizer


def _load_outer(model: Any, path: Path, recorded: dict[str, Any]) -> None:
    """θ_global into ``model``, after checking its hash is the one the node reported."""
    from safetensors.torch import load_file

    from collectives.state import OuterState, unflatten_into

    tensors = load_file(str(path))
    state = OuterState(theta=tensors["theta"], momentum=tensors["momentum"],
                       applied=int(recorded["version"]))
    if state.hash() != recorded["state_hash"]:
        raise ExportError(f"{path}: its state hash is not the one the node recorded")
    params = list(model.parameters())
    if state.theta.numel() != sum(p.numel() for p in params):
        raise ExportError(f"{path}: θ has {state.theta.numel()} values, the base model "
                          f"{sum(p.numel() for p in params)}")
    unflatten_into(state.theta, params)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(name, "auto")


def _provenance(base_name: str, fingerprint: str, ckpt: Path, meta: dict[str, Any],
                version: str) -> dict[str, Any]:
    recorded = meta.get("provenance") or {}
    outer = meta.get("outer") or {}
    now = datetime.datetime.fromtimestamp(time.time(), datetime.timezone.utc)
    return {"swarm_id": recorded.get("swarm_id"), "base_model": base_name,
            "base_fingerprint": fingerprint, "exported_version": version,
            "rounds": int(meta["round"]), "outer_version": outer.get("version"),
            "outer_state_hash": outer.get("state_hash"),
            "task_families": recorded.get("task_families"), "checkpoint": ckpt.name,
            "checkpoint_sha256": meta["sha256"]["model.safetensors"],
            "exported_at": now.isoformat(timespec="seconds"), "heldout": _heldout(meta)}


def _heldout(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's held-out score (``HELDOUT_FIELDS``), None if it records none."""
    score = meta.get("heldout")
    if not isinstance(score, dict) or not all(k in score for k in HELDOUT_FIELDS):
        return None
    return {k: score[k] for k in HELDOUT_FIELDS}


def model_card(prov: dict[str, Any]) -> str:
    """README.md: YAML front matter (Hugging Face model card metadata) and the provenance."""
    base = prov["base_model"]
    hub_id = base != "embedded" and not base.startswith(("/", ".", "~")) and base.count("/") == 1
    front = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             *([f"base_model: {base}"] if hub_id else []),
             "tags:", "- swarm-node", "- reinforcement-learning", "- grpo", "---"]
    def show(value: Any) -> str:
        if value is None:
            return "unknown"
        return ", ".join(value) if isinstance(value, list) else str(value)

    rows = "\n".join(f"| {k} | `{show(prov[k])}` |" for k in PROVENANCE_FIELDS if k != "heldout")
    return "\n".join(front) + f"""

# {base}, RL post-trained by swarm-node

The {prov['exported_version']} policy of a swarm-node after {prov['rounds']} rounds in swarm
`{show(prov['swarm_id'])}`, exported by `swarm-node export`. Load it with
`transformers.AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` (or vLLM).

| field | value |
|---|---|
{rows}

{_heldout_section(prov)}
`base_fingerprint` is the node's fingerprint of its base model (its config and weights);
`outer_state_hash` the hash of the outer state (θ_global, momentum, version) the node
reported at its last outer step (`param_hash`), None before its first. The same facts are
in `{PROVENANCE_NAME}`.
"""


def _heldout_section(prov: dict[str, Any]) -> str:
    """The model card's "Held-out score": the checkpoint's, with the round it was measured
    at, or "not measured"."""
    score = prov["heldout"]
    again = "`swarm-node eval --model <this directory>` measures it on these weights."
    if score is None:
        return ("## Held-out score\n\nNot measured: the node had not scored its policy on the "
                "held-out set by this checkpoint (`[learner] eval_every` is 0, or it had trained "
                f"fewer rounds than that). {again}\n")
    after, rounds = score["after_rounds"], prov["rounds"]
    notes = []
    if after != rounds:
        notes.append(f"These weights are of round {rounds}, {rounds - after} round(s) after "
                     "the measurement.")
    if prov["exported_version"] == "outer":
        notes.append("The node measured its local policy, not the outer version exported here.")
    families = "\n".join(f"| {name} | {f['greedy_accuracy']:.3f} | {f['sampled_accuracy']:.3f} "
                         f"| {f['questions']} |" for name, f in sorted(score["by_family"].items()))
    return f"""## Held-out score

Measured by the node after round {after} on its fixed held-out set (questions no training
round uses, the same for every node with these task families): greedy accuracy
**{score['greedy_accuracy']:.3f}**, sampled accuracy **{score['sampled_accuracy']:.3f}**
({score['samples']} sampled completion(s) per question), {score['questions']} questions.
{" ".join(notes + [again])}

| family | greedy accuracy | sampled accuracy | questions |
|---|---|---|---|
{families}
"""


def _replace(tmp: Path, out: Path, *, force: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (``force``) is moved aside first and
    removed after, so ``out`` is always either the old export or the new one."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if not force:
        raise ExportError(f"{out} exists; pass --force to replace it")
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
    os.replace(out, old / "x")
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
