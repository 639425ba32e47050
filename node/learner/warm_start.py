"""How the embedded model's shipped weights were made, and the command that remakes them.

A fixed-seed init on CPU in float32 (``EMBEDDED_SEED``), then a short supervised warm start
(``WARM_START``: a few dozen AdamW steps on a synthetic corpus of ``letter_sort`` questions of
mixed lengths, fixed seeds, one CPU thread), which leaves the model where a small pretrained LM
starts on a reasoning task: low but non-zero sampled accuracy on the default family, so most
groups of completions score all-wrong (the SAPO paper's regime).

The result is bit-reproducible on one CPU and torch build only (float rounding in the matmuls
differs across CPUs), so nodes do not run this: the package ships its output,
``node/learner/tiny_model.safetensors``, pinned by ``tiny_model.EMBEDDED_SHA256``. To change
the base model on purpose (a new recipe, shape or tokenizer)::

    PYTHONPATH=$PWD .venv/bin/python -m node.learner.warm_start

rewrites that file (atomically) and prints its SHA-256; put it in ``EMBEDDED_SHA256`` and in
tests/learner/test_tiny_model.py, regenerate the golden numbers that start from the model
(tests/learner/test_grpo_golden.py says how), and say why in the commit: every node's
fingerprint changes with it. The shipped file was made on 2026-11-27 with torch 2.13.0 (CPU)
and transformers 5.23.0.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from node.learner.tiny_model import (WEIGHTS_FILE, build_tokenizer, embedded_config,
                                     shipped_weights_path)
from protocol import atomic_write_bytes

__all__ = ["EMBEDDED_SEED", "WARM_START", "main", "warm_start", "warm_started_weights"]

EMBEDDED_SEED = 1234
"""Seed of the deterministic init."""
WARM_START: dict[str, object] = {"steps": 40, "batch": 64, "lr": 3e-3, "lengths": (3, 4, 5),
                                 "seed": "embedded-warm-start"}
"""The supervised warm start: ``steps`` AdamW steps of ``batch`` sorted-letter examples, the
length of each drawn from ``lengths``."""


def warm_started_weights(recipe: dict[str, object] | None = None) -> bytes:
    """The embedded model initialised from ``EMBEDDED_SEED`` and warm-started (``WARM_START``
    updated by ``recipe``), as the bytes of its ``save_pretrained`` safetensors file. The
    caller's RNG state and thread count are left as they were."""
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EMBEDDED_SEED)
        model = LlamaForCausalLM(embedded_config()).to(torch.float32)
        warm_start(model, tokenizer, recipe)
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        return (Path(tmp) / WEIGHTS_FILE).read_bytes()


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


def main(argv: list[str] | None = None) -> None:
    """``python -m node.learner.warm_start [--out PATH]``: remake the shipped weights."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=shipped_weights_path(),
                    help="where to write the weights (default: the package's shipped file)")
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's one-shard bar
    data = warm_started_weights()
    atomic_write_bytes(args.out, data)
    sys.stdout.write(f"{args.out}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}\n")


if __name__ == "__main__":
    main()
