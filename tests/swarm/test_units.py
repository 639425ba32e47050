"""Pure unit tests of the swarm package's pieces (no network)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from protocol import Identity, PeerAnnouncement, ReplayGuard, seal, split_rollouts
from protocol.envelope import _signed_bytes
from protocol.ipc import (
    IpcError,
    Request,
    Response,
    decode_frame,
    encode_frame,
    frame_length,
    message_from_ipc,
    message_to_ipc,
)
from protocol.limits import packb, unpackb
from protocol.version import PROTOCOL_VERSION
from swarm.inbox import Delivery, Inbox
from swarm.peers import PeerTable, announce_interval
from swarm.ratelimit import PeerGate, TokenBuckets
from swarm.topics import topic_for, topics
from swarm.validation import Rejected, Validator
from tests.protocol.conftest import real_model_batch
from tests.swarm.conftest import batch

SWARM = "unit-swarm"


def test_topics_are_namespaced_by_version_and_swarm() -> None:
    assert topic_for("s1", "rollouts") == f"/swarm-node/{PROTOCOL_VERSION}/s1/rollouts"
    # the outer step's records live in the DHT: no gossip topic for them
    assert set(topics("s1")) == {"rollouts", "announce"}
    for other in ("nope", "outer_version", "outer_join"):
        with pytest.raises(ValueError):
            topic_for("s1", other)


def test_token_bucket_limits_rate_per_key_and_refills() -> None:
    b = TokenBuckets(rate=2.0, burst=3)
    assert [b.take("a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take("b", 0.0)  # another key has its own bucket
    assert not b.take("a", 0.2) and b.take("a", 0.6)  # 2/s: one token after 0.5 s
    small = TokenBuckets(rate=1.0, burst=1, capacity=2)
    for k in "xyz":
        small.take(k, 0.0)
    assert len(small._buckets) == 2


def make_validator(**kw: object) -> tuple[Validator, collections.Counter[str]]:
    counters: collections.Counter[str] = collections.Counter()
    v = Validator(swarm_id=SWARM, counters=counters, buckets=TokenBuckets(rate=100, burst=100),
                  guard=ReplayGuard(max_age_ms=300_000, max_future_ms=30_000), log_every_s=0.0)
    for k, val in kw.items():
        setattr(v, k, val)
    return v, counters


NOW = 1_800_000_000_000


def test_peer_gate_admits_one_request_per_peer_per_interval_and_bounds_all_peers() -> None:
    """The dial-back and time servers' budget: a peer asks at most once per interval, and
    fresh identities together at most at the global rate."""
    gate = PeerGate(min_interval_s=10.0, rate_per_s=1.0, burst=3)
    assert [gate.admit(p, 0.0) for p in "abcd"] == [True, True, True, False]  # a burst of 3
    assert gate.admit("d", 1.0)                     # the global bucket refills: 1 a second
    assert not gate.admit("a", 5.0)                 # one request per peer per 10 s
    assert gate.admit("a", 10.0)                                    # a's interval is over


@pytest.mark.parametrize("case,reason", [
    ("forged", "bad_signature"), ("wrong_swarm", "wrong_swarm"), ("oversized", "oversized"),
    ("malformed", "malformed"), ("wrong_sender", "wrong_sender"), ("stale", "stale"),
    ("future", "future"), ("wrong_topic", "wrong_topic"), ("announce_for_other", "wrong_sender"),
    ("unknown_key_bomb", "oversized"), ("unknown_fields", "unknown_fields"),
])
def test_validator_rejects_and_counts_by_reason(case: str, reason: str) -> None:
    me = Identity.from_seed(bytes(range(32)))
    v, counters = make_validator()
    expected = "rollouts"
    good = seal(me, batch("m", 0), swarm_id=SWARM, now_ms=NOW)
    data = {
        "forged": lambda: packb({**unpackb(good), "s": bytes(64)}),
        "wrong_swarm": lambda: seal(me, batch("m", 0), swarm_id="other", now_ms=NOW),
        "oversized": lambda: packb({**unpackb(good), "b": bytes(1_000_000)}),
        "unknown_key_bomb": lambda: sealed_body(me, "rollouts", batch("m", 0).to_wire()
                                                | {"x": [[0] * 1000] * 63}, now_ms=NOW),
        "unknown_fields": lambda: sealed_body(me, "rollouts", batch("m", 0).to_wire()
                                              | {"x": list(range(1000))}, now_ms=NOW),
        "malformed": lambda: b"\xc1",
        "wrong_sender": lambda: seal(Identity.generate(), batch("m", 0), swarm_id=SWARM, now_ms=NOW),
        "stale": lambda: seal(me, batch("m", 0), swarm_id=SWARM, now_ms=NOW - 301_000),
        "future": lambda: seal(me, batch("m", 0), swarm_id=SWARM, now_ms=NOW + 31_000),
        "wrong_topic": lambda: seal(me, PeerAnnouncement(peer_id=me.peer_id, addrs=()),
                                    swarm_id=SWARM, now_ms=NOW),
        "announce_for_other": lambda: seal(me, PeerAnnouncement(peer_id="12D3KooWother", addrs=()),
                                           swarm_id=SWARM, now_ms=NOW),
    }[case]()
    if case == "announce_for_other":
        expected = "announce"
    with pytest.raises(Rejected) as e:
        v.check(data, from_peer=me.peer_id, expected_type=expected, now_ms=NOW)
    assert e.value.reason == reason
    assert counters == {f"rejected_{reason}": 1}


def sealed_body(me: Identity, type_: str, wire: dict, *, now_ms: int) -> bytes:
    """Sign an arbitrary body map, as a hostile peer holding its own key can."""
    body = packb(wire)
    n = bytes(16)
    sig = me.sign(_signed_bytes(PROTOCOL_VERSION, type_, me.public_key, SWARM, now_ms, n, body))
    return packb({"v": PROTOCOL_VERSION, "t": type_, "pk": me.public_key, "sw": SWARM,
                  "ts": now_ms, "n": n, "b": body, "s": sig})


def test_validator_accepts_a_real_model_batch() -> None:
    """8 rollouts x 8 completions x ~2 KB: the swarm accepts what an honest learner publishes."""
    me = Identity.from_seed(bytes(range(32)))
    v, counters = make_validator()
    (b,), too_large = split_rollouts("m", 0, real_model_batch().rollouts)
    assert not too_large
    env = v.check(seal(me, b, swarm_id=SWARM, now_ms=NOW), from_peer=me.peer_id,
                  expected_type="rollouts", now_ms=NOW)
    assert env.message == b and not counters


def test_validator_accepts_once_then_catches_the_replay_and_the_rate() -> None:
    me = Identity.from_seed(bytes(range(32)))
    v, counters = make_validator(buckets=TokenBuckets(rate=0.001, burst=2))
    data = seal(me, batch("m", 0), swarm_id=SWARM, now_ms=NOW - 200_000)
    env = v.check(data, from_peer=me.peer_id, expected_type="rollouts", now_ms=NOW)
    assert env.sender_peer_id == me.peer_id and env.message == batch("m", 0)
    with pytest.raises(Rejected, match="duplicate"):
        v.check(data, from_peer=me.peer_id, expected_type="rollouts", now_ms=NOW)
    with pytest.raises(Rejected, match="rate_limited"):
        v.check(data, from_peer=me.peer_id, expected_type="rollouts", now_ms=NOW)
    assert counters == {"rejected_duplicate": 1, "rejected_rate_limited": 1}


def test_inbox_drops_oldest_and_counts() -> None:
    counters: collections.Counter[str] = collections.Counter()
    box = Inbox(size=3, counters=counters)
    for r in range(5):
        box.put("rollouts", Delivery(sender="p", message=batch("m", r), received_ms=r))
    assert counters == {"dropped_rollouts": 2}
    assert [d.message.round for d in box.take("rollouts", 10)] == [2, 3, 4]
    assert box.take("rollouts", 10) == [] and box.take("other", 1) == []


def test_peer_table_expires_silent_peers() -> None:
    t = PeerTable(ttl_s=10.0, capacity=2)
    a = PeerAnnouncement(peer_id="a", addrs=())
    assert t.update(a, 0.0) and not t.update(a, 5.0)
    t.update(PeerAnnouncement(peer_id="b", addrs=()), 6.0)
    t.update(PeerAnnouncement(peer_id="c", addrs=()), 7.0)  # capacity 2: the newest (b) goes
    assert {p.peer_id for p in t.live()} == {"a", "c"}
    assert t.expire(15.5) == ["a"] and [p.peer_id for p in t.live()] == ["c"]


def test_peer_table_keeps_a_peer_as_long_as_the_period_it_states() -> None:
    """A peer announcing rarely (its table is large, perhaps inflated by a farm of fresh keys)
    stays known between its announcements whatever our own table holds; a stated period is
    honoured only up to max_interval_s; departed peers stop counting towards the swarm size
    after 1.5 periods; a farm filling the table displaces only newcomers."""
    t = PeerTable(ttl_s=30.0, max_interval_s=100.0, capacity=3)
    t.update(PeerAnnouncement(peer_id="slow", addrs=(), interval_s=50.0), 0.0, created_ms=7)
    t.update(PeerAnnouncement(peer_id="liar", addrs=(), interval_s=86_400.0), 0.0)
    assert t.entry_ttl(PeerAnnouncement(peer_id="x", addrs=(), interval_s=2.0)) == 30.0
    assert t.on_schedule(75.0) == 2 and t.on_schedule(76.0) == 1  # slow: 1.5 x 50 s
    assert t.expire(149.0) == [] and t.created_ms("slow") == 7  # 3 x 50 s
    assert t.expire(151.0) == ["slow"]
    assert t.expire(301.0) == ["liar"]  # capped: 3 x 100 s
    for i, now in enumerate((400.0, 401.0)):
        t.update(PeerAnnouncement(peer_id=f"est{i}", addrs=(), interval_s=50.0), now)
    for i in range(20):  # fresh keys at capacity: each displaces the previous newcomer
        t.update(PeerAnnouncement(peer_id=f"sybil{i}", addrs=()), 410.0 + i)
    assert {p.peer_id for p in t.live()} == {"est0", "est1", "sybil19"}
    t.forget("est0")
    assert {p.peer_id for p in t.live()} == {"est1", "sybil19"}


def test_announce_interval_grows_with_the_table_within_bounds() -> None:
    kw = dict(base_s=5.0, max_s=600.0, rate_per_s=4.0)
    assert announce_interval(16, **kw) == 5.0
    assert announce_interval(1000, **kw) == 250.0  # the swarm sends each node ~4/s
    assert announce_interval(10**6, **kw) == 600.0


def test_ipc_frames_round_trip_and_reject_bad_input() -> None:
    req = Request(op="publish", id=7, args=message_to_ipc(batch("m", 1)))
    frame = encode_frame(req.to_wire())
    assert frame_length(frame[:4]) == len(frame) - 4
    back = Request.from_wire(decode_frame(frame[4:]))
    assert back == req and message_from_ipc(back.args) == batch("m", 1)
    assert Response.from_wire(Response(id=1, ok=False, error="x").to_wire()).error == "x"
    for bad in (b"\x00\x00\x00\x00", (1 << 31).to_bytes(4, "big")):
        with pytest.raises(IpcError):
            frame_length(bad)
    with pytest.raises(IpcError):
        decode_frame(b"\xc1")
    with pytest.raises(IpcError, match="unknown op"):
        Request.from_wire({"op": "exec", "id": 1, "args": {}})
    with pytest.raises(IpcError, match="'id'"):
        Request.from_wire({"op": "stats", "id": True, "args": {}})
    with pytest.raises(IpcError, match="unknown message type"):
        message_from_ipc({"type": "nope", "body": {}})


def test_the_largest_message_fits_one_pubsub_rpc() -> None:
    """protocol's max_message_bytes plus pubsub's framing (from, seqno, topic, key, signature)
    and a signed peer record stay under py-libp2p's inbound RPC cap, so the receiver reads
    every message a sender may seal. In a child interpreter: libp2p's protobufs cannot be
    imported into a process that imported hivemind (other tests of this session do)."""
    script = f"""
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.rpc_queue import DefaultMaxMessageSize
from protocol import Limits
msg = rpc_pb2.Message(data=bytes(Limits().max_message_bytes), topicIDs=[{topic_for("x" * 64, "rollouts")!r}],
                      from_id=bytes(38), seqno=bytes(8), key=bytes(36), signature=bytes(64))
rpc = rpc_pb2.RPC(publish=[msg], senderRecord=bytes(2048))
print(rpc.ByteSize(), DefaultMaxMessageSize)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    size, cap = int(out[0]), int(out[1])
    assert size <= cap


def test_receive_answers_within_a_byte_budget_and_keeps_the_rest() -> None:
    counters: collections.Counter[str] = collections.Counter()
    box = Inbox(size=10, counters=counters)
    for r in range(5):
        box.put("rollouts", Delivery(sender="p", message=batch("m", r), received_ms=r, size=400))
    assert [d.received_ms for d in box.take("rollouts", 10, max_bytes=1000)] == [0, 1]
    assert [d.received_ms for d in box.take("rollouts", 10, max_bytes=100)] == [2]  # one always
    assert len(box) == 2 and not counters


def test_an_ipc_frame_of_many_deliveries_decodes() -> None:
    """The IPC codec is bounded by its frame size, not by gossip's per-message object budget."""
    items = [{"sender": "p", "received_ms": 1, **message_to_ipc(batch("m", 0, n=64))}] * 200
    frame = encode_frame({"id": 1, "ok": True, "result": items})
    assert len(decode_frame(frame[4:])["result"]) == 200
