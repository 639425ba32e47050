"""The import rules of DESIGN.md ("Packages", STYLE.md habit 1) as data, and the probe that
imports a side of the tree in a fresh interpreter (tests/import_probe.py). Shared by
tests/test_layering.py and tests/test_exports.py; each side is probed once per session.

The sides, and why each rule exists:

- ``protocol``: every process imports it, the swarm (libp2p) and the learner (hivemind) alike,
  and those two cannot share a process (both register the protobuf package ``crypto.pb``):
  so neither stack, no torch, no trio, and none of our other packages (it is the bottom layer).
- ``swarm``: the swarm process; trio + py-libp2p, never torch or hivemind; above ``protocol``
  only.
- ``collectives`` and ``learner`` (``node.learner``, ``node.learner_process``): the learner
  process; torch + hivemind, never libp2p or trio, never ``swarm``; ``collectives`` never
  imports ``node`` (``protocol`` <- ``collectives`` <- ``node``).
- ``supervisor`` (the rest of ``node``): imports neither stack, so it can check configs, fork
  and restart children without holding torch, hivemind or libp2p.
- the config modules: the supervisor validates every table with them before a child starts.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "import_probe.py"

STACKS = ("torch", "transformers", "hivemind", "libp2p", "trio")
"""Third-party packages that make a process a swarm or a learner process."""


@dataclass(frozen=True)
class Side:
    """A set of our modules and the top-level packages none of them may import."""

    name: str
    modules: tuple[str, ...]
    forbidden: frozenset[str]


def modules_under(path: str, *, without: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Dotted names of every module in the package at ``path`` (relative to the repo root),
    found on disk (nothing imported), less ``__main__`` and those starting with ``without``."""
    names = []
    for f in sorted((ROOT / path).rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] != "__main__" and not name.startswith(without):
            names.append(name)
    return tuple(names)


LEARNER = ("node.learner", "node.learner_process")

SIDES = {
    s.name: s for s in (
        Side("protocol", modules_under("protocol"),
             frozenset({"torch", "transformers", "hivemind", "libp2p", "trio",
                        "swarm", "collectives", "node"})),
        Side("swarm", modules_under("swarm"),
             frozenset({"torch", "transformers", "hivemind", "collectives", "node"})),
        Side("collectives", modules_under("collectives"),
             frozenset({"libp2p", "trio", "swarm", "node"})),
        Side("learner", modules_under("node/learner") + ("node.learner_process",),
             frozenset({"libp2p", "trio", "swarm"})),
        Side("supervisor", modules_under("node", without=LEARNER), frozenset(STACKS)),
    )
}

CONFIG_MODULES = ("protocol.tables", "swarm.config", "collectives.config", "node.config",
                  "node.tables", "node.learner.config")
"""Each is imported alone, in its own interpreter, and may import none of ``STACKS``."""


@dataclass(frozen=True)
class Probe:
    failed: dict[str, str]
    """module -> the error importing it raised"""
    forbidden: dict[str, str]
    """forbidden package -> 'file:line (importing module)' that loaded it first"""
    exports: dict[str, list[str]]
    """module -> what is wrong with its ``__all__``"""


@functools.lru_cache(maxsize=None)
def probe(modules: tuple[str, ...], forbidden: frozenset[str]) -> Probe:
    """Import ``modules`` in order in a fresh interpreter (``-P``: the probe's own folder,
    tests/, is not on the path, so ``protocol`` is ours and not ``tests/protocol``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-P", str(PROBE), ",".join(sorted(forbidden)), *modules],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return Probe(**json.loads(run.stdout.strip().splitlines()[-1]))


def probe_side(name: str) -> Probe:
    side = SIDES[name]
    return probe(side.modules, side.forbidden)
