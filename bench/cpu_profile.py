"""Run a module under cProfile with a CPU clock (``-m cProfile`` times wall-clock, which on a
loaded machine measures the scheduler, not the code).

    python -m bench.cpu_profile OUT.prof -m swarm --config-json ...
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit("usage: python -m bench.cpu_profile OUT.prof -m MODULE [ARGS...]")
    out, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        prof.disable()
        prof.dump_stats(out)


if __name__ == "__main__":
    main()
