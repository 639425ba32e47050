"""Imports point the way DESIGN.md says (the rules and their reasons: tests/layering.py).

Two checks per side of the tree: every module imported in a fresh interpreter loads none of
the side's forbidden packages (what a process of that side really holds, transitive imports
included), and no import statement in its source names one, lazy imports inside functions
included (those the first check cannot see until the function runs). The second has a short
list of explicit exceptions, each with its reason.
"""

from __future__ import annotations

import ast

import pytest

from tests.layering import CONFIG_MODULES, ROOT, SIDES, STACKS, probe, probe_side

EXCEPTIONS = {
    ("node/doctor.py", "torch"): "`swarm-node doctor` reports torch's version and device, in "
                                 "its own process (a command, not the supervisor)",
    ("node/export.py", "torch"): "`swarm-node export` loads a checkpoint into a model, in its "
                                 "own process (a command, not the supervisor)",
    ("node/export.py", "transformers"): "the same export command",
    ("node/evaluate.py", "transformers"): "`swarm-node eval` loads an exported model, in its "
                                          "own process (a command, not the supervisor)",
}
"""(file, package) -> why that file may import the package inside a function."""


@pytest.mark.parametrize("side", sorted(SIDES))
def test_a_fresh_interpreter_importing_a_side_loads_nothing_it_must_not(side):
    result = probe_side(side)
    assert not result.failed, f"{side}: modules that do not import: {result.failed}"
    assert not result.forbidden, (
        f"{side} must not import {sorted(SIDES[side].forbidden)}; loaded: "
        + "; ".join(f"{pkg} by {where}" for pkg, where in sorted(result.forbidden.items())))


@pytest.mark.parametrize("module", CONFIG_MODULES)
def test_a_config_module_imports_without_either_stack(module):
    result = probe((module,), frozenset(STACKS))
    assert not result.failed, result.failed
    assert not result.forbidden, (
        f"the supervisor checks its tables with {module}, which loaded: "
        + "; ".join(f"{pkg} by {where}" for pkg, where in sorted(result.forbidden.items())))


def _imports(path):
    """(line, top-level package) of every absolute import in the file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.partition(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.partition(".")[0]


@pytest.mark.parametrize("side", sorted(SIDES))
def test_no_import_statement_names_a_forbidden_package(side):
    found = []
    for module in SIDES[side].modules:
        path = ROOT.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line} imports {top}" for line, top in _imports(path)
                  if top in SIDES[side].forbidden and (rel, top) not in EXCEPTIONS]
    assert not found, f"{side} must not import {sorted(SIDES[side].forbidden)}: {found}"


def test_every_exception_is_still_needed():
    imported = {(f, top) for f, _ in EXCEPTIONS for _, top in _imports(ROOT / f)}
    assert set(EXCEPTIONS) <= imported, set(EXCEPTIONS) - imported


def test_the_sides_cover_every_module_once():
    everywhere = [m for s in SIDES.values() for m in s.modules]
    assert len(everywhere) == len(set(everywhere))
    on_disk = {p.relative_to(ROOT).with_suffix("").as_posix().removesuffix("/__init__")
               .replace("/", ".") for pkg in ("protocol", "swarm", "collectives", "node")
               for p in (ROOT / pkg).rglob("*.py") if p.stem != "__main__"}
    assert set(everywhere) == on_disk
