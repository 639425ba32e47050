"""``make test``: the whole suite as two pytest sessions at once, one per lane.

    python -m tests.lanes [pytest args...]

The ``swarms`` lane (the CPU-heavy multi-process tests: nodes, attackers, the WAN bed, the
image) runs in the foreground, its progress on the terminal; the ``rest`` lane (unit and
in-process tests, and the collectives' multi-process tests, which mostly wait on their
clocks) runs beside it, into ``rest-lane.log`` in a temp dir, printed whole when it ends.
On 2 cores one session alone leaves a core idle for a third of the run; the lanes together
take about the longer lane's time. Plain ``pytest`` still runs everything in one session.
Exit status: 0 only if both lanes pass (else the first non-zero of swarms, rest).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    start = time.monotonic()
    log = Path(tempfile.mkdtemp(prefix="swarm-node-lanes-")) / "rest-lane.log"
    pytest = [sys.executable, "-m", "pytest"]
    print(f"lane 'rest' runs beside this one; its output: {log}", flush=True)
    with open(log, "wb") as out:
        rest = subprocess.Popen([*pytest, "--lane", "rest", *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            swarms_rc = subprocess.run([*pytest, "--lane", "swarms", *argv]).returncode
            swarms_s = time.monotonic() - start
            if rest.poll() is None:
                print("lane 'swarms' done; waiting for lane 'rest'", flush=True)
            rest_rc = rest.wait()
        finally:
            if rest.poll() is None:
                rest.terminate()
                rest.wait()
    print(f"\n===== lane 'rest' ({log}) =====", flush=True)
    sys.stdout.buffer.write(log.read_bytes())
    print(f"\nlanes: swarms exit {swarms_rc} after {swarms_s:.0f} s, rest exit {rest_rc}; "
          f"{time.monotonic() - start:.0f} s in all", flush=True)
    return swarms_rc or rest_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
