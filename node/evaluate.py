"""`swarm-node eval`: the held-out score of a node's newest checkpoint or an exported model.

The same evaluation as the learner's every ``eval_every`` rounds (``node.learner.heldout``):
the fixed held-out set of the task families, one greedy and ``samples`` sampled completions
per question through the transformers engine, scored by the families' own verifiers. The
families (and their config) come from the checkpoint's provenance, or an export's
``provenance.json``; ``families`` overrides them. Imports torch only when called.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["EvalError", "evaluate"]

log = logging.getLogger(__name__)


class EvalError(Exception):
    """The evaluation cannot run; the message is one line that says why."""


def evaluate(*, data_dir: str | Path | None = None, model: str | Path | None = None,
             families: tuple[str, ...] = (), questions: int = 32, samples: int = 1,
             device: str = "cpu", temperature: float = 1.0) -> dict[str, Any]:
    """The held-out score (``HeldoutScore.to_record``) of ``model`` (an exported model dir)
    or else of the newest checkpoint in ``data_dir``, with ``source`` and ``rounds``."""
    from node.export import ExportError, load_checkpoint_policy
    from node.learner.config import EngineConfig, TaskConfig
    from node.learner.engine import make_engine
    from node.learner.heldout import Evaluator
    from node.learner.policy import prepare_tokenizer, resolve_device
    from node.learner.prompting import make_prompt_format, resolve_engine
    from protocol.tables import TableError

    try:
        if model is not None:
            net, tokenizer, prov = _load_exported(Path(model))
            source = str(model)
        elif data_dir is not None:
            net, tokenizer, prov = load_checkpoint_policy(data_dir)
            source = f"{data_dir} ({prov['checkpoint']})"
        else:
            raise EvalError("give --data-dir or --model")
    except ExportError as e:
        raise EvalError(str(e)) from None
    try:
        tasks = TaskConfig(families=tuple(families or prov.get("task_families") or ("letter_sort",)),
                           family_config=dict(prov.get("family_config") or {}))
    except TableError as e:
        raise EvalError(f"task families: {e.reason}") from None
    prepare_tokenizer(tokenizer)
    net.to(resolve_device(device))
    prompts = make_prompt_format("auto", tokenizer)
    engine_config = resolve_engine(EngineConfig(temperature=temperature), model=net,
                                   embedded=prov.get("base_model") == "embedded",
                                   prompt_format=prompts, completion_cap=256)
    engine = make_engine(engine_config, net, tokenizer)
    score = Evaluator(tasks=tasks, engine=engine, prompts=prompts, questions=questions,
                      samples=samples).run()
    return score.to_record(source=source, rounds=prov.get("rounds"),
                           families=list(tasks.families))


def _load_exported(path: Path) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from node.export import PROVENANCE_NAME

    if not path.is_dir():
        raise EvalError(f"{path} is not a model directory (make one with `swarm-node export`)")
    hf_logging.disable_progress_bar()
    try:
        prov = json.loads((path / PROVENANCE_NAME).read_text())
    except FileNotFoundError:
        prov = {}  # a model not exported by us: the families must be given
    except (OSError, ValueError) as e:
        raise EvalError(f"{path / PROVENANCE_NAME} is unreadable ({e})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        net = AutoModelForCausalLM.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise EvalError(f"cannot load {path}: {str(e).splitlines()[0]}") from None
    return net.eval(), tokenizer, prov
