"""mypy over the packages, as configured in pyproject.toml ([tool.mypy]: what it checks, what it
reads as Any, the known exceptions and why). Part of ``make test``: a type error fails the suite.

Cold (no .mypy_cache): ~14 s of CPU, 17 s wall on 2 cores (34-39 s wall while another job
loaded both); with the cache an earlier run left, ~3 s of CPU. Reading libp2p as Any too
would halve the cold run (~8 s of CPU) but stop checking the swarm against libp2p's API.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version

from tests.layering import ROOT


def test_mypy_finds_no_type_error():
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"no issues found in \d{3} source files", run.stdout), run.stdout


def test_the_mypy_that_runs_is_the_one_pinned():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = next(d for d in extra["test"] if d.startswith("mypy=="))
    assert pin == f"mypy=={version('mypy')}"
