"""A hostile peer, as a real process: ``python -m tests.adversary.hostile <attack> '<json>'``.

Each ``Attack`` is one row of issue 11's attack table (plus Sybil flooding). Gossip attacks
(``gossip.py``) build a host with the project's own ``swarm.host.build_stack`` and publish
payloads sealed with ``protocol.seal``; the DiLoCo takeover (``takeover.py``) uses the
collectives' own transport, commit book, state and state-serving handler. The two stacks
cannot share a process (duplicate protobuf symbols), so each attack imports only its own.

JSON arguments (all attacks): ``data_dir`` (scratch), ``swarm_id``, ``duration_s``;
gossip attacks: ``victims`` (full swarm multiaddrs), ``model`` (fingerprint to claim),
``rate_per_s``, ``identities``, ``marker_dir``, ``task_config``; takeover: ``collective``
(full hivemind multiaddrs of the victims). The process prints ``{"event": "ready", ...}``
once connected and ``{"event": "done", "attack": ..., ...}`` (what it sent and observed)
when ``duration_s`` is over.
"""

from __future__ import annotations

import json
import sys

from tests.adversary.attacks import DEFAULTS, Attack

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.stderr.write(f"usage: python -m tests.adversary.hostile "
                         f"{{{','.join(a.value for a in Attack)}}} '<json>'\n")
        return 2
    attack = Attack(argv[0])
    args = {**DEFAULTS[attack], **json.loads(argv[1])}
    if attack is Attack.DILOCO_TAKEOVER:
        from tests.adversary.takeover import run_takeover

        result = run_takeover(args)
    elif attack is Attack.FEED_SYBIL:
        import trio

        from tests.adversary.feeds import run_feed_sybils

        result = trio.run(run_feed_sybils, args)
    else:
        import trio

        from tests.adversary.gossip import run_gossip_attack

        result = trio.run(run_gossip_attack, attack, args)
    print(json.dumps({"event": "done", "attack": attack.value, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
