"""WanBed: hosts in network namespaces joined by the delay router, with tbf and NAT.

Layout of one bed (tag T, every name starts with ``swnwT-``; nothing is created in the
root namespace):

    swnwT-_core     runs the delay router (bench/wan/router.py); owns one TUN per port
    swnwT-NAME      a host; public: its TUN ``swnwt`` (ADDR/16) is its only link;
                    NATed: a veth ``swnwh`` (192.168.K.2/24, default via .1) to its gateway
    swnwT-_gw-NAME  the NAT gateway of a NATed host: TUN ``swnwt`` (public ADDR/16), veth
                    ``swnwg`` (192.168.K.1/24), ip_forward=1, MASQUERADE out of the TUN as
                    its ``nat_mode`` says (``NAT_MODES``)

Rate limit: ``tbf`` on the host's egress link (the TUN, or the veth behind a NAT).
State of live beds: /tmp/swnwan/T.json (read by ``python -m bench.wan status|down``).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checks import BedUnavailable, require

log = logging.getLogger(__name__)

PREFIX = "swnw"
STATE_DIR = Path("/tmp/swnwan")
REPO = Path(__file__).resolve().parents[2]
TUN = "swnwt"
MINIUPNPD_HTTP_PORT = 5000
"""Where a ``upnp`` gateway's miniupnpd serves IGD control (on the LAN veth only)."""
_UPNP_NFT = """
table inet swnw_upnp {
    chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }
    chain miniupnpd { }
    chain prerouting { type nat hook prerouting priority -100; policy accept;
                       jump prerouting_miniupnpd; }
    chain postrouting { type nat hook postrouting priority 100; policy accept;
                        jump postrouting_miniupnpd; }
    chain prerouting_miniupnpd { }
    chain postrouting_miniupnpd { }
}
"""
_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_TAG = re.compile(r"^[a-z0-9]{1,6}$")


class BedError(RuntimeError):
    """A command that builds or tears down the bed failed (its stderr is in the message)."""


@dataclass(frozen=True, kw_only=True)
class NatMode:
    """What a NAT gateway does, as iptables rules in its namespace.

    Linux MASQUERADE keeps an inside host's source port whenever that leaves the 5-tuple
    unique, so the mapping is endpoint-independent in practice (what TCP hole punching
    needs); conntrack lets in only replies to a mapping (address-and-port-dependent
    filtering). What differs between home routers is what they do with the rest."""

    masquerade: tuple[str, ...] = ()
    """Extra MASQUERADE options (``--random-fully``: a random external port per connection,
    a symmetric NAT)."""
    drop_unsolicited: bool = False
    """Drop inbound connection attempts that match no mapping silently (most home routers);
    False: the gateway's kernel answers them with a TCP RST (Linux's default)."""
    upnp: bool = False
    """Run Debian's miniupnpd (``miniupnpd-nftables``, the backend that matches the bed's
    iptables-nft) on the LAN side: hosts behind the gateway may map ports (UPnP-IGD, secure
    mode: only to their own address). miniupnpd 2.3.1 refuses to forward when the WAN
    address is private, so such a bed needs a public-looking subnet (``subnet="11.213"``)."""


NAT_MODES: dict[str, NatMode] = {
    "masquerade": NatMode(),
    "home": NatMode(drop_unsolicited=True),
    "symmetric": NatMode(masquerade=("--random-fully",), drop_unsolicited=True),
    "upnp": NatMode(drop_unsolicited=True, upnp=True),
}
"""Gateway modes by name (``HostSpec.nat_mode``). ``masquerade``: plain MASQUERADE, an
unsolicited SYN is answered with RST (the bed's original NAT); ``home``: port-preserving
MASQUERADE that drops unsolicited inbound (the common home router: a hole punch's early SYN
is dropped and retransmitted instead of resetting the other side); ``symmetric``: a new
random external port per connection (port prediction fails: punching must fail, the relay
carries on); ``upnp``: ``home`` plus a UPnP-IGD server (miniupnpd) a host may map ports on."""


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """One host of the bed."""

    name: str
    """Short name, ``[a-z][a-z0-9]{0,7}``; the namespace is ``swnw<tag>-<name>``."""
    delay_ms: float = 0.0
    """One-way delay added to every packet leaving and every packet entering this host:
    RTT(a, b) = 2 * (delay_a + delay_b). :func:`hosts` derives it from a pairwise RTT."""
    jitter_ms: float = 0.0
    """Half-width of the uniform jitter added to each packet's delay (order is kept)."""
    rate_mbit: float | None = None
    """Upload limit (tbf on the host's egress), Mbit/s; None: unlimited."""
    nat: bool = False
    """Put the host behind its own NAT gateway: it can dial out, nobody can dial in."""
    nat_mode: str = "masquerade"
    """What that gateway does: a key of ``NAT_MODES``."""

    def __post_init__(self) -> None:
        if self.nat_mode not in NAT_MODES:
            raise ValueError(f"nat_mode: {self.nat_mode!r} not one of {sorted(NAT_MODES)}")
        if not _NAME.match(self.name) or self.name == "core":
            raise ValueError(f"name: {self.name!r} must match {_NAME.pattern}, not 'core'")
        if not 0 <= self.delay_ms <= 1000:
            raise ValueError(f"delay_ms: {self.delay_ms} not in [0, 1000]")
        if not 0 <= self.jitter_ms <= self.delay_ms + 1e-9:
            raise ValueError(f"jitter_ms: {self.jitter_ms} not in [0, delay_ms]")
        if self.rate_mbit is not None and not 0.1 <= self.rate_mbit <= 10000:
            raise ValueError(f"rate_mbit: {self.rate_mbit} not in [0.1, 10000]")


def hosts(names: int | Sequence[str], *, rtt_ms: float = 0.0, jitter_ms: float = 0.0,
          rate_mbit: float | None = None, nat: Sequence[str] = (),
          nat_mode: str = "masquerade") -> list[HostSpec]:
    """Hosts with the same access link: any two of them see ``rtt_ms`` between them, each
    packet's one-way delay varying by up to +-``jitter_ms``; ``nat`` names the NATed ones,
    whose gateways all work as ``nat_mode`` says (``NAT_MODES``)."""
    if isinstance(names, int):
        names = [f"h{i}" for i in range(names)]
    unknown = set(nat) - set(names)
    if unknown:
        raise ValueError(f"nat: {sorted(unknown)} are not among the hosts")
    return [HostSpec(name=n, delay_ms=rtt_ms / 4, jitter_ms=jitter_ms / 2, rate_mbit=rate_mbit,
                     nat=n in nat, nat_mode=nat_mode) for n in names]


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise BedError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_beds_made = itertools.count()


def default_tag() -> str:
    """Unique among live processes: the pid in 5 base-36 digits, then a per-process count."""
    n, digits = os.getpid(), ""
    for _ in range(5):  # pid_max <= 2**22 < 36**5
        n, d = divmod(n, 36)
        digits = _B36[d] + digits
    return digits + _B36[next(_beds_made) % 36]


class WanBed:
    """A WAN bed; use as a context manager (or ``up()`` then ``close()``).

    specs: the hosts. tag: names are ``swnw<tag>-*`` (default: unique per process).
    mtu: of every link (1500 as on the internet). subnet: two octets; hosts get
    ``<subnet>.0.<i+1>``. tbf_latency_ms: how long tbf queues before it drops.
    seed: of the jitter. owner_pid: the router exits once this process is gone (default:
    the caller; None: never, for ``python -m bench.wan up``).
    """

    def __init__(self, specs: Sequence[HostSpec], *, tag: str | None = None, mtu: int = 1500,
                 subnet: str = "10.213", tbf_latency_ms: float = 50.0, seed: int = 0,
                 owner_pid: int | None = -1) -> None:
        names = [s.name for s in specs]
        if not specs or len(set(names)) != len(names) or len(specs) > 250:
            raise ValueError(f"specs: need 1..250 hosts with distinct names, got {names}")
        self.tag = tag or default_tag()
        if not _TAG.match(self.tag):
            raise ValueError(f"tag: {self.tag!r} must match {_TAG.pattern}")
        if not 576 <= mtu <= 65000:
            raise ValueError(f"mtu: {mtu} not in [576, 65000]")
        if not re.match(r"^\d{1,3}\.\d{1,3}$", subnet):
            raise ValueError(f"subnet: {subnet!r} must be two octets like '10.213'")
        if any(s.nat and NAT_MODES[s.nat_mode].upnp for s in specs) and \
                not ipaddress.ip_address(f"{subnet}.0.1").is_global:
            raise ValueError(f"subnet: {subnet!r} is private, and miniupnpd 2.3.1 forwards no "
                             "port on a private WAN address: use a public-looking one like "
                             "'11.213' (the bed's addresses never leave its namespaces)")
        self.specs = {s.name: s for s in specs}
        self.mtu, self.subnet, self.tbf_latency_ms, self.seed = mtu, subnet, tbf_latency_ms, seed
        self.owner_pid = os.getpid() if owner_pid == -1 else owner_pid
        self.prefix_ = f"{PREFIX}{self.tag}-"
        self._router: subprocess.Popen[str] | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._index = {n: i for i, n in enumerate(names)}

    # --- addresses and names ---------------------------------------------------------
    def ns(self, name: str) -> str:
        """Namespace of host ``name``."""
        self._spec(name)
        return self.prefix_ + name

    def gateway_ns(self, name: str) -> str:
        """Namespace of the NAT gateway in front of ``name`` (ValueError if not NATed)."""
        if not self._spec(name).nat:
            raise ValueError(f"name: {name} is not behind a NAT")
        return f"{self.prefix_}_gw-{name}"

    def addr(self, name: str) -> str:
        """The host's own IPv4 address (bind/listen here)."""
        k = self._index[self._spec(name).name]
        return f"192.168.{k}.2" if self.specs[name].nat else self.public_addr(name)

    def public_addr(self, name: str) -> str:
        """Address the others reach this host by: its own, or its NAT gateway's."""
        return f"{self.subnet}.0.{self._index[self._spec(name).name] + 1}"

    def prefix(self, name: str) -> list[str]:
        """Command prefix that runs a program inside host ``name``."""
        return ["ip", "netns", "exec", self.ns(name)]

    def rtt_ms(self, a: str, b: str) -> float:
        """Configured RTT between two hosts (without jitter)."""
        return 2 * (self._spec(a).delay_ms + self._spec(b).delay_ms)

    def _spec(self, name: str) -> HostSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise ValueError(f"name: no host {name!r} in this bed") from None

    # --- running programs ------------------------------------------------------------
    def run_in(self, name: str, argv: Sequence[str], **popen_kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside host ``name``; the bed stops it on close if still running."""
        p = subprocess.Popen([*self.prefix(name), *argv], **popen_kw)
        self._procs.append(p)
        return p

    def run(self, name: str, argv: Sequence[str], *, timeout: float = 60.0,
            **run_kw: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside host ``name`` to completion."""
        return subprocess.run([*self.prefix(name), *argv], timeout=timeout, **run_kw)

    def router_stats(self) -> dict[str, int]:
        """Counters of the delay router (forwarded, bytes, drops, max_queue), ~1 s old."""
        try:
            return json.loads(self._stats_path.read_text())
        except (OSError, ValueError):
            return {}

    @property
    def router_pid(self) -> int | None:
        """Pid of the delay router process (None before ``up`` and after ``close``)."""
        return self._router.pid if self._router is not None else None

    @property
    def _stats_path(self) -> Path:
        return STATE_DIR / f"{self.tag}.stats.json"

    # --- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> WanBed:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def up(self) -> None:
        """Build the bed; on any failure, remove what was built and raise."""
        require(nat=any(s.nat for s in self.specs.values()))
        down(self.tag)  # leftovers of a crashed bed with this tag
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        log.info("WAN bed %s up: %s", self.tag, self.describe())

    def _build(self) -> None:
        core = self.prefix_ + "_core"
        spaces = [core] + [self.ns(n) for n in self.specs]
        spaces += [self.gateway_ns(n) for n, s in self.specs.items() if s.nat]
        for ns in spaces:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        STATE_DIR.mkdir(exist_ok=True)
        self._write_state(spaces)
        ports = [{"tun": f"{TUN}{i}", "addr": self.public_addr(n), "delay_ms": s.delay_ms,
                  "jitter_ms": s.jitter_ms} for i, (n, s) in enumerate(self.specs.items())]
        cfg = {"ports": ports, "seed": self.seed, "owner_pid": self.owner_pid,
               "stats": str(self._stats_path)}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        errlog = open(STATE_DIR / f"{self.tag}.router.log", "ab")
        self._router = subprocess.Popen(
            ["ip", "netns", "exec", core, sys.executable, "-m", "bench.wan.router",
             json.dumps(cfg)], stdout=subprocess.PIPE, stderr=errlog, text=True, cwd=REPO,
            env=env, start_new_session=True)
        errlog.close()
        self._write_state(spaces)
        assert self._router.stdout is not None
        ready, _, _ = select.select([self._router.stdout], [], [], 15.0)
        if not ready or self._router.stdout.readline().strip() != "ready":
            err = (STATE_DIR / f"{self.tag}.router.log").read_text(errors="replace")[-2000:]
            raise BedError(f"delay router did not start: {err}")
        for i, (name, spec) in enumerate(self.specs.items()):
            outer = self.gateway_ns(name) if spec.nat else self.ns(name)
            sh("ip", "-n", core, "link", "set", f"{TUN}{i}", "netns", outer, "name", TUN)
            sh("ip", "-n", outer, "link", "set", TUN, "mtu", str(self.mtu), "up")
            sh("ip", "-n", outer, "addr", "add", f"{self.public_addr(name)}/16", "dev", TUN)
            if spec.nat:
                self._nat(name, outer)
            self._tbf(self.ns(name), "swnwh" if spec.nat else TUN, spec.rate_mbit)

    def _nat(self, name: str, gw: str) -> None:
        host, k = self.ns(name), self._index[name]
        sh("ip", "-n", gw, "link", "add", "swnwg", "type", "veth", "peer", "name", "swnwh",
           "netns", host)
        sh("ip", "-n", gw, "addr", "add", f"192.168.{k}.1/24", "dev", "swnwg")
        sh("ip", "-n", host, "addr", "add", f"192.168.{k}.2/24", "dev", "swnwh")
        for ns, dev in ((gw, "swnwg"), (host, "swnwh")):
            sh("ip", "-n", ns, "link", "set", dev, "mtu", str(self.mtu), "up")
        sh("ip", "-n", host, "route", "add", "default", "via", f"192.168.{k}.1")
        sh("ip", "netns", "exec", gw, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        mode = NAT_MODES[self.specs[name].nat_mode]
        sh("ip", "netns", "exec", gw, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", TUN,
           "-j", "MASQUERADE", *mode.masquerade)
        if mode.drop_unsolicited:  # a SYN in a mapping's reply direction is not NEW: let in
            sh("ip", "netns", "exec", gw, "iptables", "-A", "INPUT", "-i", TUN, "-m",
               "conntrack", "--ctstate", "NEW", "-j", "DROP")
        if mode.upnp:  # its DNAT'd SYNs are forwarded, not INPUT: the DROP above spares them
            self._miniupnpd(name, gw)

    def _miniupnpd(self, name: str, gw: str) -> None:
        """miniupnpd in ``gw``, serving the LAN veth; ready once its HTTP port listens."""
        if shutil.which("miniupnpd") is None or shutil.which("nft") is None:
            raise BedUnavailable(["miniupnpd and nft, for the upnp gateway mode "
                                  "(apt-get install miniupnpd-nftables nftables)"])
        # the table and chains miniupnpd fills (it creates none itself); the forward policy
        # stays accept (Debian's nft_init.sh drops, which would cut the NAT's own traffic)
        r = subprocess.run(["ip", "netns", "exec", gw, "nft", "-f", "-"], input=_UPNP_NFT,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise BedError(f"nft in {gw} failed: {r.stderr.strip()}")
        k = self._index[name]
        base = STATE_DIR / f"{self.tag}.{name}.miniupnpd"
        conf = f"{base}.conf"
        Path(conf).write_text("\n".join([
            f"ext_ifname={TUN}", "listening_ip=swnwg", f"port={MINIUPNPD_HTTP_PORT}",
            "enable_upnp=yes", "enable_natpmp=no", "secure_mode=yes", "system_uptime=no",
            "upnp_table_name=swnw_upnp", "upnp_nat_table_name=swnw_upnp",
            "upnp_forward_chain=miniupnpd", "upnp_nat_chain=prerouting_miniupnpd",
            "upnp_nat_postrouting_chain=postrouting_miniupnpd",
            f"uuid=4e5c3b2a-1d0f-4c8b-9a7e-{k:012d}",
            f"allow 1024-65535 192.168.{k}.0/24 1024-65535", "deny 0-65535 0.0.0.0/0 0-65535",
            ""]))
        log = open(f"{base}.log", "ab")
        self._procs.append(subprocess.Popen(
            ["ip", "netns", "exec", gw, "miniupnpd", "-d", "-f", conf, "-P", f"{base}.pid"],
            stdout=log, stderr=log, start_new_session=True))
        log.close()
        deadline = time.monotonic() + 10
        while f":{MINIUPNPD_HTTP_PORT} " not in sh("ip", "netns", "exec", gw, "ss", "-ltnH",
                                                  check=False).stdout:
            if time.monotonic() > deadline or self._procs[-1].poll() is not None:
                err = Path(f"{base}.log").read_text(errors="replace")[-2000:]
                raise BedError(f"miniupnpd in {gw} did not start: {err}")
            time.sleep(0.1)

    def _tbf(self, ns: str, dev: str, rate_mbit: float | None) -> None:
        if rate_mbit is None:
            return
        burst = max(2 * self.mtu + 1000, int(rate_mbit * 1e6 / 8 / 250), 16000)
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
           f"{rate_mbit}mbit", "burst", str(burst), "latency", f"{self.tbf_latency_ms}ms")

    def _write_state(self, spaces: list[str]) -> None:
        state = {"tag": self.tag, "owner_pid": self.owner_pid, "namespaces": spaces,
                 "router_pid": self._router.pid if self._router else None,
                 "created": time.time(), "hosts": self.describe()}
        tmp = STATE_DIR / f"{self.tag}.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, STATE_DIR / f"{self.tag}.json")

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per host: namespace, address, public address, NAT, delay, jitter, rate."""
        return {n: {"ns": self.ns(n), "addr": self.addr(n), "public_addr": self.public_addr(n),
                    "nat": s.nat, "nat_mode": s.nat_mode if s.nat else None,
                    "delay_ms": s.delay_ms, "jitter_ms": s.jitter_ms,
                    "rate_mbit": s.rate_mbit} for n, s in self.specs.items()}

    def close(self) -> None:
        """Stop every program started in the bed, the router, and delete the namespaces."""
        for p in self._procs:
            _stop(p)
        self._procs.clear()
        if self._router is not None:
            _stop(self._router)
            self._router = None
        down(self.tag)


def _stop(p: subprocess.Popen[Any], grace_s: float = 3.0) -> None:
    """Terminate (then kill) ``p`` and close the pipes the bed's caller asked for."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(grace_s)
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def instances() -> dict[str, dict[str, Any]]:
    """Live or leftover beds by tag: from the state files and the namespace names."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        if f.name.endswith(".stats.json"):
            continue
        try:
            out[f.stem] = json.loads(f.read_text())
        except (OSError, ValueError):
            out[f.stem] = {"tag": f.stem}
    for ns in _namespaces():
        m = re.match(rf"^{PREFIX}([a-z0-9]+)-", ns)
        if m:
            out.setdefault(m.group(1), {"tag": m.group(1)}).setdefault("present", []).append(ns)
    for info in out.values():
        router = info.get("router_pid")
        info["router_alive"] = bool(router) and _is_router(int(router))
    return out


def _is_router(pid: int) -> bool:
    try:
        return b"bench.wan.router" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stale() -> list[str]:
    """Tags of beds whose delay router is gone (their owner crashed): safe to ``down``."""
    return [tag for tag, info in instances().items() if not info["router_alive"]]


def _namespaces() -> list[str]:
    r = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def down(tag: str) -> list[str]:
    """Remove bed ``tag``: its router, every process inside its namespaces, the namespaces.

    Touches only names starting with ``swnw<tag>-``; returns the namespaces removed.
    """
    if not _TAG.match(tag):
        raise ValueError(f"tag: {tag!r} must match {_TAG.pattern}")
    state_file = STATE_DIR / f"{tag}.json"
    try:
        router_pid = json.loads(state_file.read_text()).get("router_pid")
    except (OSError, ValueError):
        router_pid = None
    if router_pid and _is_router(int(router_pid)):  # never a recycled pid
        _kill_pid(int(router_pid))
    ours = [ns for ns in _namespaces() if ns.startswith(f"{PREFIX}{tag}-")]
    for ns in ours:
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            _kill_pid(int(pid))
    for ns in ours:
        sh("ip", "netns", "del", ns, check=False)
    for suffix in (".json", ".stats.json", ".router.log"):
        (STATE_DIR / f"{tag}{suffix}").unlink(missing_ok=True)
    for f in STATE_DIR.glob(f"{tag}.*.miniupnpd.*") if STATE_DIR.exists() else []:
        f.unlink(missing_ok=True)
    return ours
