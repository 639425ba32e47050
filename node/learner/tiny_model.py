"""The embedded default policy: a tiny Llama-style model and a char-level tokenizer.

Both are built deterministically (fixed vocabulary, fixed-seed init on CPU in float32), so
every peer that materialises them gets bit-identical base weights and hence the same model
fingerprint. They are saved with ``save_pretrained`` and loaded back through the same
``from_pretrained`` path as any hub model.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from pathlib import Path

import torch

__all__ = ["EMBEDDED_SEED", "build_embedded", "ensure_embedded"]

EMBEDDED_SEED = 1234
"""Seed of the deterministic init; changing it changes the embedded fingerprint."""
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


def build_embedded(out_dir: str | os.PathLike[str]) -> None:
    """Build the embedded model and tokenizer and ``save_pretrained`` them into ``out_dir``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.02)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EMBEDDED_SEED)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


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
