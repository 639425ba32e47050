"""The hivemind names collectives uses, imported once with its import-time noise silenced.

Importing hivemind runs ``torch.jit.script`` in ``hivemind.moe``, which torch 2.13 reports as
a DeprecationWarning; with ``-W error`` (our test suite) that would make the import fail.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="hivemind")
    from hivemind.dht import DHT
    from hivemind.p2p import P2P, PeerID
    from hivemind.utils.timed_storage import get_dht_time

__all__ = ["DHT", "P2P", "PeerID", "get_dht_time"]
