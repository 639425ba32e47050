"""The `clock` line of `swarm-node doctor`: this machine's clock against the bootstrap peers'.

Every signed message carries its creation time. A receiver rejects one created more than
``[gossip.limits] max_future_s`` (30 s by default) ahead of its own clock, as ``future``, and
one older than ``replay_window_s`` (300 s) as ``stale``. So a clock off by more than
``max_future_s`` in either direction loses messages without an error: ahead, peers drop ours;
behind, we drop theirs. The probe asks each bootstrap peer its time (``swarm.clock``); the
offset is exact to within half the question's round trip.

    |offset| <= WARN_S                                        ok
    WARN_S < |offset|, or off by up to max_future_s           warn: time sync is off
    |offset| - round trip / 2 >= max_future_s                 FAIL: messages are dropped
    no peer told its time (older versions)                    warn: not checked

A bootstrap peer could lie about its time; the line is advice only, and join does not refuse
to start on it (peers judge our messages by their own clocks, not by this check).
"""

from __future__ import annotations

from typing import Any

from node.check import Check, fail, ok, warn

__all__ = ["WARN_S", "check_clock"]

WARN_S = 5.0
"""Offset above which time sync is evidently off (NTP keeps clocks within milliseconds)."""
SYNC_FIX = ("turn on time sync: `timedatectl set-ntp true` (systemd), or run chrony/ntpd; in "
            "a container the host's clock is the one to fix")


def check_clock(results: list[dict[str, Any]], *, max_future_s: float) -> Check:
    """The verdict from the probes' results (``swarm.probe``: ``clock_offset_ms``,
    ``clock_rtt_ms``, ``clock_error``, and the ``peer`` asked). The largest offset decides:
    one peer that rejects our messages is one too many."""
    told = [r for r in results if isinstance(r.get("clock_offset_ms"), int)]
    if not told:
        why = next((r.get("clock_error") for r in results if r.get("clock_error")), "")
        return warn("clock", "not checked: no bootstrap peer told its time"
                    + (f" ({why})" if why else ""),
                    "nothing to do if this machine syncs its time (peers running an older "
                    "swarm-node do not answer the time question)")
    worst = max(told, key=lambda r: abs(r["clock_offset_ms"]))
    offset_s = worst["clock_offset_ms"] / 1000
    # half the round trip, plus the millisecond both integers are rounded to: on one machine
    # the probe measured rtt 0 and offset 1 ms, which is agreement, not "0.0 s behind"
    error_s = (worst.get("clock_rtt_ms", 0) / 2 + 1) / 1000
    peer = str(worst.get("peer", "?"))[:16]
    direction = "behind" if offset_s > 0 else "ahead of"
    found = f"this clock is {abs(offset_s):.1f} s {direction} {peer}…'s (±{error_s:.2f} s)"
    if abs(offset_s) <= error_s:
        found = f"this clock agrees with {peer}…'s to within {error_s:.2f} s"
    if abs(offset_s) - error_s >= max_future_s:
        harm = ("peers drop every message we sign as from the future" if offset_s < 0 else
                "we drop every peer message as from the future, and peers ours once they "
                "look older than the replay window")
        return fail("clock", f"{found}: over the {max_future_s:g} s peers accept; {harm}",
                    SYNC_FIX)
    if abs(offset_s) > WARN_S:
        return warn("clock", f"{found}; at {max_future_s:g} s messages are dropped", SYNC_FIX)
    return ok("clock", f"{found}")
