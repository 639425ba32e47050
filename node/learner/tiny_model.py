"""The embedded default policy: a tiny Llama-style model and a char-level tokenizer.

Both are built deterministically (fixed vocabulary, fixed-seed init on CPU in float32), then
the model gets a short supervised warm start (``WARM_START``: a few dozen Adam steps on a
synthetic corpus of ``letter_sort`` questions of mixed lengths, fixed seeds, one CPU thread),
which leaves it where a small pretrained LM starts on a reasoning task: low but non-zero
sampled accuracy on the default family, so most groups of completions score all-wrong (the
SAPO paper's regime). The result is saved with ``save_pretrained`` and loaded back through the
same ``from_pretrained`` path as any hub model; the fingerprint hashes the warm-started
weights, so on one machine (one torch build) every data dir gets the same fingerprint.

Building takes seconds of CPU (the warm start), so a build is also kept in the user's cache
(``cache_dir()``) under a key of everything that decides its bytes (this module's and the
task's source, the torch and transformers versions): the nodes of ``swarm-node local`` and
every later data dir on the machine copy it instead of building it again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import string
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["EMBEDDED_SEED", "WARM_START", "build_embedded", "cache_dir", "embedded_config",
           "ensure_embedded", "warm_start"]

log = logging.getLogger(__name__)

EMBEDDED_SEED = 1234
"""Seed of the deterministic init; changing it changes the embedded fingerprint."""
WARM_START: dict[str, object] = {"steps": 40, "batch": 64, "lr": 3e-3, "lengths": (3, 4, 5),
                                 "seed": "embedded-warm-start"}
"""The supervised warm start (changing it changes the embedded fingerprint): ``steps`` AdamW
steps of ``batch`` sorted-letter examples, the length of each drawn from ``lengths``."""
_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
_CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))


def _build_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", padding_side="left")


def embedded_config():  # type: ignore[no-untyped-def]
    """The embedded model's ``LlamaConfig`` (its shape), without building the model: what
    the fit check (``node.learner.fit``) needs before any weights exist."""
    return _config_for(_build_tokenizer())


def _config_for(tokenizer):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.02)


def build_embedded(out_dir: str | os.PathLike[str]) -> None:
    """Build the embedded model and tokenizer and ``save_pretrained`` them into ``out_dir``."""
    from transformers import LlamaForCausalLM

    tokenizer = _build_tokenizer()
    config = _config_for(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EMBEDDED_SEED)
        model = LlamaForCausalLM(config).to(torch.float32)
        warm_start(model, tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def warm_start(model, tokenizer,  # type: ignore[no-untyped-def]
               recipe: dict[str, object] | None = None) -> float:
    """Supervised warm start of ``model`` in place (loss on answer tokens only); returns the
    last step's loss. Bit-reproducible on one torch build: fixed seeds, one intra-op thread."""
    from node.learner.tasks.letter_sort import sort_question

    r: dict[str, Any] = {**WARM_START, **(recipe or {})}
    rng = random.Random(str(r["seed"]))
    lengths = tuple(r["lengths"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(r["lr"]), weight_decay=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loss = torch.zeros(())
    try:
        model.train()
        for _ in range(int(r["steps"])):
            rows = []
            for _ in range(int(r["batch"])):
                prompt, answer = sort_question(rng, lengths[rng.randrange(len(lengths))])
                p = tokenizer.encode(prompt, add_special_tokens=False)
                rows.append((p, tokenizer.encode(answer + "\n", add_special_tokens=False)))
            width = max(len(p) + len(a) for p, a in rows)
            ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            labels = torch.full_like(ids, -100)
            for i, (p, a) in enumerate(rows):
                ids[i, :len(p) + len(a)] = torch.tensor(p + a)
                mask[i, :len(p) + len(a)] = 1
                labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return loss.item()


def cache_dir() -> Path:
    """Where built embedded models are kept: ``$SWARM_NODE_CACHE``, else
    ``$XDG_CACHE_HOME/swarm-node``, else ``~/.cache/swarm-node``."""
    if os.environ.get("SWARM_NODE_CACHE"):
        return Path(os.environ["SWARM_NODE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "swarm-node"


def _build_key() -> str:
    """A hash of everything that decides the built model's bytes."""
    import transformers

    from node.learner.tasks import letter_sort

    h = hashlib.sha256()
    for module_file in (__file__, letter_sort.__file__):
        h.update(Path(module_file).read_bytes())
    h.update(f"torch {torch.__version__} transformers {transformers.__version__}".encode())
    return h.hexdigest()[:24]


def ensure_embedded(base_dir: str | os.PathLike[str], *, cache: Path | None = None) -> Path:
    """Materialise the embedded model in ``base_dir`` once (atomic: temp dir + rename): copied
    from ``cache`` (a ``cache_dir()``) when a build with the same key is there, else built
    (and then kept in ``cache``). Without ``cache`` it is always built. A cache that cannot
    be read or written is skipped (logged): the build does not depend on it."""
    base = Path(base_dir)
    if (base / "config.json").exists():
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    cached = cache / f"embedded-{_build_key()}" if cache is not None else None
    if cached is not None and (cached / "config.json").exists():
        try:
            _copy_into_place(cached, base)
            log.info("embedded model copied from the cache %s", cached)
            return base
        except OSError as e:
            log.warning("embedded model cache %s unreadable (%s): building it", cached, e)
    tmp = Path(tempfile.mkdtemp(dir=base.parent, prefix=".base-"))
    try:
        started = time.monotonic()
        build_embedded(tmp)
        log.info("embedded model built in %.1f s%s", time.monotonic() - started,
                 f"; kept in the cache {cached}" if cached is not None else "")
        if cached is not None:
            _keep(tmp, cached)
        os.replace(tmp, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return base


def _copy_into_place(src: Path, dest: Path) -> None:
    """Copy the directory ``src`` to ``dest`` atomically: into a temp dir beside ``dest``,
    then renamed (raises OSError if ``dest`` appeared meanwhile: a concurrent copy won)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keep(built: Path, cached: Path) -> None:
    """Copy a build into the cache (a concurrent builder's copy wins: same bytes)."""
    try:
        _copy_into_place(built, cached)
    except OSError as e:  # read-only home, full disk, or another node's copy is there first
        if not (cached / "config.json").exists():
            log.warning("cannot keep the embedded model in the cache %s: %s", cached, e)
