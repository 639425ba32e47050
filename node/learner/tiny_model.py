"""The embedded default policy: a tiny Llama-style model, its char-level tokenizer, and its
starting weights, shipped with the package.

The shape (``embedded_config()``) and the tokenizer (a fixed vocabulary: four specials and the
printable ASCII characters) are built in code; they are the same on every machine by
construction. The weights are a file in this package, ``tiny_model.safetensors`` (float32,
~3.4 MB), whose SHA-256 is ``EMBEDDED_SHA256``: every machine and torch build starts from the
same bytes, so the fingerprint (``node.learner.policy``) agrees across the swarm. They are a
warm-started init (``node.learner.warm_start``, which says why and how to regenerate them):
a fresh init trained for a few dozen steps, which is reproducible per CPU and torch build only,
hence shipped rather than rebuilt.

``ensure_embedded(base_dir)`` materialises the model as a ``save_pretrained`` directory (config,
generation config, tokenizer, weights) that loads through the same ``from_pretrained`` path as
any hub model, and refuses weights that are not the pinned bytes: the shipped file (corrupted,
or replaced without updating the pin) or a data dir's copy (say, from before the weights were
shipped) raise ``EmbeddedWeightsMismatch``, naming the expected hash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import string
import tempfile
from importlib import resources
from pathlib import Path

from node.learner.errors import EmbeddedWeightsMismatch
from protocol import atomic_write_bytes

__all__ = ["EMBEDDED_SHA256", "WEIGHTS_FILE", "build_tokenizer", "embedded_config",
           "ensure_embedded", "shipped_weights_path"]

log = logging.getLogger(__name__)

EMBEDDED_SHA256 = "854ba249e202cd4e38d4e900d18689b485667b484f9fe6ee4feb4e8c9fd17da1"
"""SHA-256 of ``tiny_model.safetensors``: the embedded model's starting weights. Changing it is
changing the swarm's base model (and every node's fingerprint); tests/learner/test_tiny_model.py
pins it too."""
WEIGHTS_FILE = "model.safetensors"
"""The weights' file name, in the package as ``tiny_model.safetensors``, in a base dir as this."""
_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
_CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))


def build_tokenizer():  # type: ignore[no-untyped-def]
    """The embedded model's char-level tokenizer (deterministic: a fixed vocabulary)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", padding_side="left")


def embedded_config():  # type: ignore[no-untyped-def]
    """The embedded model's ``LlamaConfig`` (its shape), without loading any weights: what
    the fit check (``node.learner.fit``) needs before any weights exist."""
    return _config_for(build_tokenizer())


def _config_for(tokenizer):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.02)


def shipped_weights_path() -> Path:
    """Where the package keeps the embedded model's weights."""
    return Path(str(resources.files(__package__).joinpath("tiny_model.safetensors")))


def _verified(path: Path) -> bytes:
    """The bytes of ``path``, if they are the pinned weights; else ``EmbeddedWeightsMismatch``."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise EmbeddedWeightsMismatch(f"embedded model weights {path} unreadable ({e}); "
                                      f"expected sha256 {EMBEDDED_SHA256}") from e
    found = hashlib.sha256(data).hexdigest()
    if found != EMBEDDED_SHA256:
        raise EmbeddedWeightsMismatch(f"embedded model weights {path} have sha256 {found}, "
                                      f"expected {EMBEDDED_SHA256}")
    return data


def ensure_embedded(base_dir: str | os.PathLike[str]) -> Path:
    """Materialise the embedded model in ``base_dir`` once (atomic: a temp dir beside it, then
    renamed) and return ``base_dir``. A ``base_dir`` already there is checked instead: its
    weights must be the pinned bytes (``EmbeddedWeightsMismatch`` otherwise; its message says
    how to start over from the shipped weights)."""
    base = Path(base_dir)
    if (base / "config.json").exists():
        try:
            _verified(base / WEIGHTS_FILE)
        except EmbeddedWeightsMismatch as e:
            raise EmbeddedWeightsMismatch(
                f"{e}: this data dir's base model is not the one this version ships (made by "
                f"an older version?); to start from the shipped weights, delete {base} and "
                f"{base.parent / 'fingerprint.json'} (checkpoints of the old base are then "
                f"ignored)") from None
        return base
    weights = _verified(shipped_weights_path())
    from transformers import GenerationConfig

    tokenizer = build_tokenizer()
    config = _config_for(tokenizer)
    config.architectures, config.dtype = ["LlamaForCausalLM"], "float32"  # as save_pretrained
    generation = GenerationConfig.from_model_config(config)
    generation.pad_token_id = tokenizer.pad_token_id
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base.parent, prefix=".base-"))
    try:
        config.save_pretrained(tmp)
        generation.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_bytes(tmp / WEIGHTS_FILE, weights)
        os.replace(tmp, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("embedded model materialised in %s (weights sha256 %s)", base, EMBEDDED_SHA256[:12])
    return base
