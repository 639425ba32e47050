"""Bounded decoding: unknown keys are paid for, object counts are capped while msgpack decodes,
and the one size limit (Limits.max_message_bytes) holds end to end for honest batches."""

from __future__ import annotations

import pytest

from protocol import (
    Identity,
    Limits,
    Rollout,
    RolloutBatch,
    SchemaError,
    TaskSpec,
    TooLarge,
    UnknownFields,
    max_body_bytes,
    open_envelope,
    seal,
    split_rollouts,
)
from protocol.envelope import ENVELOPE_OVERHEAD, _signed_bytes
from protocol.limits import packb, unpackb
from protocol.version import PROTOCOL_VERSION
from tests.protocol.conftest import real_model_batch, sample_messages

SWARM = "test-swarm"


def sealed_body(me: Identity, type_: str, body_wire: dict, **extra: object) -> bytes:
    """Seal an arbitrary body map (and extra envelope keys) as a hostile peer with a key can."""
    body = packb(body_wire)
    sig = me.sign(_signed_bytes(PROTOCOL_VERSION, type_, me.public_key, SWARM, 5, bytes(16), body))
    return packb({"v": PROTOCOL_VERSION, "t": type_, "pk": me.public_key, "sw": SWARM, "ts": 5,
                  "n": bytes(16), "b": body, "s": sig, **extra})


def small() -> RolloutBatch:
    return sample_messages()[0]


def test_a_newer_peers_few_small_fields_are_accepted(identity):
    wire = small().to_wire() | {"new_scalar": 1, "new_list": [1, 2, 3], "new_text": "x" * 100}
    wire["rollouts"][0] = wire["rollouts"][0] | {"new_nested": {"a": 1}}
    assert open_envelope(sealed_body(identity, "rollouts", wire)).message == small()


def test_unknown_key_bomb_is_stopped_by_the_decoder(identity):
    """~63k objects under an unknown key (issue 11): msgpack stops at the object budget, so
    the schema never walks them; reason 'oversized'."""
    data = sealed_body(identity, "rollouts", small().to_wire() | {"x": [[0] * 1000] * 63})
    with pytest.raises(TooLarge, match="msgpack objects") as e:
        open_envelope(data)
    assert e.value.reason == "oversized"


@pytest.mark.parametrize("extra", [
    {"x": [[0] * 1000] * 10},                       # 10k objects: under the decoder's budget
    {"x": "y" * 5000},                              # bytes
    {f"k{i}": 1 for i in range(5)},                 # keys per map
    {"x": [[[[1]]]]},                               # nesting
])
def test_unknown_fields_over_their_budget_are_refused(identity, extra):
    data = sealed_body(identity, "rollouts", small().to_wire() | extra)
    with pytest.raises(UnknownFields) as e:
        open_envelope(data)
    assert e.value.reason == "unknown_fields"


def test_the_budget_is_per_message_not_per_map(identity):
    """4 unknown keys per map pass, but 64 rollouts x 4 of them exceed the message's budget."""
    wire = real_model_batch(rollouts=8, completions=1, chars=10).to_wire()
    wire["rollouts"] = [r | {f"k{i}": 0 for i in range(4)} for r in wire["rollouts"]]
    with pytest.raises(UnknownFields, match="too many unknown keys"):
        open_envelope(sealed_body(identity, "rollouts", wire))


def test_unknown_envelope_keys_share_the_budget(identity):
    wire = small().to_wire()
    assert open_envelope(sealed_body(identity, "rollouts", wire, zz=1)).message == small()
    with pytest.raises(UnknownFields):
        open_envelope(sealed_body(identity, "rollouts", wire, zz=[list(range(100))] * 5))


def test_object_budget_is_enforced_for_any_shape():
    limits = Limits(max_objects=100)
    assert len(unpackb(packb([list(range(9))] * 9), limits)) == 9  # 9 x 10 + 10 objects
    with pytest.raises(TooLarge):
        unpackb(packb([list(range(10))] * 9), limits)
    with pytest.raises(TooLarge):
        unpackb(packb({str(i): {"a": i} for i in range(40)}), limits)


def test_real_model_batch_round_trips(identity):
    """8 rollouts x 8 completions x ~2 KB (issue 11: rejected as 'oversized' on main)."""
    b = real_model_batch()
    data = seal(identity, b, swarm_id=SWARM)
    assert len(data) > 128 * 1024
    assert open_envelope(data, swarm_id=SWARM).message == b


def test_largest_honest_batch_in_objects_opens(identity):
    task = TaskSpec(family="f", config={f"c{i}": i for i in range(32)}, seed=1, index=2)
    ro = Rollout(task=task, prompt="p", completions=("a",) * 64, rewards=(0.5,) * 64,
                 token_counts=(1,) * 64)
    b = RolloutBatch(model="m", round=1, rollouts=(ro,) * 64)
    assert open_envelope(seal(identity, b, swarm_id=SWARM)).message == b


def test_envelope_overhead_bound_holds_for_the_longest_swarm_id(identity):
    sw = "€" * 64  # 64 characters of 3 bytes
    b = small()
    data = seal(identity, b, swarm_id=sw)
    assert len(data) - len(packb(b.to_wire())) <= ENVELOPE_OVERHEAD


@pytest.mark.parametrize("chars,completions,n", [(2048, 8, 8), (12_000, 16, 40), (1, 1, 200),
                                                 (16 * 1024, 64, 3)])
def test_every_split_batch_seals_and_opens(identity, chars, completions, n):
    rollouts = real_model_batch(rollouts=n, completions=completions, chars=chars).rollouts
    sw = "€" * 64
    batches, too_large = split_rollouts("m" * 128, 7, rollouts)
    opened = []
    for b in batches:
        assert len(packb(b.to_wire())) <= max_body_bytes()
        opened += open_envelope(seal(identity, b, swarm_id=sw)).message.rollouts
    assert tuple(opened) + tuple(too_large) == rollouts
    if chars * completions * 2 < max_body_bytes():
        assert not too_large
    else:  # one rollout of 64 x 16k characters of 2-byte text exceeds any message
        assert len(too_large) == n and not batches


@pytest.mark.parametrize("field,value,problem", [
    ("completions", ["a", 1], "completions[1]"),
    ("completions", ["a", "x" * (16 * 1024 + 1)], "completions[1]"),
    ("rewards", [0.0, float("nan")], "rewards[1]"),
    ("rewards", [0.0, 2e6], "rewards[1]"),
    ("rewards", [0.0, True], "rewards[1]"),
    ("token_counts", [1, -1], "token_counts[1]"),
    ("token_counts", [1, 1.0], "token_counts[1]"),
])
def test_bulk_list_checks_still_name_the_bad_item(field, value, problem):
    wire = {"model": "m", "round": 1, "rollouts": [
        {"task": {"family": "f", "seed": 1, "index": 0}, "prompt": "p", "completions": ["a", "b"],
         field: value}]}
    with pytest.raises(SchemaError) as e:
        RolloutBatch.from_wire(wire)
    assert e.value.field == f"rollouts[0].{problem}"


def test_bulk_list_checks_accept_ints_as_floats():
    wire = {"model": "m", "round": 1, "rollouts": [
        {"task": {"family": "f", "seed": 1, "index": 0}, "prompt": "p", "completions": ["a", "b"],
         "rewards": [1, 0.5]}]}
    assert RolloutBatch.from_wire(wire).rollouts[0].rewards == (1.0, 0.5)
