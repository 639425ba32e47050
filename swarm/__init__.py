"""The p2p layer of swarm-node on py-libp2p (trio). Never imports torch or hivemind.

Modules, bottom up::

    config       – GossipConfig
    errors       – SwarmError tree (what ends a swarm process)
    topics       – topic names: /swarm-node/<version>/<swarm id>/<type>
    ratelimit    – per-sender token buckets
    validation   – Validator: envelope, sender, rate, replay checks → Rejected(reason)
    inbox        – bounded per-type queues for the learner (drop oldest, counted)
    peers        – PeerTable of signed announcements, with expiry
    host         – host (Noise only, yamux, TCP) + gossipsub with scoring
    discovery    – Dialer: bootstrap with backoff, keep peers.target connections
    reachability – dial-back protocol: can peers dial us? (public / relayed / unreachable)
    clock        – time protocol: a peer's clock offset from ours (doctor's skew check)
    relay        – circuit relay v2: serve as a relay, hold reservations, dial via relays
    upnp         – PortMapper: the router's port mappings (UPnP-IGD), leased and renewed
    nat          – NatManager: reachability checks, relay service and reservations, addrs
    tunnel       – TunnelHub: the collective's TCP to a peer nobody can dial, over libp2p
    ipc_server   – Unix-socket server for node.ipc_client.SocketBridge
    service      – GossipService, serve(), run(): the swarm process
    probe        – one dial to a peer with our host: its swarm ids, reachability and clock
                   offset (swarm-node doctor)
"""

from __future__ import annotations

from swarm.config import GossipConfig
from swarm.errors import BootstrapError, ConfigError, ListenError, SwarmError

__all__ = ["BootstrapError", "ConfigError", "GossipConfig", "ListenError", "SwarmError"]
