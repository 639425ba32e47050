"""Which collective addresses the learner hands its outer loop (node.learner_process)."""

from __future__ import annotations

from types import SimpleNamespace

from collectives.config import OuterConfig
from node.learner_process import OuterHook

CIRCUIT = "/ip4/10.0.0.9/tcp/4001/p2p/12D3KooWRelay/p2p-circuit/p2p/{}"


def _peer(pid: str, addrs: list[str], collective: tuple[str, ...], model: str = "m"):
    return SimpleNamespace(peer_id=pid, model=model, addrs=addrs, collective_addrs=collective)


def test_a_peer_behind_nat_is_tunnelled_only_once_it_announced_its_collective() -> None:
    """A NATed peer (circuit addresses only) whose learner has not announced its collective
    yet gets no tunnel: its swarm process would refuse it (nothing to forward to) and our
    p2pd would then back off from the tunnel's address for seconds (go-libp2p dial backoff,
    seen on the WAN bed as 'dial backoff' failures of outer-step state fetches)."""
    peers = [
        _peer("A", [CIRCUIT.format("A")], ()),  # behind NAT, collective not up yet
        _peer("B", [CIRCUIT.format("B")], ("/ip4/192.168.1.2/tcp/5/p2p/B",)),  # behind NAT
        _peer("C", ["/ip4/10.0.0.3/tcp/1/p2p/C"], ("/ip4/10.0.0.3/tcp/7/p2p/C",)),  # public
        _peer("D", [CIRCUIT.format("D")], ("/ip4/192.168.1.3/tcp/5/p2p/D",), model="other"),
    ]
    tunnels: list[str] = []

    def tunnel(pid: str) -> tuple[str, int]:
        tunnels.append(pid)
        return "127.0.0.1", 4000 + len(tunnels)

    bridge = SimpleNamespace(model="m", peers=lambda: peers, tunnel=tunnel)
    hook = OuterHook(OuterConfig(), bridge, "/nonexistent")  # type: ignore[arg-type]
    assert hook._discover() == ["/ip4/127.0.0.1/tcp/4001/p2p/B", "/ip4/10.0.0.3/tcp/7/p2p/C"]
    assert tunnels == ["B"]


class _Loop:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def after_round(self, round_: int) -> None:
        self.calls.append("after_round")

    def collect(self) -> None:
        self.calls.append("collect")


def test_a_leaving_node_starts_no_outer_step_after_its_last_round() -> None:
    """Once SIGTERM set the stop event, the round that was ending only collects a finished
    attempt: starting one at the next meeting would keep the node there alone, since the
    others are leaving too."""
    import threading

    stop = threading.Event()
    hook = OuterHook(OuterConfig(), SimpleNamespace(model="m"),  # type: ignore[arg-type]
                     "/nonexistent", stop=stop)
    hook.loop = loop = _Loop()
    hook(None, 0)
    stop.set()
    hook(None, 1)
    assert loop.calls == ["after_round", "collect"]
