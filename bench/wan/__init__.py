"""WAN test bed: hosts in network namespaces with delay, jitter, rate limits and NAT.

Needs root, iproute2 (``ip``, ``tc``), ``/dev/net/tun``, and ``iptables`` for NAT;
:func:`missing` names what is absent with the command that fixes it. ``netem`` is not
needed (this kernel has none): delay comes from a user-space router on TUN devices
(bench/wan/router.py), rate from ``tbf``, NAT from iptables MASQUERADE in a gateway
namespace per NATed host (and, in the ``upnp`` mode, Debian's miniupnpd in it:
:func:`ensure_miniupnpd`; such a bed needs a public-looking ``subnet="11.213"``).

Python API (stable; used by tests/wan and the NAT tests)::

    from bench.wan import WanBed, hosts, HostSpec, missing, BedUnavailable

    specs = hosts(["boot", "pub", "nat1", "nat2"], rtt_ms=80, rate_mbit=50,
                  nat=["nat1", "nat2"],              # or [HostSpec(name=..., ...), ...]
                  nat_mode="home")                   # NAT_MODES: masquerade|home|symmetric|upnp
    with WanBed(specs) as bed:                       # raises BedUnavailable if not root etc.
        bed.addr("pub")          # '10.213.0.2'  the host's own address: bind/listen here
        bed.addr("nat1")         # '192.168.2.2' private, behind its gateway
        bed.public_addr("nat1")  # '10.213.0.3'  what the others see (the gateway)
        p = bed.run_in("pub", [sys.executable, "-m", "node", ...], stdout=...)  # a Popen
        bed.prefix("pub")        # ['ip', 'netns', 'exec', 'swnw<tag>-pub'] for harnesses
        bed.ns("pub"), bed.rtt_ms("pub", "nat1"), bed.describe()
        bed.router_stats()       # forwarded, bytes, drops, max_queue, tcp_simultaneous_open
        bed.router_pid
    # on exit: every run_in process, everything else inside the namespaces, the router
    # and the namespaces are gone.

Model: host ``h`` has a one-way ``delay_ms`` added to every packet it sends and receives,
so RTT(a, b) = 2 * (delay_a + delay_b); :func:`hosts` sets delay = rtt_ms / 4 so any two
see ``rtt_ms``. ``jitter_ms`` widens each packet's delay uniformly without reordering a
flow. ``rate_mbit`` is the upload limit (tbf on egress). A NATed host dials out to any
public address (the far end sees the gateway's address); nothing can dial in to it.
Hosts reach each other only through the bed (no route to the machine's network).

Names: namespaces ``swnw<tag>-<host>``, ``swnw<tag>-_core`` (router),
``swnw<tag>-_gw-<host>`` (NAT); interfaces ``swnw*`` inside them; nothing in the root
namespace. ``tag`` defaults to one unique per process. State: /tmp/swnwan/<tag>.json.

CLI::

    python -m bench.wan up [--tag cli] [--hosts 4 | --names a,b,c] [--rtt-ms 80]
                           [--jitter-ms 0] [--rate-mbit 50] [--nat c] [--mtu 1500]
                           [--install]   # apt-get install iptables if NAT needs it
    python -m bench.wan status
    python -m bench.wan down [--tag cli | --stale | --all]
"""

from __future__ import annotations

from .bed import NAT_MODES, BedError, HostSpec, NatMode, WanBed, down, hosts, instances, stale
from .checks import BedUnavailable, ensure_iptables, ensure_miniupnpd, missing, require

__all__ = ["NAT_MODES", "BedError", "BedUnavailable", "HostSpec", "NatMode", "WanBed", "down",
           "ensure_iptables", "ensure_miniupnpd", "hosts", "instances", "missing", "require",
           "stale"]
