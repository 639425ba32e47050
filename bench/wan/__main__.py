"""CLI: ``python -m bench.wan up|down|status`` (see bench/wan/__init__.py)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from . import bed as wan
from .checks import BedUnavailable, ensure_iptables, ensure_miniupnpd, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wan", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build a bed that stays up until `down`")
    up.add_argument("--tag", default="cli")
    up.add_argument("--hosts", type=int, default=4, help="hosts h0..h{N-1}")
    up.add_argument("--names", default="", help="comma-separated host names (instead of --hosts)")
    up.add_argument("--rtt-ms", type=float, default=0.0)
    up.add_argument("--jitter-ms", type=float, default=0.0)
    up.add_argument("--rate-mbit", type=float, default=None)
    up.add_argument("--nat", default="", help="comma-separated hosts to put behind NAT")
    up.add_argument("--nat-mode", default="masquerade", choices=sorted(wan.NAT_MODES),
                    help="what their gateways do (bench.wan.bed.NAT_MODES)")
    up.add_argument("--mtu", type=int, default=1500)
    up.add_argument("--install", action="store_true",
                    help="apt-get install iptables (and miniupnpd for --nat-mode upnp) first if "
                         "NAT needs it and it is missing")
    dn = sub.add_parser("down", help="remove a bed (or all beds) and everything inside")
    dn.add_argument("--tag", default="cli")
    dn.add_argument("--stale", action="store_true",
                    help="every bed whose router is gone (its owner crashed)")
    dn.add_argument("--all", action="store_true",
                    help="every swnw* bed on this machine, other users' running tests included")
    sub.add_parser("status", help="beds on this machine and what is missing to build one")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.cmd == "status":
        print(json.dumps({"missing": missing(nat=True), "beds": wan.instances()}, indent=1))
        return 0
    if args.cmd == "down":
        tags = list(wan.instances()) if args.all else wan.stale() if args.stale else [args.tag]
        for tag in tags:
            print(f"{tag}: removed {wan.down(tag)}")
        return 0
    names = [n for n in args.names.split(",") if n] or args.hosts
    specs = wan.hosts(names, rtt_ms=args.rtt_ms, jitter_ms=args.jitter_ms,
                      rate_mbit=args.rate_mbit, nat=[n for n in args.nat.split(",") if n],
                      nat_mode=args.nat_mode)
    upnp = any(s.nat for s in specs) and args.nat_mode == "upnp"
    if args.install and any(s.nat for s in specs) and (
            why := ensure_iptables() or (ensure_miniupnpd() if upnp else None)):
        print(why, file=sys.stderr)
        return 2
    # miniupnpd forwards nothing on a private WAN address: upnp beds get a public-looking one
    bed = wan.WanBed(specs, tag=args.tag, mtu=args.mtu, owner_pid=None,
                     subnet="11.213" if upnp else "10.213")
    try:
        bed.up()
    except BedUnavailable as e:
        print("\n".join(["missing:", *e.missing]), file=sys.stderr)
        return 2
    print(json.dumps(bed.describe(), indent=1))
    print(f"run a program in a host: ip netns exec {bed.ns(specs[0].name)} CMD; "
          f"remove: python -m bench.wan down --tag {args.tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
