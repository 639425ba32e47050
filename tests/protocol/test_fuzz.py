"""Property tests: the decoder only ever raises the protocol's own errors."""

from __future__ import annotations

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import Identity, ProtocolError, SignatureError, open_envelope, seal
from protocol.version import PROTOCOL_VERSION
from protocol.limits import packb
from tests.protocol.conftest import sample_messages

IDENTITY = Identity.from_seed(bytes(32))
SWARM = "fuzz"
VALID = [seal(IDENTITY, m, swarm_id=SWARM, now_ms=99) for m in sample_messages()]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_raise_only_protocol_errors(data):
    try:
        open_envelope(data)
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_mutated_valid_messages_raise_only_protocol_errors(valid, data):
    buf = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    try:
        open_envelope(bytes(buf[:cut]) if data.draw(st.booleans()) else bytes(buf))
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_a_flipped_bit_in_any_signed_field_fails(valid, data):
    raw = msgpack.unpackb(valid, raw=False)
    key = data.draw(st.sampled_from(["pk", "n", "b", "s"]))
    field = bytearray(raw[key])
    bit = data.draw(st.integers(0, len(field) * 8 - 1))
    field[bit // 8] ^= 1 << (bit % 8)
    raw[key] = bytes(field)
    try:
        open_envelope(packb(raw))
    except SignatureError:
        return
    except ProtocolError:
        # a flipped bit inside the body may first break its schema; never accepted either way
        assert key == "b"
        return
    raise AssertionError(f"a flipped bit in {key!r} was accepted")


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=True), st.text(max_size=20), st.binary(max_size=20))
trees = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=5),
                                                  st.dictionaries(st.text(max_size=5), c,
                                                                  max_size=5)), max_leaves=30)


@FUZZ
@given(st.dictionaries(st.sampled_from(["v", "t", "pk", "sw", "ts", "n", "b", "s", "x"]), trees))
def test_structured_garbage_raises_only_protocol_errors(obj):
    try:
        open_envelope(packb(obj))
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from(sample_messages()), trees)
def test_garbage_bodies_raise_only_protocol_errors(msg, body):
    from protocol.envelope import _signed_bytes

    b = packb(body)
    pk = IDENTITY.public_key
    sig = IDENTITY.sign(_signed_bytes(PROTOCOL_VERSION, msg.TYPE, pk, SWARM, 1, bytes(16), b))
    data = packb({"v": PROTOCOL_VERSION, "t": msg.TYPE, "pk": pk, "sw": SWARM, "ts": 1, "n": bytes(16),
                  "b": b, "s": sig})
    try:
        open_envelope(data)
    except ProtocolError:
        pass
