from __future__ import annotations

import pytest

from protocol import DuplicateNonce, FutureMessage, ReplayGuard, StaleMessage, open_envelope, seal
from tests.protocol.conftest import sample_messages


def _env(identity, ts, nonce=None):
    return open_envelope(seal(identity, sample_messages()[2], swarm_id="s", now_ms=ts, nonce=nonce))


def test_accepts_once_then_rejects_duplicate(identity):
    guard = ReplayGuard(max_age_ms=1000, max_future_ms=100)
    env = _env(identity, 5000)
    guard.check(env, now_ms=5000)
    with pytest.raises(DuplicateNonce):
        guard.check(env, now_ms=5001)


def test_window_edges(identity):
    guard = ReplayGuard(max_age_ms=1000, max_future_ms=100)
    with pytest.raises(StaleMessage):
        guard.check(_env(identity, 3999), now_ms=5000)
    with pytest.raises(FutureMessage):
        guard.check(_env(identity, 5101), now_ms=5000)
    guard.check(_env(identity, 4000), now_ms=5000)
    guard.check(_env(identity, 5100), now_ms=5000)


def test_replay_after_gossipsub_seen_ttl_is_still_rejected(identity):
    """gossipsub forgets after 120 s; our guard holds the nonce for the whole window."""
    guard = ReplayGuard(max_age_ms=300_000)
    env = _env(identity, 1_000_000)
    guard.check(env, now_ms=1_000_000)
    with pytest.raises(DuplicateNonce):
        guard.check(env, now_ms=1_000_000 + 121_000)
    with pytest.raises(StaleMessage):
        guard.check(env, now_ms=1_000_000 + 301_000)


def test_memory_is_bounded_and_evicted_nonces_stay_rejected(identity):
    guard = ReplayGuard(max_age_ms=10**9, capacity=10)
    envs = [_env(identity, 1000 + i) for i in range(25)]
    for env in envs:
        guard.check(env, now_ms=2000)
    assert len(guard) == 10
    for env in envs:
        with pytest.raises((DuplicateNonce, StaleMessage)):
            guard.check(env, now_ms=2000)


def test_old_entries_expire(identity):
    guard = ReplayGuard(max_age_ms=100)
    for i in range(50):
        guard.check(_env(identity, 1000 + i), now_ms=1000 + i)
    guard.check(_env(identity, 10_000), now_ms=10_000)
    assert len(guard) == 1
