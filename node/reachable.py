"""The `reachable` line of `swarm-node doctor`: the reachability verdict the node would
reach, from the bootstrap peers' answers to the probe's dial-back question (``swarm.probe``
with ``--listen``), and what to do about it.

    public       a bootstrap peer dialled us back                               ok
    relayed      none did, one serves a circuit relay: peers reach us through it warn
    unreachable  none did, none serves a relay: peers cannot reach us first      FAIL
    unknown      no usable answer (peers limit dial-backs)                       warn

The rule is the node's own (swarm.reachability, swarm.nat); the advice is what its log says
for ``unreachable`` (forward the swarm port and the collective's, the next one, and
announce the address peers saw us at).
"""

from __future__ import annotations

from typing import Any

from node.check import Check, fail, ok, warn

__all__ = ["DIRECT_PORT", "check_reachability"]

DIRECT_PORT = 4001
"""The fixed swarm port the advice suggests when the node listens on port 0."""


def check_reachability(results: list[dict[str, Any]], *, fixed_port: int,
                       not_asked: str = "") -> Check:
    """The verdict the node's own check would reach from the bootstrap peers' answers
    (``swarm.probe`` results, each with its ``peer``): dialled back by any -> public; else
    any serving a relay -> relayed; else unreachable (swarm.reachability.decide: bootstrap
    peers decide). ``fixed_port``: the node's swarm port, 0 when the OS picks one (the advice
    then names ``DIRECT_PORT``); ``not_asked``: why no peer was asked, if none was."""
    if not_asked:
        return warn("reachable", f"not checked: {not_asked}", "fix the lines above, then run "
                    "doctor again")
    by = {state: [r for r in results if r.get("reachability") == state]
          for state in ("public", "relayed", "unreachable")}
    if by["public"]:
        r = by["public"][0]
        return ok("reachable", f"public: {r['peer'][:16]}… dialled us back at "
                               f"{r['observed_ip']}:{r['port']}")
    answered = by["relayed"] or by["unreachable"]
    if not answered:
        why = "; ".join(sorted({str(r.get("reach_error") or "no answer") for r in results}))
        return warn("reachable", f"unknown: no bootstrap peer answered the dial-back "
                                 f"question ({why or 'none connected'})",
                    "run doctor again in a minute (peers limit dial-backs); the node checks "
                    "again itself every few minutes")
    r = answered[0]
    ip, port = r["observed_ip"] or "<your public IP>", int(r["port"])
    forward = (f"forward TCP ports {fixed_port} and {fixed_port + 1} on your router to this "
               f"machine and add --announce /ip4/{ip}/tcp/{fixed_port}" if fixed_port else
               f"listen on a fixed port (--listen /ip4/0.0.0.0/tcp/{DIRECT_PORT}), forward TCP "
               f"ports {DIRECT_PORT} and {DIRECT_PORT + 1} on your router to this machine and "
               f"add --announce /ip4/{ip}/tcp/{DIRECT_PORT}")
    if by["relayed"]:
        return warn("reachable", f"relayed: {r['peer'][:16]}… could not dial us back at "
                                 f"{ip}:{port} (NAT or firewall) but serves a circuit relay: "
                                 "peers will reach this node through it",
                    f"this node can train as it is; to be dialled directly (faster outer "
                    f"steps), {forward}")
    return fail("reachable", f"unreachable: {r['peer'][:16]}… could not dial us back at "
                             f"{ip}:{port} (NAT or firewall) and serves no relay: peers cannot "
                             "reach this node first",
                f"{forward}, or use a bootstrap peer that serves a relay")
