"""The vLLM backend (``EngineConfig.backend = "vllm"``): fast sampling on the policy's GPU.

Install with ``pip install 'swarm-node[vllm]'``; it needs a CUDA GPU. ``vllm`` is imported
only when this engine is built, so nothing else in the node depends on it.

How it fits the learner
-----------------------
- **One process, one GPU, two copies of the weights.** vLLM loads its own copy of the model
  from the policy's ``source`` (a hub id or a local path) and takes
  ``EngineConfig.gpu_memory_utilization`` of the GPU for it and its KV cache; the trainer
  keeps its ``transformers`` model for the gradient step. The engine core runs in this
  process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a weight push hands vLLM the
  trainer's tensors by reference, with no serialisation.
- **Weights pushed, never reloaded.** ``sync_weights`` runs ``model.load_weights`` on vLLM's
  model with the policy's ``named_parameters`` (through ``LLM.apply_model``; vLLM maps
  Hugging Face names itself and copies each tensor into its own layout, casting the dtype).
  The learner calls it once after the engine is built (a resumed checkpoint), after every
  optimizer step and after every outer step, so sampling always uses the current policy.
- **Same interface and seeding as ``transformers``.** ``generate(prompts, n=, seed=)``
  returns ``n`` ``Completion`` per prompt; each prompt's request gets its own seed derived
  from ``seed`` and its position, so a call is reproducible for a given ``seed`` (the two
  backends do not sample the same tokens for one seed: their samplers differ). Prefix caching
  is off: cached KV blocks would outlive a weight push. Stop strings
  are kept in the text, as the ``transformers`` engine keeps them; the token count includes
  the end-of-sequence token when one ended the completion.

Tested without vLLM: ``tests/learner/test_engine_vllm.py`` checks the selection, the error
messages, and (against a stand-in ``LLM`` labelled as such) the calls this module makes. It
has not been run against a real vLLM in this repository's CI (no GPU there).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from typing import Any

import torch

from node.learner.config import EngineConfig
from node.learner.engine import Completion, end_of_sequence_ids
from node.learner.errors import EngineError

__all__ = ["VllmEngine", "check_available"]

log = logging.getLogger(__name__)
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def check_available() -> None:
    """``EngineError`` naming what is missing unless vllm is installed and CUDA is usable."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError("engine backend 'vllm' needs the vllm package: "
                          "pip install 'swarm-node[vllm]' (or set [learner.engine] "
                          "backend = \"transformers\")")
    if not torch.cuda.is_available():
        raise EngineError("engine backend 'vllm' needs a CUDA GPU and torch built with CUDA "
                          f"(torch {torch.__version__} sees none); use backend = \"transformers\"")


def _request_seed(seed: int, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


class VllmEngine:
    """Sampling with ``vllm.LLM``; weights pushed from the policy by ``sync_weights``."""

    def __init__(self, config: EngineConfig, model: Any, tokenizer: Any, *,
                 source: str | None = None) -> None:
        check_available()
        if not source:
            raise EngineError("engine backend 'vllm' needs the policy's source (hub id or path)")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in-process
        import vllm

        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self._vllm = vllm
        self._eos_ids = set(end_of_sequence_ids(model, tokenizer))
        dtype = _DTYPES.get(next(model.parameters()).dtype, "auto")
        self.llm = vllm.LLM(model=source, tokenizer=source, dtype=dtype,
                            gpu_memory_utilization=config.gpu_memory_utilization,
                            seed=0, enable_prefix_caching=False)
        self.pushes = 0
        """Weight pushes so far."""
        self.sync_weights()

    def sync_weights(self) -> None:
        """Copy the policy's current parameters into vLLM's model (in place, no restart)."""
        weights = [(name, p.detach()) for name, p in self.model.named_parameters()]

        def load(vllm_model: Any) -> int:
            loaded = vllm_model.load_weights(weights)
            return len(loaded) if loaded is not None else len(weights)

        counts = self.llm.apply_model(load)
        self.pushes += 1
        log.debug("pushed %d tensors to vLLM (%s)", len(weights), counts)

    def generate(self, prompts: list[str], *, n: int, seed: int,
                 greedy: bool = False) -> list[list[Completion]]:
        if n < 1 or not prompts:
            raise EngineError(f"need n >= 1 and at least one prompt (n={n}, {len(prompts)} prompts)")
        cfg = self.config
        params = [self._vllm.SamplingParams(
            n=n, temperature=0.0 if greedy else cfg.temperature,
            top_p=1.0 if greedy else cfg.top_p, max_tokens=cfg.max_new_tokens,
            stop=list(cfg.stop or ()), include_stop_str_in_output=True,
            seed=_request_seed(seed, i)) for i in range(len(prompts))]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results: list[list[Completion]] = []
        for out in outputs:
            group = [Completion(text=o.text, token_count=len(o.token_ids)) for o in out.outputs]
            if len(group) != n:
                raise EngineError(f"vLLM returned {len(group)} completions for a prompt, not {n}")
            results.append(group)
        if len(results) != len(prompts):
            raise EngineError(f"vLLM answered {len(results)} of {len(prompts)} prompts")
        return results
