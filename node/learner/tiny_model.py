"""The embedded default policy: a tiny Llama-style model and a char-level tokenizer.

Both are built deterministically (fixed vocabulary, fixed-seed init on CPU in float32), then
the model gets a short supervised warm start (``WARM_START``: a few dozen Adam steps on a
synthetic corpus of ``letter_sort`` questions of mixed lengths, fixed seeds, one CPU thread),
which leaves it where a small pretrained LM starts on a reasoning task: low but non-zero
sampled accuracy on the default family, so most groups of completions score all-wrong (the
SAPO paper's regime). The result is saved with ``save_pretrained`` and loaded back through the
same ``from_pretrained`` path as any hub model; the fingerprint hashes the warm-started
weights, so on one machine (one torch build) every data dir gets the same fingerprint.
"""

from __future__ import annotations

import os
import random
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["EMBEDDED_SEED", "WARM_START", "build_embedded", "embedded_config", "ensure_embedded",
           "warm_start"]

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


def ensure_embedded(base_dir: str | os.PathLike[str]) -> Path:
    """Materialise the embedded model in ``base_dir`` once (atomic: temp dir + rename)."""
    base = Path(base_dir)
    if (base / "config.json").exists():
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base.parent, prefix=".base-"))
    try:
        build_embedded(tmp)
        os.replace(tmp, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return base
