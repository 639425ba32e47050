"""``__all__`` is each module's public surface (STYLE.md habit 2), and it is true.

Every module that defines ``__all__`` has each name it lists, once (checked on the real
modules, imported side by side in fresh interpreters: tests/layering.py); and what another of
our packages imports from such a module is listed there, so ``__all__`` is the surface the
rest of the tree actually uses, not a wish.
"""

from __future__ import annotations

import ast

import pytest

from tests.layering import ROOT, SIDES, probe_side


@pytest.mark.parametrize("side", sorted(SIDES))
def test_every_name_in_all_exists_once(side):
    result = probe_side(side)
    assert not result.failed, result.failed
    assert not result.exports, result.exports


def _owner(module: str) -> str:
    """The package a module belongs to for this rule (the learner is its own package)."""
    return "node.learner" if module.startswith("node.learner") else module.partition(".")[0]


def test_what_other_packages_import_is_in_all():
    trees = {m: ast.parse(_path(m).read_text()) for s in SIDES.values() for m in s.modules}
    exported = {m: set(ast.literal_eval(n.value)) for m, tree in trees.items() for n in tree.body
                if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)}
    unlisted = [f"{m} imports {a.name} from {n.module}"
                for m, tree in trees.items() for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module in exported
                and _owner(n.module) != _owner(m)
                for a in n.names if a.name not in exported[n.module]]
    assert not unlisted, unlisted
    assert len(exported) > 50  # the check reads the tree's __all__s (87 of 110 modules today)


def _path(module: str):
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
