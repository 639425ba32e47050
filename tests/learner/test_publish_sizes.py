"""The learner publishes a round in batches that each fit one sealed gossip message."""

from __future__ import annotations

from types import SimpleNamespace

from node.learner.loop import Learner
from protocol import Identity, TaskSpec, open_envelope, seal


class RecordingBridge:
    def __init__(self) -> None:
        self.published: list = []

    def publish(self, message) -> None:  # noqa: ANN001 - the Bridge protocol's signature
        self.published.append(message)


def round_of(groups: int, completions: int, chars: int, char: str = "é"):
    tasks = [SimpleNamespace(spec=TaskSpec(family="f", seed=1, index=i), prompt=f"q{i}")
             for i in range(groups)]
    gs = [SimpleNamespace(completions=tuple(f"{j}" + char * chars for j in range(completions)),
                          rewards=(0.5,) * completions) for _ in range(groups)]
    comps = [[SimpleNamespace(token_count=chars // 3)] * completions for _ in range(groups)]
    return tasks, gs, comps


def test_a_long_round_is_split_into_batches_every_peer_accepts() -> None:
    """8 groups x 8 completions x 16k four-byte characters: splitting by 256k characters made
    2 MiB batches that no peer could seal or open."""
    me = Identity.generate()
    bridge = RecordingBridge()
    learner = SimpleNamespace(fingerprint="model@abc", round=3)
    n = Learner._publish(learner, bridge,  # type: ignore[arg-type]
                         *round_of(8, 8, 16 * 1024 - 2, char="\U0001F600"))
    assert n == 8 and len(bridge.published) == 8  # 512 KiB per group: one per message
    opened = [open_envelope(seal(me, b, swarm_id="s"), swarm_id="s").message
              for b in bridge.published]
    assert sum(len(b.rollouts) for b in opened) == 8
    assert [r.task.index for b in opened for r in b.rollouts] == list(range(8))


def test_a_group_too_large_for_any_message_is_left_out_not_fatal() -> None:
    bridge = RecordingBridge()
    learner = SimpleNamespace(fingerprint="m", round=0)
    tasks, gs, comps = round_of(2, 64, 16 * 1024 - 2)  # 64 x 16k two-byte characters
    assert Learner._publish(learner, bridge, tasks, gs, comps) == 0  # type: ignore[arg-type]
    assert bridge.published == []
