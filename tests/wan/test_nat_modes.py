"""The bed's NAT gateway modes do what bench.wan.bed.NAT_MODES says (root only, slow).

Per mode, one public host ``pub`` and one NATed host ``n``: an unsolicited SYN to the
gateway's public address is answered with RST (``masquerade``) or dropped (``home``,
``symmetric``); two connections from ``n``'s fixed source port keep that port outside
(``masquerade``, ``home``: what TCP hole punching relies on) or get random ports
(``symmetric``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.wan import WanBed, ensure_iptables, hosts, missing

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing()), reason="WAN bed needs: " + "; ".join(missing()))]

_SYN = """
import socket, sys
s = socket.socket(); s.settimeout(2.0)
try:
    s.connect((sys.argv[1], 4001)); print("open")
except ConnectionRefusedError:
    print("rst")
except (TimeoutError, socket.timeout):
    print("dropped")
"""
_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True)
while True:
    c, (_, port) = s.accept(); print(port, flush=True); c.close()
"""
_FROM_PORT = """
import socket, sys
for port in sys.argv[2:]:  # one destination each: the same 4-tuple twice would be TIME_WAIT
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 40001)); s.connect((sys.argv[1], int(port))); s.close()
"""


@pytest.mark.parametrize("mode,unsolicited,keeps_port", [
    ("masquerade", "rst", True), ("home", "dropped", True), ("symmetric", "dropped", False)])
def test_gateway_mode(mode, unsolicited, keeps_port):
    reason = ensure_iptables()
    if reason:
        pytest.skip(f"NAT needs iptables: {reason}")
    with WanBed(hosts(["pub", "n"], rtt_ms=10, nat=["n"], nat_mode=mode)) as bed:
        out = bed.run("pub", [sys.executable, "-c", _SYN, bed.public_addr("n")],
                      capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == unsolicited, (out.stdout, out.stderr)
        servers = [bed.run_in("pub", [sys.executable, "-c", _SERVER, bed.addr("pub")],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
        ports = [srv.stdout.readline().strip() for srv in servers]
        bed.run("n", [sys.executable, "-c", _FROM_PORT, bed.addr("pub"), *ports], check=True,
                timeout=30)
        seen = [int(srv.stdout.readline()) for srv in servers]
        if keeps_port:
            assert seen == [40001, 40001], seen
        else:
            assert 40001 not in seen and seen[0] != seen[1], seen
