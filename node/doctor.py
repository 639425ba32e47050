"""`swarm-node doctor`: the preflight a volunteer runs first, one line per check.

Each check returns a ``Check``: a verdict (ok / warn / FAIL), what it found and, when not ok,
the fix. The checks, in the order printed:

    python     the interpreter against the tested minor version (deploy/python_check.py)
    packages   installed versions of our key dependencies against deploy/constraints.txt
    torch      torch's version (the user's choice: reported only), the device `join` would
               use (CUDA name and memory) and this machine's RAM
    model      the model's training step against the device's memory, as the learner checks
               it (``python -m node.learner.fit``): the estimate and, when it cannot fit, the
               settings that would
    disk       free space where the data dir lives, against the checkpoints of the model
    ports      the swarm and collective listen ports, metrics and dashboard ports: bindable?
    bootstrap  per --bootstrap address: TCP reachable, then a libp2p dial with our own host
               code that reads the swarm ids and protocol version of the peer's topics
               (``python -m swarm.probe``)
    reachable  the reachability verdict the node would reach (swarm.reachability): the same
               probe listens on the node's swarm address and asks each bootstrap peer to dial
               it back: ``public`` (dialled back), ``relayed`` (not, but the peer serves a
               circuit relay: peers will reach this node through it) or ``unreachable``
               (neither: peers cannot reach it first), each with what to do about it
               (node/reachable.py)
    clock      this machine's clock against each bootstrap peer's (the same probe asks it
               the time): peers drop messages more than ``max_future_s`` ahead of their
               clocks (node/skew.py)

Each line is a ``node.check.Check``.

``preflight`` is the cheap, fatal part (ports, disk, and a model that cannot fit) that `join`
runs before it starts any child. This module imports neither torch nor libp2p: torch is asked in a child interpreter
(``python -m node.doctor --torch-facts``), the bootstrap peer by ``swarm.probe`` in another,
as the supervisor does with its children.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from node.check import Check, Verdict, fail, ok, warn
from node.config import NodeConfig
from node.reachable import check_reachability
from node.skew import check_clock
from node.tables import learner_table
from protocol import PROTOCOL_VERSION
from swarm.config import LimitsConfig

__all__ = ["check_bootstrap", "check_disk", "check_model", "check_packages", "check_ports",
           "check_python", "check_torch", "preflight", "run_checks"]

TESTED_PYTHON = ("3.11",)
"""deploy/python_check.py's TESTED (tests/node/test_doctor.py checks they agree)."""
KEY_PACKAGES = ("transformers", "safetensors", "tokenizers", "hivemind", "numpy", "libp2p",
                "trio", "msgpack", "cryptography", "click", "rich", "prometheus-client",
                "reasoning-gym", "matplotlib")
"""pyproject.toml's dependencies less torch (the user's choice, reported by the torch check)."""
CONSTRAINTS = Path(__file__).resolve().parents[1] / "deploy" / "constraints.txt"
"""The pins the suite passed with; present in a source checkout and the image."""
CHECKPOINT_FACTOR = 10
"""Bytes of one checkpoint per byte of the model's weight files, at most: a checkpoint holds
the weights (float32 on CPU: 4 bytes a parameter), AdamW's two moments (8) and the outer
step's θ_global and momentum (8, float32), 20 bytes a parameter against 2 in a bfloat16 weight
file. The doctor warns below ``keep_checkpoints`` + 1 (one being written) of these."""
CHECKPOINT_FACTOR_MIN = 3
"""The same, at least (bfloat16 training, 14 bytes a parameter, of a float32 weight file, 4):
below one checkpoint of these the doctor FAILs and `join` refuses to start."""
MIN_FREE = 256 * 2**20
"""Free bytes below which nothing works (status, logs, the embedded model's checkpoints)."""
UNKNOWN_MODEL_FREE = 20 * 2**30
"""Free bytes to warn below when the model's size is unknown (a hub id not downloaded yet):
ten checkpoints' worth of a 0.5B-parameter model in bfloat16, about three of 1B."""
TCP_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 10.0
"""The libp2p dial and the peer's topics (python -m swarm.probe --timeout)."""


def run_checks(config: NodeConfig) -> Iterator[Check]:
    """Every check, in the order printed, each yielded as soon as it and those before it are
    done. The children (torch's facts, the fit check, the bootstrap probes) run at once, on
    threads that wait for them: a doctor run takes about its slowest child, torch's import.
    The ports are tested before the probes start: a probe listens on the swarm port."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        facts = pool.submit(_ask_torch)
        model = pool.submit(check_model, config)
        disk, ports = check_disk(config), check_ports(config)
        listen, why_not = _reach_listen(config)
        probes = pool.submit(_bootstraps, config, listen) if config.bootstrap else None
        yield check_python()
        yield check_packages()
        yield check_torch(config, facts.result())
        yield model.result()
        yield disk
        yield ports
        if probes is None:
            yield warn("bootstrap", "none given: join needs one",
                       "pass --bootstrap /ip4/<addr>/tcp/<port>/p2p/<peer id> (ask the swarm's "
                       "operator, or start one: swarm-node bootstrap)")
            return
        lines, results = probes.result()
        yield from lines
        yield check_reachability(results, fixed_port=_fixed_port(config), not_asked=why_not)
        if results:
            yield check_clock(results, max_future_s=_max_future_s(config.gossip))


def _max_future_s(gossip: dict[str, Any]) -> float:
    """The ``[gossip.limits] max_future_s`` of the node's (checked) ``[gossip]`` table, or
    of its old flat key (``GossipConfig.MOVED_KEYS``), or the default."""
    limits = gossip.get("limits", {})
    return float(limits.get("max_future_s", gossip.get("max_future_s",
                                                       LimitsConfig.max_future_s)))


def _bootstraps(config: NodeConfig, listen: str | None) -> tuple[list[Check], list[dict[str, Any]]]:
    """The bootstrap line of each address and the probes' results, one probe after another
    (each listens on the same swarm port)."""
    lines, results = [], []
    for addr in config.bootstrap:
        check, result = _bootstrap(addr, swarm_id=config.swarm_id, listen=listen,
                                   dial_back_port=_announced_port(config))
        lines.append(check)
        if result is not None:
            results.append(result)
    return lines, results


def preflight(config: NodeConfig) -> list[Check]:
    """The FAILs `join` refuses to start with, in about a second: swarm, metrics and dashboard
    ports in use, no room for one checkpoint, a model whose training step cannot fit the
    device (``check_model``; not asked of the embedded model, a few MiB: the learner checks
    it). The collective's port is left to the learner (a dead node's p2pd may hold it; the new
    learner kills it: node/orphans.py), and nothing is checked while a node holds the data dir
    (the supervisor says so itself)."""
    from node.locks import lock_holder

    if lock_holder(config.data_dir / "node.lock") is not None:
        return []
    checks = [check_ports(config, collective=False), check_disk(config)]
    if config.model != "embedded":
        checks.append(check_model(config))
    return [c for c in checks if c.verdict is Verdict.FAIL]


# --- python and packages -------------------------------------------------------------------

def check_python() -> Check:
    have = "%d.%d.%d" % sys.version_info[:3]
    if "%d.%d" % sys.version_info[:2] in TESTED_PYTHON:
        return ok("python", f"Python {have} ({sys.executable})")
    return warn("python", f"Python {have} is untested (tested: {', '.join(TESTED_PYTHON)})",
                f"use Python {TESTED_PYTHON[-1]}: make PY=python{TESTED_PYTHON[-1]} setup")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str] | None:
    """name → pinned version of a constraints file; None if there is none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    pins = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            pins[_norm(name)] = version.strip()
    return pins


def check_packages(pins: dict[str, str] | None = None) -> Check:
    from importlib import metadata  # not at import: `join` imports this module (preflight)

    pins = read_pins() if pins is None else pins
    missing, differ = [], []
    for name in KEY_PACKAGES:
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        want = (pins or {}).get(_norm(name))
        if want is not None and want != have:
            differ.append(f"{name} {have} (pinned {want})")
    fix = "pip install -c deploy/constraints.txt -e .  (or: make setup)"
    if missing:
        return fail("packages", f"not installed: {', '.join(missing)}", fix)
    if differ:
        return warn("packages", f"untested versions: {', '.join(differ)}", fix)
    if pins is None:
        return ok("packages", f"{len(KEY_PACKAGES)} key packages installed (no "
                              "deploy/constraints.txt here to compare with)")
    return ok("packages", f"{len(KEY_PACKAGES)} key packages as pinned in deploy/constraints.txt")


# --- torch, device, memory -----------------------------------------------------------------

def torch_facts() -> dict[str, Any]:
    """What torch sees (run in a child interpreter: ``python -m node.doctor --torch-facts``)."""
    import torch

    facts: dict[str, Any] = {"version": torch.__version__, "cuda": torch.cuda.is_available(),
                             "devices": []}
    if facts["cuda"]:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts["devices"].append({"name": props.name, "memory": props.total_memory})
    return facts


def _ram() -> tuple[int, int] | None:
    """(available, total) bytes of RAM, from /proc/meminfo; None elsewhere."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return (int(info["MemAvailable"].split()[0]) * 1024,
                int(info["MemTotal"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**30:.2f} GiB"


def _ask_torch() -> dict[str, Any] | str:
    """``torch_facts()`` from a child interpreter, or why there are none."""
    try:
        out = subprocess.run([sys.executable, "-m", "node.doctor", "--torch-facts"],
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "importing torch took over 120 s"
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        return lines[-1][-200:]


def check_torch(config: NodeConfig, facts: dict[str, Any] | str | None = None) -> Check:
    """torch's version and the device `join` would use; ``facts``: ``_ask_torch()``'s answer
    when already asked (None: ask now)."""
    if facts is None:
        facts = _ask_torch()
    if isinstance(facts, str):
        return fail("torch", f"cannot use torch: {facts}",
                    "install torch: the CPU or CUDA build of your choice (README)")
    ram = _ram()
    mem = f"RAM {_gib(ram[0])} free of {_gib(ram[1])}" if ram else "RAM unknown"
    devices = facts["devices"]
    want = config.device
    if want == "cpu" or (want == "auto" and not devices):
        where = "cpu" + ("" if devices else " (no CUDA device)")
        return ok("torch", f"torch {facts['version']}, device {where}, {mem}")
    index = 0 if want in ("auto", "cuda") else int(want.split(":", 1)[1])
    if index >= len(devices):
        seen = f"{len(devices)} CUDA device(s)" if devices else "no CUDA device"
        return fail("torch", f"--device {want} but torch {facts['version']} sees {seen}",
                    "install a CUDA build of torch (README, GPU node), or --device cpu")
    dev = devices[index]
    return ok("torch", f"torch {facts['version']}, device cuda:{index} {dev['name']} "
                       f"({_gib(dev['memory'])}), {mem}")


# --- model fit -----------------------------------------------------------------------------

FIT_TIMEOUT_S = 120.0
"""Bound on ``python -m node.learner.fit`` (seconds on a CPU; a GPU's torch import may take
longer, and a hub id's config.json is downloaded)."""


def check_model(config: NodeConfig) -> Check:
    """The learner's fit check (node.learner.fit) in a child of its own, on the learner's
    table: it imports torch only where a CUDA device may be used."""
    table = learner_table(config, ipc_path="", rounds=None)["learner"]
    try:
        out = subprocess.run([sys.executable, "-m", "node.learner.fit", "--config-json",
                              json.dumps(table)], capture_output=True, text=True,
                             timeout=FIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return warn("model", f"the fit check of {config.model!r} took over {FIT_TIMEOUT_S:g} s",
                    "run `python -m node.learner.fit --config-json ...` to see why")
    try:
        result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError, TypeError, ValueError):
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        return warn("model", f"the fit check of {config.model!r} did not run: {tail[0][-200:]}",
                    "run `swarm-node doctor -v`, or report it")
    if result.get("fits") is True:
        auto = " (--model auto)" if config.model == "auto" else ""
        return ok("model", f"{result['model']}{auto} fits {result['device']}: training step "
                           f"~{_gib(result['estimate'])} of {_gib(result['available'])} "
                           "available")
    if result.get("fits") is False:
        return fail("model", str(result["problem"]), str(result["fix"]))
    return fail("model", str(result.get("error")), "--model: a Hugging Face id, a local model "
                "directory with a config.json, 'embedded' or 'auto'")


# --- disk ----------------------------------------------------------------------------------

def model_bytes(model: str) -> int | None:
    """Bytes of the model's weight files: a local directory's, or a hub id's in the local
    Hugging Face cache; 0 for the embedded model; None when not knowable without a download."""
    if model == "embedded":
        return 0
    path = Path(model).expanduser()
    if not path.is_dir():
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get(
            "HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub")
        path = hub / ("models--" + model.replace("/", "--")) / "blobs"
        if not path.is_dir():
            return None
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) or None
    weights = [f for f in path.rglob("*") if f.suffix in (".safetensors", ".bin", ".pt")]
    return sum(f.stat().st_size for f in weights) or None


def _existing(path: Path) -> Path:
    path = path.expanduser().resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(config: NodeConfig) -> Check:
    where = _existing(config.data_dir)
    free = shutil.disk_usage(where).free
    keep = int(config.learner.get("keep_checkpoints", 2))
    weights = model_bytes(config.model)
    fix = (f"free space on the filesystem of {where}, or --data-dir on a larger one "
           "(keep_checkpoints in [learner] sets how many are kept)")
    if weights is None:
        need_one, want = MIN_FREE, UNKNOWN_MODEL_FREE
        sized = f"model {config.model!r} not downloaded yet, size unknown"
    else:
        need_one = MIN_FREE + CHECKPOINT_FACTOR_MIN * weights
        want = MIN_FREE + (keep + 1) * CHECKPOINT_FACTOR * weights
        sized = f"{keep}+1 checkpoints of {config.model!r} need ~{_gib(want)}"
    detail = f"{_gib(free)} free at {where}"
    if free < need_one:
        return fail("disk", f"{detail}: not room for one checkpoint (at least "
                            f"{_gib(need_one)})", fix)
    if free < want:
        return warn("disk", f"{detail}; {sized}", fix)
    return ok("disk", f"{detail} ({sized})")


# --- ports ---------------------------------------------------------------------------------

def _host_port(maddr: str) -> tuple[int, str, int] | None:
    """(family, host, port) of /ip4|ip6/<host>/tcp/<port>...; None for anything else."""
    parts = maddr.split("/")
    if len(parts) < 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    if not parts[4].isdigit():
        return None
    family = socket.AF_INET6 if parts[1] == "ip6" else socket.AF_INET
    return family, parts[2], int(parts[4])


def _ports(config: NodeConfig, *, collective: bool) -> list[tuple[str, int, str, int]]:
    """(what, family, host, port) of every fixed port the node would listen on."""
    out = []
    for addr in config.listen:
        if (hp := _host_port(addr)) is not None:
            out.append(("swarm", *hp))
    if collective:
        from collectives.config import OuterConfig

        outer = OuterConfig.from_dict(learner_table(config, ipc_path="", rounds=None)["outer"])
        for addr in outer.transport.host_maddrs:
            if (hp := _host_port(addr)) is not None:
                out.append(("collective", *hp))
    if config.metrics_port:
        out.append(("metrics", socket.AF_INET, "0.0.0.0", config.metrics_port))
    if config.dashboard_port:
        out.append(("dashboard", socket.AF_INET, "127.0.0.1", config.dashboard_port))
    return [p for p in out if p[3] != 0]


def _bind_error(family: int, host: str, port: int) -> OSError | None:
    """Whether the port is free to listen on, tested as swarm.host.check_listen does."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def check_ports(config: NodeConfig, *, collective: bool = True) -> Check:
    """Every fixed port bindable; ``collective``: the hivemind port (swarm port + 1) too."""
    ports = _ports(config, collective=collective)
    for what, family, host, port in ports:
        e = _bind_error(family, host, port)
        if e is None:
            continue
        if e.errno == errno.EADDRINUSE:
            return fail("ports", f"port {port} ({what}, {host}) is in use", _in_use_fix(
                config, what, port))
        return fail("ports", f"cannot listen on {host}:{port} ({what}): {e.strerror}",
                    "listen on an address of this machine (or 0.0.0.0) and a port above "
                    "1023, e.g. --listen /ip4/0.0.0.0/tcp/4001")
    if not ports:
        return ok("ports", "all listen ports are 0 (the OS picks free ones)")
    return ok("ports", "free: " + ", ".join(f"{p} ({w})" for w, _, _, p in ports))


def _in_use_fix(config: NodeConfig, what: str, port: int) -> str:
    from node.locks import lock_holder

    holder = lock_holder(config.data_dir / "node.lock")
    if holder is not None:
        return (f"a node (pid {holder}) already runs on {config.data_dir}: stop it, or give "
                "this one another --data-dir and other ports")
    option = {"swarm": "--listen /ip4/0.0.0.0/tcp/<port>", "collective":
              "--listen /ip4/0.0.0.0/tcp/<port> (the collective takes that port + 1)",
              "metrics": "--metrics-port <port>", "dashboard": "--dashboard-port <port>"}[what]
    return (f"stop what holds it (ss -ltnp 'sport = :{port}' names it) or pick another: "
            f"{option}")


# --- bootstrap -----------------------------------------------------------------------------

def _dial_target(maddr: str) -> tuple[str, int] | None:
    parts = maddr.split("/")
    if len(parts) >= 5 and parts[1] in ("ip4", "ip6", "dns", "dns4", "dns6") and \
            parts[3] == "tcp" and parts[4].isdigit():
        return parts[2], int(parts[4])
    return None


def check_bootstrap(addr: str, *, swarm_id: str) -> Check:
    """TCP to the address, then ``swarm.probe``: a libp2p dial that must reach the peer id at
    the end of the address, and the (protocol version, swarm id) of its gossip topics."""
    return _bootstrap(addr, swarm_id=swarm_id, listen=None, dial_back_port=0)[0]


def _bootstrap(addr: str, *, swarm_id: str, listen: str | None,
               dial_back_port: int) -> tuple[Check, dict[str, Any] | None]:
    """``check_bootstrap``'s line and the probe's result (None when it did not run); with
    ``listen``, the probe also asks the peer to dial us back on ``dial_back_port`` (0: the
    port it listens on; ``check_reachability``)."""
    target = _dial_target(addr)
    if target is None:
        return fail("bootstrap", f"{addr}: not /ip4|ip6|dns/<host>/tcp/<port>/p2p/<id>",
                    "use the full multiaddr `swarm-node bootstrap` printed"), None
    host, port = target
    start = time.monotonic()
    try:
        socket.create_connection(target, timeout=TCP_TIMEOUT_S).close()
    except OSError as e:
        if isinstance(e, TimeoutError):
            reason = f"no answer in {TCP_TIMEOUT_S:g} s"
        else:
            reason = e.strerror or type(e).__name__
        return fail("bootstrap", f"nothing answers at {host}:{port} ({reason})",
                    "is the bootstrap peer running at that address? check it with the "
                    "swarm's operator; a firewall may block its TCP port"), None
    tcp_ms = (time.monotonic() - start) * 1000
    result = _probe(addr, listen=listen, port=dial_back_port)
    if isinstance(result, str):
        return warn("bootstrap", f"{host}:{port} answers TCP ({tcp_ms:.0f} ms); the libp2p "
                                 f"probe did not run: {result}",
                    "run `python -m swarm.probe ADDR` to see why"), None
    return _bootstrap_verdict(addr, host, port, result, swarm_id=swarm_id), \
        {**result, "peer": addr.rsplit("/p2p/", 1)[-1]}


def _bootstrap_verdict(addr: str, host: str, port: int, result: dict[str, Any], *,
                       swarm_id: str) -> Check:
    peer = addr.rsplit("/p2p/", 1)[-1]
    if not result["connected"]:
        return fail("bootstrap", f"{host}:{port} answers TCP but the libp2p dial to {peer} "
                                 f"failed: {result['error']}",
                    "check the peer id at the end of the address (a restarted bootstrap "
                    "with a new data dir has a new one) and that it is a swarm-node peer")
    swarms = [tuple(s) for s in result["swarms"]]
    ids = sorted({sid for _, sid in swarms})
    if (PROTOCOL_VERSION, swarm_id) in swarms:
        return ok("bootstrap", f"{peer[:16]}… at {host}:{port}: swarm {swarm_id!r}, protocol "
                               f"{PROTOCOL_VERSION} ({result['seconds']:.1f} s)")
    if not swarms:
        return warn("bootstrap", f"connected to {peer[:16]}… at {host}:{port} but it "
                                 f"announced no swarm-node topic within {PROBE_TIMEOUT_S:g} s",
                    "is it a swarm-node peer? ask the swarm's operator")
    if swarm_id in ids:
        theirs = sorted({v for v, sid in swarms if sid == swarm_id})
        return fail("bootstrap", f"{host}:{port} speaks protocol {theirs} of swarm "
                                 f"{swarm_id!r}, we speak {PROTOCOL_VERSION}",
                    "install the swarm-node version the swarm runs")
    return fail("bootstrap", f"{host}:{port} is in swarm {', '.join(map(repr, ids))}, we are "
                             f"in swarm {swarm_id!r}",
                f"--swarm-id {ids[0]} to join its swarm, or the address of a bootstrap peer "
                f"of {swarm_id!r}")


def _probe(addr: str, *, listen: str | None = None, port: int = 0) -> dict[str, Any] | str:
    """``python -m swarm.probe``'s result, or why there is none."""
    reach = ["--listen", listen, "--port", str(port)] if listen else []
    try:
        out = subprocess.run([sys.executable, "-m", "swarm.probe", addr,
                              "--timeout", str(PROBE_TIMEOUT_S), *reach],
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        return "timed out"
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        return tail[0][-200:]


# --- reachability --------------------------------------------------------------------------

def _reach_listen(config: NodeConfig) -> tuple[str | None, str]:
    """(where the probe listens to be dialled back: the node's first TCP listen address, or
    None; why not when None)."""
    for addr in config.listen:
        hp = _host_port(addr)
        if hp is None:
            continue
        if hp[2] and _bind_error(*hp) is not None:
            return None, f"the swarm port {hp[2]} is in use (see ports)"
        return "/".join(addr.split("/")[:5]), ""
    return None, "no /ip4 or /ip6 TCP listen address"


def _fixed_port(config: NodeConfig) -> int:
    """The swarm port of the first TCP listen address; 0 when the OS picks it."""
    for addr in config.listen:
        if (hp := _host_port(addr)) is not None:
            return hp[2]
    return 0


def _announced_port(config: NodeConfig) -> int:
    """The TCP port of the first --announce address (what the node asks peers to dial back
    on, swarm.nat), else 0: the port the probe listens on."""
    for addr in config.announce:
        parts = addr.split("/")
        if len(parts) >= 5 and parts[3] == "tcp" and parts[4].isdigit():
            return int(parts[4])
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--torch-facts"]:
        print(json.dumps(torch_facts()), flush=True)
