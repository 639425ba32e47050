"""Checks run by tests/swarm/test_holepunch.py in a child interpreter. swarm.holepunch leans
on private parts of py-libp2p 0.8.1's DCUtR and relay: their shape is pinned here, so that an
upgrade that changes them fails this test, not a NATed volunteer. (That hole punching works
is shown on the WAN bed: tests/wan/test_holepunch.py.)"""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from libp2p.relay.circuit_v2 import dcutr
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

from swarm.holepunch import HolePuncher
from swarm.relay import _CountingRelay


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_libp2p_is_the_pinned_release():
    assert version("libp2p") == "0.8.1"


@pytest.mark.parametrize("name,params", [
    ("_auto_drive_loop", [("self", inspect.Parameter.empty)]),
    ("_try_unilateral_upgrade", [("self", inspect.Parameter.empty),
                                 ("peer_id", inspect.Parameter.empty)]),
    ("_perform_hole_punch", [("self", inspect.Parameter.empty),
                             ("peer_id", inspect.Parameter.empty),
                             ("addrs", inspect.Parameter.empty), ("as_responder", False)]),
    ("_schedule_relay_close", [("self", inspect.Parameter.empty),
                               ("peer_id", inspect.Parameter.empty)]),
    ("initiate_hole_punch", [("self", inspect.Parameter.empty),
                             ("peer_id", inspect.Parameter.empty)]),
])
def test_overridden_dcutr_methods_keep_their_shape(name, params):
    base = getattr(DCUtRProtocol, name)
    assert _params(base) == params
    assert inspect.iscoroutinefunction(base) == (name != "_schedule_relay_close")
    ours = getattr(HolePuncher, name)
    if ours is not base:  # our override takes what the library passes
        assert _params(ours) == params


def test_dcutr_state_we_read():
    assert dcutr.MAX_HOLE_PUNCH_ATTEMPTS == 3  # "at most 3 attempts" in swarm.holepunch
    init = inspect.getsource(DCUtRProtocol.__init__)
    for attr in ("self._hole_punch_attempts", "self._in_progress", "self._nursery",
                 "self.dial_timeout", "host._dcutr_protocol"):
        assert attr in init, attr
    # the library calls _schedule_relay_close after a verified punch, and the handler side
    # runs _perform_hole_punch: our counters and draining hang on both
    assert "self._schedule_relay_close(peer_id)" in inspect.getsource(
        DCUtRProtocol._perform_hole_punch)
    assert "self._perform_hole_punch(" in inspect.getsource(DCUtRProtocol._handle_dcutr_stream)
    assert "self._auto_drive_loop" in inspect.getsource(DCUtRProtocol.run)


def test_the_relay_reads_every_relayed_chunk_through_one_method():
    params = _params(CircuitV2Protocol._read_stream_with_retry)
    assert [n for n, _ in params] == ["self", "stream", "max_retries"]
    relay_src = inspect.getsource(CircuitV2Protocol._relay_data)
    assert "self._read_stream_with_retry(src_stream)" in relay_src
    callers = [n for n, f in inspect.getmembers(CircuitV2Protocol, inspect.isfunction)
               if "_read_stream_with_retry(" in inspect.getsource(f)
               and n != "_read_stream_with_retry"]
    assert callers == ["_relay_data"]  # else relay_circuit_bytes counts other reads too
    assert issubclass(_CountingRelay, CircuitV2Protocol)


def test_hole_puncher_checks_its_arguments():
    with pytest.raises(ValueError, match="dial_timeout_s"):
        HolePuncher(object(), dial_timeout_s=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle_s"):
        HolePuncher(object(), dial_timeout_s=1, idle_s=10, max_drain_s=5)  # type: ignore[arg-type]
