"""Only vetted verifiers: unvetted families refused, hostile answers never evaluated."""

from __future__ import annotations

import inspect
import io
import random
import re
import time
import tokenize
from pathlib import Path

import pytest

from node.learner.config import TaskConfig
from node.learner.errors import TaskError
from node.learner.tasks import FAMILIES, build_task, get_family, vetted_families
from node.learner.tasks.rgym import VETTED
from node.learner.tasks import scorers
from node.learner.tasks.scorers import SAFE_SCORERS

_EVALUATING = re.compile(r"(?<![\w.])\s*(eval|exec|compile|__import__)\s*\(|literal_eval|sympify"
                         r"|\bsympy\b|importlib|subprocess|\bos\s*\.\s*(system|popen|exec)")


def _code_only(source: str) -> str:
    """``source`` without comments and string literals (docstrings may name what they avoid)."""
    tokens = [(t.type, '""' if t.type == tokenize.STRING else t.string)
              for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type != tokenize.COMMENT]
    return tokenize.untokenize(tokens)


def _payloads(marker: Path) -> list[str]:
    touch = f"__import__('os').system('touch {marker}')"
    return [
        touch, f"[[{touch}]]", f"[{touch}]", f"({touch})",
        f"exec(\"open('{marker}', 'w')\")",
        f"[[0]] if __import__('pathlib').Path('{marker}').touch() else [[0]]",
        f"(lambda: __import__('os').system('touch {marker}'))()",
        "Symbol('x').__class__.__mro__[-1].__subclasses__()",                 # sympy-style
        f"Function('f')(__import__('os').system('touch {marker}'))",
        "9**9**9", "10**10**10**10", "1e999999999", "-1e-999999999", "9" * 5000,
        "1/" + "9" * 5000, "\\frac{" + "9" * 4000 + "}{3}",
        "(" * 900 + "P" + ")" * 900, "¬" * 3000 + "P", "P ∧ " * 1000 + "P", "¬" * 159 + "P",
        "[" * 900 + "]" * 900, "[[" + ",".join(["1"] * 5000) + "]]", "\x00\udcff", "",
    ]


@pytest.mark.parametrize("family", vetted_families())
def test_hostile_answers_are_never_evaluated_and_score_fast(family, tmp_path):
    marker = tmp_path / "MARKER"
    fam = get_family(family)
    task = build_task(fam.sample_spec(random.Random(7), {}))
    if task.answer != "None":  # propositional_logic has no single oracle answer
        assert task.score(task.answer) > 0.0 or family == "tiny_add"
    for text in _payloads(marker):
        cpu = time.process_time()  # CPU, not wall time: the test machine is shared
        reward = task.score(text)
        assert time.process_time() - cpu < 0.5, (family, text[:40])
        assert 0.0 <= reward <= 1.0, (family, text[:40], reward)
    assert not marker.exists()


@pytest.mark.parametrize("family", sorted(VETTED))
def test_scoring_source_evaluates_nothing(family):
    """Scan the module of the scoring code (the dataset's ``score_answer`` class, or our own
    scorer) for anything that evaluates or imports text or starts programs."""
    from reasoning_gym.factory import DATASETS

    modules = [inspect.getmodule(DATASETS[family][0].score_answer)]
    if family in SAFE_SCORERS:
        modules.append(scorers)
        if family == "binary_matrix":  # upstream's eval() is replaced, not wrapped
            modules = [scorers]
    for module in modules:
        source = _code_only(inspect.getsource(module))
        hits = {m.group(0) for m in _EVALUATING.finditer(source)}
        assert not hits, f"{family}: {module.__name__} contains {hits}"
        if "parse_expr" in source:  # propositional_logic has its own string parser of that name
            assert module.parse_expr.__module__ == module.__name__


def test_scan_catches_what_the_issue_found():
    from reasoning_gym.factory import DATASETS

    for family in ("binary_matrix", "spiral_matrix", "countdown"):
        source = _code_only(inspect.getsource(inspect.getmodule(DATASETS[family][0].score_answer)))
        assert _EVALUATING.search(source), family


@pytest.mark.parametrize("family", ["spiral_matrix", "string_insertion", "n_queens", "countdown",
                                    "puzzle24", "polynomial_multiplication", "simple_integration"])
def test_unvetted_families_are_refused_locally_and_remotely(family):
    assert family not in VETTED and family not in FAMILIES
    with pytest.raises(ValueError, match=f"{family}.*not vetted"):
        TaskConfig(families=("tiny_add", family))
    with pytest.raises(TaskError) as e:
        get_family(family)
    assert e.value.reason == "unvetted_family"


def test_unknown_family_is_refused_with_the_known_ones_named():
    with pytest.raises(ValueError, match="no task family 'nope'.*tiny_add"):
        TaskConfig(families=("nope",))


def test_join_refuses_an_unvetted_family_before_starting_anything():
    from node.config import ConfigError, NodeConfig

    with pytest.raises(ConfigError, match="spiral_matrix.*not vetted"):
        NodeConfig(learner={"tasks": {"families": ["tiny_add", "spiral_matrix"]}})
    assert NodeConfig(learner={"tasks": {"families": ["tiny_add", "binary_matrix"]}})
