"""The network a feed source sits in, so that one network cannot hold most feed slots.

Keys are free, addresses are not: a farm of 50 identities on one machine (or one rented
/24) is 50 keys but one network. ``swarm.feeds`` prefers sources from networks that hold
fewer than ``feeds.max_per_network`` of its slots (issue 32). A network here is:

- for a direct connection, the remote address's ``/feeds.network_prefix_v4`` (IPv6:
  ``/feeds.network_prefix_v6``). It is the address of the TCP connection the feed runs on:
  the address we dialed (the handshake proved the key is there) or the one the peer
  connected from, never an address a peer merely announced;
- for a relayed connection (``p2p-circuit``), the relay's network: the relay is where the
  bytes come from, and a farm that runs its own relays is grouped by them;
- ``None`` (no network: never capped) for loopback, unless ``feeds.loopback_networks``:
  every node of a one-machine swarm shares 127.0.0.1, and capping them would only cut a
  local swarm's feeds. Tests that want networks on one machine listen on distinct 127/8
  addresses and dial out, with ``loopback_networks`` on.

A candidate we never connected to is placed by the addresses it announces (any of them in
a network that is not full lets it be picked); once its feed opens, the connection's own
address decides, and a source whose real network was full is closed again at once
(``feed_network_full``) while candidates from other networks remain.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import multiaddr
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

__all__ = ["UNKNOWN", "Networks"]

UNKNOWN = "unknown"
"""The network of a connection whose address cannot be read: all such share one network."""


@dataclass(frozen=True, kw_only=True)
class Networks:
    """How addresses map to networks (``FeedsConfig``'s ``network_prefix_v4`` / ``_v6`` and
    ``loopback_networks``)."""

    prefix_v4: int = 24
    prefix_v6: int = 48
    loopback: bool = False

    def of_ip(self, ip: str) -> str | None:
        """The network of address ``ip``: None for loopback (unless ``loopback``), UNKNOWN
        if it does not parse."""
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return UNKNOWN
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if addr.is_loopback and not self.loopback:
            return None
        prefix = self.prefix_v4 if isinstance(addr, ipaddress.IPv4Address) else self.prefix_v6
        return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))

    def of_addr(self, addr: multiaddr.Multiaddr | str) -> str | None:
        """The network of a multiaddr as announced or as a connection's transport address:
        its first IP (a circuit's: the relay's); UNKNOWN without one (a DNS name, a circuit
        through a relay named by its key only)."""
        text = str(addr)
        parts = text.split("/")
        for i, part in enumerate(parts[:-1]):
            if part in ("ip4", "ip6"):
                return self.of_ip(parts[i + 1])
        return UNKNOWN

    def of_stream(self, stream: INetStream, host: IHost) -> str | None:
        """The network of the connection ``stream`` runs on (module docstring); a relayed
        one's is that of our direct connection to its relay."""
        addrs = _transport_addrs(stream.muxed_conn)
        circuit = next((str(a) for a in addrs if "/p2p-circuit" in str(a)), None)
        if circuit is None:
            return self._of_direct(stream, addrs)
        relay = _relay_of(circuit)
        if relay is None:
            return UNKNOWN
        for conn in host.get_network().get_connections(relay):
            direct = _transport_addrs(conn.muxed_conn)
            if direct and not any("/p2p-circuit" in str(a) for a in direct):
                return self.of_addr(direct[0])
        return f"relay {relay}"  # not connected to it (any more): grouped by its key

    def _of_direct(self, stream: INetStream, addrs: list[multiaddr.Multiaddr]) -> str | None:
        try:
            remote = stream.get_remote_address()
        except Exception:  # noqa: BLE001
            remote = None
        if remote:
            return self.of_ip(remote[0])
        return self.of_addr(addrs[0]) if addrs else UNKNOWN


def _transport_addrs(conn: object) -> list[multiaddr.Multiaddr]:
    try:
        return list(conn.get_transport_addresses())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a connection type without it
        return []


def _relay_of(circuit: str) -> ID | None:
    """The relay's key in ``.../p2p/<relay>/p2p-circuit/p2p/<peer>``."""
    head = circuit.split("/p2p-circuit")[0].split("/")
    try:
        return ID.from_base58(head[head.index("p2p") + 1]) if "p2p" in head else None
    except Exception:  # noqa: BLE001
        return None
