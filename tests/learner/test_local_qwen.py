"""The locally built Qwen2-architecture model loads like a hub Qwen checkout."""

from __future__ import annotations

from pathlib import Path

import torch

from node.learner.config import PolicyConfig
from node.learner.local_qwen import QWEN_SPECIAL_TOKENS, QWEN_VOCAB_SIZE
from node.learner.policy import load_policy


def test_loads_through_load_policy_like_a_hub_qwen(local_qwen: Path, tmp_path: Path) -> None:
    policy = load_policy(PolicyConfig(model=str(local_qwen), device="cpu"), tmp_path)
    model, tok = policy.model, policy.tokenizer
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == QWEN_VOCAB_SIZE
    assert len(tok) < QWEN_VOCAB_SIZE  # learned vocabulary is small, embedding rows are Qwen's
    endoftext, im_start, im_end = tok.convert_tokens_to_ids(list(QWEN_SPECIAL_TOKENS))
    assert (endoftext, im_start, im_end) == (len(tok) - 3, len(tok) - 2, len(tok) - 1)
    assert tok.eos_token_id == im_end and tok.pad_token_id == endoftext
    assert tok.padding_side == "left"


def test_byte_level_bpe_and_chat_template(local_qwen: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(local_qwen)
    text = "Sort 'zebra' → aberz; 12 + 30 = 42 ✓\n\tdone"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # byte-level: any text round-trips
    assert len(ids) < len(text.encode())  # merges were learned
    assert tok.encode("12", add_special_tokens=False) == tok.encode("1", add_special_tokens=False) + \
        tok.encode("2", add_special_tokens=False)  # Qwen splits digits
    prompt = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is 3 + 4?"}],
                                     tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 3 + 4?"
                      "<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt, add_special_tokens=False)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # specials stay one token


def test_warm_start_puts_mass_on_learned_tokens(local_qwen: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(local_qwen)
    model = AutoModelForCausalLM.from_pretrained(local_qwen)
    batch = tok(["<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"], return_tensors="pt")
    with torch.no_grad():
        probs = model(**batch).logits[0].float().softmax(-1)
    assert probs[:, :len(tok)].sum(-1).mean() > 0.5  # uniform would be < 0.01
