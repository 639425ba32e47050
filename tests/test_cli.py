from __future__ import annotations

import subprocess
import sys


def test_help_lists_the_contract_commands():
    out = subprocess.run([sys.executable, "-m", "node", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for cmd in ("join", "bootstrap", "local", "identity"):
        assert cmd in out
