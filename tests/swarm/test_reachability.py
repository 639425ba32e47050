"""Reachability by dial-back (swarm.reachability) and the verdict rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swarm.config import GossipConfig, RelayConfig

REACHED, FAILED, REFUSED = 0, 1, 2


def test_relay_config_is_validated() -> None:
    config = GossipConfig(data_dir="/d", relay=RelayConfig(reservations=1))
    c = GossipConfig.from_json(config.to_json())
    assert c.relay.service and c.relay.reservations == 1
    for bad, key in ((dict(reservation_ttl_s=60), "reservation_ttl_s"),
                     (dict(service="yes"), "service"), (dict(max_circuits=0), "max_circuits"),
                     (dict(reachability_interval_s=0), "reachability_interval_s")):
        with pytest.raises(ValueError, match=f"^{key}: "):
            RelayConfig(**bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"^relay.{key}: "):
            GossipConfig.from_dict({"data_dir": "/d", "relay": bad})


def test_verdict_rule() -> None:
    cases = [
        (([REACHED], []), True),
        (([FAILED], [REACHED, REACHED]), False),      # bootstrap peers decide
        (([FAILED, REACHED], []), True),              # one bootstrap peer reached us
        (([REFUSED], [FAILED, FAILED]), False),       # no usable bootstrap answer: others agree
        (([], [REACHED, FAILED]), None),              # others disagree: undecided
        (([REFUSED], [REFUSED]), None),
        (([], []), None),
    ]
    script = ("import json,sys; from swarm.reachability import decide, Verdict; "
              "mk=lambda l:[Verdict('s%d'%i,s,'') for i,s in enumerate(l)]; "
              "print(json.dumps([decide(mk(a), mk(b)) for a, b in json.loads(sys.argv[1])]))")
    out = subprocess.run([sys.executable, "-c", script, json.dumps([c[0] for c in cases])],
                         capture_output=True, text=True, timeout=60, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [want for _, want in cases]


@pytest.mark.slow
def test_dial_back_reaches_only_a_listening_port_and_is_rate_limited() -> None:
    out = subprocess.run([sys.executable, "-m", "tests.swarm.dialback_check"],
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # C1's real port reached; C2's dead port not; C1 again at once: refused (rate limit)
    assert seen["dialback"] == [REACHED, FAILED, REFUSED], seen
    assert seen["observed_ip"] == "127.0.0.1"
    assert (seen["served"], seen["refused"]) == (2, 1), seen
    # the dial-back used a fresh connection and did not leave it registered
    assert seen["server_conns_to_c1"] == 1, seen
    # why we do not use py-libp2p 0.8.1's AutoNAT: it "dials back" over the connection the
    # request came on, so a port where nobody listens is reported reachable
    assert seen["autonat_dead_port_status_ok"] is True, seen
