"""Import a set of our modules in this (fresh) interpreter and report, as one JSON line, what
they pulled in: run by tests/test_layering.py and tests/test_exports.py, never imported by them.

    python tests/import_probe.py FORBIDDEN MODULE [MODULE ...]

FORBIDDEN is a comma-separated list of top-level package names (``torch,trio``). The answer:

    {"failed": {module: error}, "forbidden": {name: "file:line in module"},
     "exports": {module: [problem, ...]}}

``forbidden`` names, for each forbidden package that got imported, the first line of our code
whose import loaded it (a meta-path hook sees each import before the real finders do) and the
module we were importing at the time. ``exports`` lists, for each module with ``__all__``,
names it lists but does not have, duplicates and non-strings.
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Watch(importlib.abc.MetaPathFinder):
    """Records who imports a forbidden package first; finds nothing itself."""

    def __init__(self, forbidden: set[str]) -> None:
        self.forbidden = forbidden
        self.current = ""
        self.seen: dict[str, str] = {}

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's protocol)
        top = name.partition(".")[0]
        if top in self.forbidden and top not in self.seen:
            ours = [f for f in traceback.extract_stack()[:-1]
                    if f.filename.startswith(ROOT) and not f.filename.endswith("import_probe.py")]
            where = (f"{os.path.relpath(ours[-1].filename, ROOT)}:{ours[-1].lineno}"
                     if ours else "?")
            self.seen[top] = f"{where} (importing {self.current})"
        return None


def _export_problems(module: object) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        return []
    problems = [f"not a string: {n!r}" for n in names if not isinstance(n, str)]
    problems += [f"listed twice: {n}" for n in sorted({n for n in names if list(names).count(n) > 1})]
    problems += [f"listed but missing: {n}" for n in names
                 if isinstance(n, str) and not hasattr(module, n)]
    return problems


def main(argv: list[str]) -> None:
    forbidden, modules = set(filter(None, argv[0].split(","))), argv[1:]
    watch = _Watch(forbidden)
    sys.meta_path.insert(0, watch)
    # anything already loaded by interpreter start-up (site) is reported too
    for top in forbidden & {m.partition(".")[0] for m in sys.modules}:
        watch.seen[top] = "? (loaded before the first import)"
    out: dict[str, dict] = {"failed": {}, "forbidden": watch.seen, "exports": {}}
    for name in modules:
        watch.current = name
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (reported, and the test fails on it)
            out["failed"][name] = f"{type(e).__name__}: {e}"
            continue
        problems = _export_problems(module)
        if problems:
            out["exports"][name] = problems
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
