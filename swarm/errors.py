"""The swarm package's exception tree (what ends a swarm process with a clear message)::

    SwarmError                 – base: a condition the user can act on
     ├── ConfigError           – a bad multiaddr or setting (exit status 2)
     ├── ListenError           – cannot listen (port in use, address not available)
     └── BootstrapError        – no bootstrap peer reachable in peers.bootstrap_timeout_s

Rejected network input is never raised out of the service: it is counted (``Rejected``
in swarm.validation) and logged.
"""

from __future__ import annotations

__all__ = ["BootstrapError", "ConfigError", "ListenError", "SwarmError"]


class SwarmError(Exception):
    exit_code = 1


class ConfigError(SwarmError):
    exit_code = 2


class ListenError(SwarmError):
    exit_code = 3


class BootstrapError(SwarmError):
    exit_code = 4
