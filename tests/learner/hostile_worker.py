"""A verifier worker with injected faults, for tests of ``node.learner.verifier``.

Runs the real ``verifier_worker`` (same limits, same protocol) but misbehaves on items whose
prompt names a ``Fault``; other items are scored for real.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from typing import Any

from node.learner import verifier_worker


class Fault(str, enum.Enum):
    SLOW = "SLOW"          # sleeps past any wall-clock budget
    SPIN = "SPIN"          # burns CPU until RLIMIT_CPU kills the worker
    CRASH = "CRASH"        # the process dies
    HOG = "HOG"            # allocates past RLIMIT_AS (MemoryError)
    BAD = "BAD"            # replies with an out-of-range reward
    PRINT = "PRINT"        # prints to stdout (must not corrupt the frames), then scores


_real = verifier_worker.score_item


def score_item(item: dict[str, Any]) -> dict[str, Any]:
    fault = item["prompt"]
    if fault == Fault.SLOW:
        time.sleep(120)
    elif fault == Fault.SPIN:
        while True:
            pass
    elif fault == Fault.CRASH:
        os._exit(1)
    elif fault == Fault.HOG:
        return {"rewards": [float(len(bytearray(8 << 30)))]}
    elif fault == Fault.BAD:
        return {"rewards": [5.0] * len(item["completions"])}
    elif fault == Fault.PRINT:
        print("garbage" * 10_000, flush=True)
        return {"rewards": [0.5] * len(item["completions"])}
    return _real(item)


verifier_worker.score_item = score_item

if __name__ == "__main__":
    sys.exit(verifier_worker.main())
