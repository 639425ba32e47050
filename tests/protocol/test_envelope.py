"""Round trips, signatures, versioning and strict decoding of the envelope."""

from __future__ import annotations

import msgpack
import pytest

from protocol import (
    DecodeError,
    Identity,
    Limits,
    ProtocolError,
    RolloutBatch,
    SchemaError,
    SignatureError,
    TooLarge,
    UnknownMessageType,
    VersionError,
    open_envelope,
    seal,
)
from protocol.limits import packb
from protocol.version import PROTOCOL_VERSION

SWARM = "test-swarm"


def test_round_trip_is_exact(identity, message):
    data = seal(identity, message, swarm_id=SWARM, now_ms=1234)
    env = open_envelope(data, swarm_id=SWARM)
    assert env.message == message
    assert env.sender == identity.public_key
    assert env.sender_peer_id == identity.peer_id
    assert env.created_ms == 1234
    assert env.type == message.TYPE


def _tamper(data: bytes, key: str, value) -> bytes:
    raw = msgpack.unpackb(data, raw=False)
    raw[key] = value
    return packb(raw)


@pytest.mark.parametrize("key", ["t", "sw", "ts", "n", "b"])
def test_changing_any_signed_field_breaks_the_signature(identity, key):
    from tests.protocol.conftest import sample_messages

    msg = sample_messages()[0]
    data = seal(identity, msg, swarm_id=SWARM, now_ms=1000)
    raw = msgpack.unpackb(data, raw=False)
    changed = {"t": "announce", "sw": "other", "ts": 1001, "n": bytes(16),
               "b": packb(sample_messages()[0].to_wire() | {"round": 5})}[key]
    assert changed != raw[key]
    with pytest.raises(SignatureError):
        open_envelope(_tamper(data, key, changed))


def test_other_senders_key_fails(identity, message):
    data = seal(identity, message, swarm_id=SWARM)
    other = Identity.generate()
    with pytest.raises(SignatureError):
        open_envelope(_tamper(data, "pk", other.public_key))


def test_wrong_swarm_rejected(identity, message):
    data = seal(identity, message, swarm_id="other-swarm")
    with pytest.raises(SchemaError) as e:
        open_envelope(data, swarm_id=SWARM)
    assert e.value.field == "sw" and e.value.reason == "wrong_swarm"


@pytest.mark.parametrize("other", [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1])
def test_other_version_rejected(identity, message, other):
    data = _tamper(seal(identity, message, swarm_id=SWARM), "v", other)
    with pytest.raises(VersionError):
        open_envelope(data)


def test_unknown_type_rejected(identity, message):
    data = _tamper(seal(identity, message, swarm_id=SWARM), "t", "frobnicate")
    with pytest.raises(UnknownMessageType):
        open_envelope(data)


def test_unknown_optional_fields_are_ignored(identity):
    """A newer peer adds a field: an older peer still decodes the message."""
    from tests.protocol.conftest import sample_messages

    msg = sample_messages()[2]
    wire = msg.to_wire() | {"new_field_from_the_future": [1, 2, 3]}
    body = packb(wire)
    # re-sign the extended body as a newer peer would
    from protocol.envelope import _signed_bytes

    pk = identity.public_key
    sig = identity.sign(_signed_bytes(PROTOCOL_VERSION, msg.TYPE, pk, SWARM, 5, bytes(16), body))
    data = packb({"v": PROTOCOL_VERSION, "t": msg.TYPE, "pk": pk, "sw": SWARM, "ts": 5, "n": bytes(16),
                  "b": body, "s": sig})
    assert open_envelope(data).message == msg


def test_missing_required_field_names_it(identity):
    from protocol import OuterJoin

    wire = {"group": "g", "state_hash": "x", "clock": 1}  # no step
    with pytest.raises(SchemaError) as e:
        OuterJoin.from_wire(wire)
    assert e.value.field == "step"


def test_nested_field_error_names_the_path():
    wire = {"model": "m", "round": 1, "rollouts": [
        {"task": {"family": "f", "seed": -1, "index": 0}, "prompt": "p", "completions": ["a"]}]}
    with pytest.raises(SchemaError) as e:
        RolloutBatch.from_wire(wire)
    assert e.value.field == "rollouts[0].task.seed"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_rewards_rejected(bad):
    wire = {"model": "m", "round": 1, "rollouts": [
        {"task": {"family": "f", "seed": 1, "index": 0}, "prompt": "p", "completions": ["a"],
         "rewards": [bad]}]}
    with pytest.raises(SchemaError, match="finite"):
        RolloutBatch.from_wire(wire)


def test_reward_count_must_match_completions():
    wire = {"model": "m", "round": 1, "rollouts": [
        {"task": {"family": "f", "seed": 1, "index": 0}, "prompt": "p", "completions": ["a"],
         "rewards": [1.0, 0.0]}]}
    with pytest.raises(SchemaError, match="2 rewards for 1 completions"):
        RolloutBatch.from_wire(wire)


def test_oversized_message_rejected_on_decode_and_on_seal(identity):
    from tests.protocol.conftest import sample_messages

    small = Limits(max_message_bytes=200)
    data = seal(identity, sample_messages()[0], swarm_id=SWARM)
    with pytest.raises(TooLarge):
        open_envelope(data, limits=small)
    with pytest.raises(TooLarge):
        seal(identity, sample_messages()[0], swarm_id=SWARM, limits=small)


def test_long_strings_lists_and_nesting_rejected():
    from protocol.limits import unpackb

    limits = Limits(max_str=10, max_list=4, max_depth=3)
    with pytest.raises(TooLarge):
        unpackb(packb("x" * 100), limits)
    with pytest.raises(TooLarge):
        unpackb(packb(b"x" * 100), limits)
    with pytest.raises(TooLarge):
        unpackb(packb(list(range(10))), limits)
    with pytest.raises(TooLarge):
        unpackb(packb([[[[1]]]]), limits)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x81", packb([1, 2]), packb({1: 2}), b"junk" * 10,
                                  packb({"v": True}), packb({"v": 1})])
def test_malformed_inputs_raise_protocol_errors(data):
    with pytest.raises(DecodeError):
        open_envelope(data)


def test_every_error_is_a_protocol_error_with_a_reason():
    import protocol.errors as errors

    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not Exception:
            assert issubclass(obj, ProtocolError), name
            assert obj.reason, name
