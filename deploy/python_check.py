"""Refuse a Python the pins were not tested on, with a message that says what to do.

Run by `make` (and `make pins`) before it creates a venv; stdlib only, so any python3 runs it.
deploy/constraints.txt is a `pip freeze` of a venv on these versions: on another minor
version some pins have no wheel, or a wheel nobody ran the suite with.
"""

from __future__ import annotations

import os
import sys

TESTED = ("3.11",)
"""Minor versions CI runs the whole suite on; pyproject.toml's requires-python says the same."""
OVERRIDE = "SWARM_NODE_UNTESTED_PYTHON"


def main() -> int:
    have = "%d.%d" % sys.version_info[:2]
    if have in TESTED:
        return 0
    if os.environ.get(OVERRIDE) == "1":
        print(f"python_check: Python {have} is untested (tested: {', '.join(TESTED)}); "
              f"going on because {OVERRIDE}=1", file=sys.stderr)
        return 0
    print(f"python_check: {sys.executable} is Python {have}; swarm-node is tested on Python "
          f"{' and '.join(TESTED)} only (deploy/constraints.txt pins what passed there).\n"
          f"  Use one of those: make PY=python{TESTED[-1]} ...  (or a venv made with it),\n"
          f"  or set {OVERRIDE}=1 to try {have} anyway (unsupported: pins may lack wheels).",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
