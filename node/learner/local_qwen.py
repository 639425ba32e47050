"""A Qwen2-architecture policy built locally: for tests and benches that need a real model shape.

``ensure_local_qwen(shape)`` returns a directory that ``load_policy`` (``PolicyConfig.model`` =
that path) loads exactly like a hub ``Qwen/Qwen2.5-...`` checkout: ``Qwen2ForCausalLM`` with
random weights from ``transformers.Qwen2Config`` and a ``PreTrainedTokenizerFast`` with Qwen2's
byte-level BPE pipeline (its split regex, NFC, byte-level decoder), Qwen's special tokens
(``<|endoftext|>`` as pad, ``<|im_start|>``, ``<|im_end|>`` as eos) and the Qwen2.5 chat
template (system / user / assistant turns; tool calls left out).

What is real and what is small
------------------------------
- The tokenizer is *trained* here with ``tokenizers`` (byte-level BPE, ``LEARNED_VOCAB``
  entries) on a deterministic corpus of chat-formatted arithmetic and letter questions. Its
  vocabulary is small; Qwen's is 151,643 learned tokens.
- The model's ``vocab_size`` is Qwen2.5's 151,936 whatever the tokenizer's length, as in Qwen
  itself, whose embedding has 271 rows no token maps to. Here the rows past the tokenizer are
  unused in the same way, just many more of them. This is what makes the memory behaviour real:
  every position's logits are 151,936 wide.
- Depth and width are set by ``QwenShape`` (``TINY`` for CPU tests; ``QWEN25_05B`` has the
  Qwen2.5-0.5B dimensions for GPU benches).
- ``warm_steps`` AdamW steps of next-token training on the corpus (``TINY``: 12) teach the
  random model to put its probability on the learned tokens, so sampling produces decodable
  text instead of ids the tokenizer does not have; 0 leaves the weights as initialised.

Builds are deterministic (fixed seeds, one CPU thread while building) and cached: the
directory is ``<cache>/qwen-local-<key>`` where ``key`` hashes the shape and the recipe, the
cache root is ``$SWARM_NODE_MODEL_CACHE`` or ``<tempdir>/swarm-node-models``, and the build
goes to a temp dir renamed into place (concurrent builders are safe; the loser's copy is
discarded).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = ["LEARNED_VOCAB", "QWEN25_05B", "QWEN_CHAT_TEMPLATE", "QWEN_SPECIAL_TOKENS",
           "QWEN_VOCAB_SIZE", "TINY", "QwenShape", "build_local_qwen", "ensure_local_qwen",
           "model_cache_dir"]

QWEN_VOCAB_SIZE = 151936
"""Qwen2.5's embedding rows (0.5B to 7B)."""
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen's special tokens the chat template needs, in Qwen's id order."""
LEARNED_VOCAB = 2048
"""Entries of the locally trained byte-level BPE (256 bytes + merges), before the specials."""
_RECIPE_VERSION = 1
"""Bump when the corpus, tokenizer training or warm start changes (changes the cache key)."""

QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role != 'system' or not loop.first %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen2.5-Instruct's chat template without its tool-call branches."""

# Qwen2's pre-tokenizer split (tokenizer.json of Qwen2.5): contractions, letters, single
# digits, punctuation runs, newlines, spaces.
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SYSTEM = ("A conversation between User and Assistant. The user asks a question, and the "
           "Assistant solves it. The assistant first thinks about the reasoning process in the "
           "mind and then provides the user with the answer.")


@dataclass(frozen=True, kw_only=True)
class QwenShape:
    """Dimensions of a Qwen2 model (``transformers.Qwen2Config`` names) and its warm start."""

    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the MLP."""
    num_hidden_layers: int
    """Transformer blocks."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """Key/value heads (grouped-query attention)."""
    max_position_embeddings: int = 4096
    """Longest sequence (rotary positions)."""
    warm_steps: int = 0
    """AdamW steps of next-token training on the local corpus after init (module docstring)."""
    seed: int = 0
    """Seed of the weight init and the warm start."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"QwenShape.{name} must be positive, got {getattr(self, name)}")
        if self.warm_steps < 0:
            raise ValueError(f"QwenShape.warm_steps must be >= 0, got {self.warm_steps}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("QwenShape.hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("QwenShape.num_attention_heads must be a multiple of num_key_value_heads")


TINY = QwenShape(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, warm_steps=12)
"""CPU tests: ~9.8M parameters, 9.7M of them the (tied) 151,936-row embedding."""
QWEN25_05B = QwenShape(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768)
"""Qwen2.5-0.5B's dimensions (494M parameters), random init: GPU memory and speed benches."""


def model_cache_dir() -> Path:
    """``$SWARM_NODE_MODEL_CACHE`` or ``<tempdir>/swarm-node-models``."""
    env = os.environ.get("SWARM_NODE_MODEL_CACHE")
    return Path(env) if env else Path(tempfile.gettempdir()) / "swarm-node-models"


def ensure_local_qwen(shape: QwenShape = TINY, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The built model directory for ``shape`` (built once per cache key, atomically)."""
    key = hashlib.sha256(json.dumps({"shape": asdict(shape), "v": _RECIPE_VERSION,
                                     "vocab": LEARNED_VOCAB}, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    out = root / f"qwen-local-{key}"
    if (out / "config.json").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".qwen-build-"))
    try:
        build_local_qwen(tmp, shape)
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").exists():  # not a concurrent builder that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_local_qwen(out_dir: str | os.PathLike[str], shape: QwenShape = TINY) -> None:
    """Train the tokenizer, init (and warm-start) the model, ``save_pretrained`` both."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    corpus = _corpus(random.Random(f"qwen-local-corpus-{_RECIPE_VERSION}"), 3000)
    tokenizer = _train_tokenizer(corpus)
    specials = tokenizer.convert_tokens_to_ids(list(QWEN_SPECIAL_TOKENS))
    endoftext, _, im_end = specials
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB_SIZE, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext,
        initializer_range=0.02)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(shape.seed)
            model = Qwen2ForCausalLM(config).to(torch.float32)
            if shape.warm_steps:
                _warm_start(model, tokenizer, corpus, steps=shape.warm_steps, seed=shape.seed)
    finally:
        torch.set_num_threads(threads)
    model.generation_config.eos_token_id = [im_end, endoftext]
    model.generation_config.pad_token_id = endoftext
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _corpus(rng: random.Random, n: int) -> list[str]:
    """Chat-formatted short questions and answers (arithmetic, letter sorting, counting)."""
    words = ("the sum of", "sort the letters", "how many", "answer", "number", "result", "first",
             "then", "compute", "letters", "alphabetical order", "total", "each", "step")
    texts = []
    for _ in range(n):
        kind = rng.randrange(3)
        if kind == 0:
            a, b = rng.randrange(1000), rng.randrange(1000)
            q, ans = f"What is {a} + {b}?", f"{a} + {b} = {a + b}. <answer>{a + b}</answer>"
        elif kind == 1:
            letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
            q = f"Sort the letters of '{letters}' in alphabetical order."
            ans = f"<answer>{''.join(sorted(letters))}</answer>"
        else:
            q = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + "?"
            ans = f"Step {rng.randrange(10)}: {rng.choice(words)}. <answer>{rng.randrange(100)}</answer>"
        texts.append(f"<|im_start|>system\n{_SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
                     f"<|im_start|>assistant\n{ans}<|im_end|>\n")
    return texts


def _train_tokenizer(corpus: list[str]):  # type: ignore[no-untyped-def]
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=LEARNED_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    plain = [t.replace("<|im_start|>", "").replace("<|im_end|>", "") for t in corpus]
    tok.train_from_iterator(plain, trainer=trainer)
    tok.add_special_tokens(list(QWEN_SPECIAL_TOKENS))  # ids after the learned ones, Qwen's order
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS), padding_side="left",
        clean_up_tokenization_spaces=False, model_max_length=131072)
    fast.chat_template = QWEN_CHAT_TEMPLATE
    return fast


def _warm_start(model, tokenizer, corpus: list[str], *, steps: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Next-token AdamW steps on the corpus: moves mass onto tokens the tokenizer has."""
    rng = random.Random(f"qwen-local-warm-{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        rows = [tokenizer.encode(t, add_special_tokens=False)[:64] for t in rng.sample(corpus, 4)]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            labels[i, :len(r)] = ids[i, :len(r)]
            mask[i, :len(r)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
