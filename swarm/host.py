"""Build the libp2p host and gossipsub router: Ed25519 identity, TCP, Noise only, yamux.

The default ``new_host()`` also offers plaintext, secio and TLS; we pin Noise so that a peer
that offers only plaintext is refused (tests/swarm/test_host.py shows it).
"""

from __future__ import annotations

import collections
import logging
import socket
import time
from dataclasses import dataclass

import multiaddr
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.score import ScoreParams, TopicScoreParams
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from protocol import Identity
from swarm.config import GossipConfig
from swarm.errors import ConfigError, ListenError
from swarm.pubsub import CountingGossipSub, GuardedPubsub

__all__ = ["Stack", "build_stack", "check_listen", "parse_listen", "parse_peer_addr",
           "dialable_addrs"]

logger = logging.getLogger(__name__)

INVALID_DECAY = 0.99
"""Per-heartbeat decay of the invalid-message counter (P4): a bad peer is forgiven slowly."""


@dataclass(frozen=True)
class Stack:
    host: IHost
    router: CountingGossipSub
    pubsub: GuardedPubsub

    @property
    def counters(self) -> collections.Counter[str]:
        """Every drop and rejection of this stack, by name (``rejected_<reason>``, ...)."""
        return self.pubsub.counters


def key_pair(identity: Identity) -> KeyPair:
    sk = Ed25519PrivateKey.from_bytes(identity.seed)
    return KeyPair(sk, sk.get_public_key())


def build_stack(identity: Identity, config: GossipConfig) -> Stack:
    """A host (Noise + yamux over TCP), a gossipsub router with scoring, and pubsub that
    counts its drops (swarm.pubsub)."""
    kp = key_pair(identity)
    noise = NoiseTransport(kp, noise_privkey=new_x25519_key_pair().private_key)
    announce = [_maddr(a, "announce") for a in config.announce] or None
    host = new_host(
        key_pair=kp,
        sec_opt={TProtocol(NOISE_ID): noise},
        muxer_opt={TProtocol(YAMUX_ID): Yamux},
        announce_addrs=announce,
        connection_config=connection_config(config),
    )
    d = config.pubsub.degree
    counters: collections.Counter[str] = collections.Counter()
    router = CountingGossipSub(
        counters=counters,
        # meshsub/1.1 only: with 1.2 (IDONTWANT) offered, 8 processes on loopback lost 2-57%
        # of batches per node in py-libp2p 0.8.1; with 1.1 none (see the report of issue #3)
        protocols=[PROTOCOL_ID_V11],
        degree=d, degree_low=max(2, d - 2), degree_high=2 * d,
        heartbeat_interval=config.pubsub.heartbeat_interval_s,
        score_params=score_params(config),
        # our own per-sender token bucket (swarm.validation) is the rate limit; this built-in
        # per-forwarder limit silently drops bursts, own publishes included
        # (docs/notes/py-libp2p.md)
        max_messages_per_topic_per_second=1000.0,
        # mesh "diversity" grafting assumes distinct IPs per peer; on one host (or behind one
        # NAT) it only churns the mesh
        eclipse_protection_enabled=False,
        # "adaptive" gossip rewrites the mesh degree and stretches the heartbeat to 30-60 s
        # from its own health estimate; we want the configured, predictable values
        adaptive_gossip_enabled=False,
    )
    pubsub = GuardedPubsub(host, router, counters=counters, ban_s=config.scoring.graylist_ban_s)
    # py-libp2p seeds seqno with int(time.time()) and adds 1 per message: a peer restarted
    # seconds after publishing many messages would reuse seqnos still in its peers' seen
    # cache, and its new messages would be dropped as duplicates. Microseconds avoid that.
    pubsub.counter = time.time_ns() // 1000
    return Stack(host=host, router=router, pubsub=pubsub)


def connection_config(config: GossipConfig) -> ConnectionConfig:
    """Connections are ours to choose (swarm.discovery). py-libp2p's AutoConnector otherwise
    dials every peer it hears of (gossipsub RPCs carry signed peer records) until it holds 100
    connections; peers then dial each other at once and keep duplicate connections, between
    which gossip is lost silently (measured: up to 20 of 35 batches missed by a node)."""
    high = max(config.peers.max * 2, 8)
    return ConnectionConfig(min_connections=0, low_watermark=0, high_watermark=high,
                            max_connections=high * 2)


def score_params(config: GossipConfig) -> ScoreParams:
    """Scoring with only the invalid-message penalty (P4) on: peers whose messages fail our
    validator drop below the graylist threshold and are ignored. P4 must be positive here."""
    return ScoreParams(
        p4_invalid_messages=TopicScoreParams(weight=config.scoring.invalid_message_weight,
                                             cap=1000.0,
                                             decay=INVALID_DECAY),
        publish_threshold=config.scoring.graylist_threshold,
        gossip_threshold=config.scoring.graylist_threshold,
        graylist_threshold=config.scoring.graylist_threshold,
    )


def _maddr(text: str, what: str) -> multiaddr.Multiaddr:
    try:
        return multiaddr.Multiaddr(text)
    except Exception as e:  # multiaddr raises several unrelated types
        raise ConfigError(f"bad {what} multiaddr {text!r}: {e}") from None


def parse_listen(addrs: tuple[str, ...]) -> list[multiaddr.Multiaddr]:
    out = []
    for text in addrs:
        m = _maddr(text, "listen")
        names = [p.name for p in m.protocols()]
        if names[:1] not in (["ip4"], ["ip6"]) or names[1:] != ["tcp"]:
            raise ConfigError(f"listen multiaddr {text!r} must be /ip4|ip6/<addr>/tcp/<port>")
        out.append(m)
    return out


def parse_peer_addr(text: str) -> PeerInfo:
    """A full multiaddr ending in /p2p/<peer id>; ConfigError otherwise."""
    m = _maddr(text, "bootstrap")
    try:
        return info_from_p2p_addr(m)
    except Exception as e:
        raise ConfigError(f"bad bootstrap multiaddr {text!r}: {e} (expected "
                          "/ip4/<addr>/tcp/<port>/p2p/<peer id>)") from None


def check_listen(addrs: list[multiaddr.Multiaddr]) -> None:
    """Fail early with the OS's reason when a fixed port cannot be bound (py-libp2p only logs)."""
    for m in addrs:
        port = int(m.value_for_protocol("tcp"))
        if port == 0:
            continue
        ip6 = "ip6" in [p.name for p in m.protocols()]
        host = m.value_for_protocol("ip6" if ip6 else "ip4")
        with socket.socket(socket.AF_INET6 if ip6 else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise ListenError(f"cannot listen on {m}: {e.strerror}") from None


def dialable_addrs(host: IHost) -> list[str]:
    """Full multiaddrs others can dial: announce addrs if set, else the listen addrs with a
    wildcard IP replaced by loopback and this machine's outbound address."""
    out: list[str] = []
    for m in host.get_addrs():
        text = str(m)
        if "/ip4/0.0.0.0/" in text:
            for ip in _local_ips():
                out.append(text.replace("/ip4/0.0.0.0/", f"/ip4/{ip}/"))
        else:
            out.append(text)
    return list(dict.fromkeys(out))


def _local_ips() -> list[str]:
    ips = ["127.0.0.1"]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET address: no packet is sent for UDP connect
            ip = s.getsockname()[0]
            if ip not in ips:
                ips.append(ip)
    except OSError:
        pass
    return ips
