"""``python -m swarm --config-json '<GossipConfig JSON>'``: one swarm process.

Prints one ready line (JSON) on stdout when up; logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys

from swarm.config import GossipConfig
from swarm.service import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swarm", description=__doc__)
    parser.add_argument("--config-json", required=True, help="GossipConfig.to_json() output")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log", action="append", default=[], metavar="LOGGER=LEVEL",
                        help="level of one logger, e.g. libp2p.pubsub=DEBUG (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("libp2p", "multiaddr", "async_service"):  # noisy below WARNING
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # importing libp2p turned propagation off for its loggers (libp2p/utils/logging.py):
    # its warnings (dropped messages, rate limits) belong in our log
    logging.getLogger("libp2p").propagate = True
    for spec in args.log:
        name, _, level = spec.partition("=")
        logging.getLogger(name).setLevel(level.upper() or "DEBUG")
    try:
        config = GossipConfig.from_json(args.config_json)
    except ValueError as e:
        print(f"swarm: error: {e}", file=sys.stderr)
        return 2
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
