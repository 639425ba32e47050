"""Keep the interpreter's full garbage collections off an outer step's critical path.

A node process holds ~200k GC-tracked objects (torch, hivemind, numpy); a generation-2
collection walks all of them with the GIL held: 0.12-0.29 s measured in a bench peer, during
which the event loop moves no bytes and both peers' links idle (100M values, 2 peers: one
at the very start of an exchange on both peers, 0.26 and 0.29 s). ``gc.freeze()`` moves the
objects that exist when the attempt starts into the permanent generation, so a collection
that the step's own allocations trigger walks only what the step created; ``gc.unfreeze()``
hands them back when the attempt ends, so cyclic garbage among them is still collected
later (by a collection during the inner rounds). Process-wide, as the GC is; nesting or a
concurrent caller only loses the effect early, never collects less.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["young_collections_only"]


@contextmanager
def young_collections_only() -> Iterator[None]:
    """While inside, collections skip the objects that existed on entry."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
