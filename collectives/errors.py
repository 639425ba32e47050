"""Exceptions of the collectives package.

::

    CollectiveError                 – base; nothing else escapes OuterLoop's public methods
     ├── TransportError             – p2pd / DHT could not start, or died and could not restart
     ├── StartCancelled             – the start was abandoned (its ``abort`` event set); what it
     │                                had started is closed
     ├── StepFailed                 – an outer step could not complete (group, all-reduce, deadline)
     └── SyncError                  – the canonical state could not be fetched or did not verify
"""

from __future__ import annotations

__all__ = ["CollectiveError", "TransportError", "StartCancelled", "StepFailed", "SyncError"]


class CollectiveError(Exception):
    """Base of all collectives errors."""


class TransportError(CollectiveError):
    """The hivemind transport (p2pd, DHT) is unusable."""


class StartCancelled(CollectiveError):
    """The transport's start was abandoned (the node is leaving); nothing it started runs."""


class StepFailed(CollectiveError):
    """An outer step attempt did not complete; the node keeps training locally and retries."""


class SyncError(CollectiveError):
    """Fetching or verifying the canonical outer state failed."""
