"""SAPO still samples the swarm with feeds: every node's external groups come from several senders.

Runs ``swarm-node local --nodes N --rounds R`` (rollouts on feeds, the default) and reads the
swarm report: for each node, the distinct senders of the external groups it trained on over
the R rounds (``external_sender_ids`` of the round records). Issue 15 asks for >= 3 over 10
rounds. Writes ``bench/results/sapo_senders.json`` atomically; exits 1 when a node falls short.

    PYTHONPATH=$PWD python bench/sapo_senders.py --nodes 5 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol import atomic_write_bytes  # noqa: E402


def senders_per_node(report: dict) -> dict[str, dict]:
    """name -> {distinct senders over all rounds, per-round counts, rounds}."""
    out = {}
    for node in report["nodes"]:
        rounds = node.get("rounds") or []
        ids = {s for r in rounds for s in r.get("external_sender_ids", [])}
        out[node["name"]] = {"distinct_senders": len(ids), "rounds": len(rounds),
                             "per_round": [r.get("external_senders") for r in rounds],
                             "external_used": [r.get("external_used") for r in rounds]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--min-senders", type=int, default=3)
    ap.add_argument("--config", help="TOML passed to every node (e.g. [gossip.feeds] sources)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sapo_senders.json"))
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sn-sapo-") as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "node", "local", "--nodes", str(args.nodes), "--rounds",
               str(args.rounds), "--report", str(report_path), "--data-dir", str(Path(tmp) / "d")]
        if args.config:
            cmd += ["--config", args.config]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not report_path.exists():
            print(proc.stderr[-4000:], file=sys.stderr)
            return 1
        report = json.loads(report_path.read_text())
    nodes = senders_per_node(report)
    ok = all(n["rounds"] == args.rounds and n["distinct_senders"] >= args.min_senders
             for n in nodes.values())
    doc = {"command": " ".join(sys.argv), "nodes": args.nodes, "rounds": args.rounds,
           "min_senders": args.min_senders, "ok": ok, "per_node": nodes,
           "wall_s": round(time.monotonic() - t0, 1), "load_before": load_before,
           "load_after": list(os.getloadavg())}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, (json.dumps(doc, indent=2) + "\n").encode())
    print(json.dumps(doc))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
