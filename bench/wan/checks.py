"""What the WAN bed needs from the machine, and a clear sentence for each missing piece."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time

log = logging.getLogger(__name__)


class BedUnavailable(RuntimeError):
    """The machine lacks something the bed needs; ``missing`` lists each with its fix."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__("WAN bed unavailable: " + "; ".join(missing))
        self.missing = missing


def missing(*, nat: bool = False) -> list[str]:
    """Everything the bed needs that this machine lacks, each as 'what (how to get it)'."""
    out = []
    if os.geteuid() != 0:
        out.append("root (network namespaces, tc and /dev/net/tun need CAP_NET_ADMIN: run as root)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            out.append(f"{tool} (apt-get install iproute2)")
    try:
        os.close(os.open("/dev/net/tun", os.O_RDWR))
    except OSError as e:
        out.append(f"/dev/net/tun ({e.strerror}: modprobe tun; in a container run with "
                   "--device /dev/net/tun --cap-add NET_ADMIN)")
    if nat and shutil.which("iptables") is None:
        out.append("iptables, for the NAT gateways (apt-get install iptables)")
    return out


def require(*, nat: bool = False) -> None:
    """Raise :class:`BedUnavailable` unless everything the bed needs is here."""
    miss = missing(nat=nat)
    if miss:
        raise BedUnavailable(miss)


def ensure_iptables(*, timeout_s: float = 300.0) -> str | None:
    """Install Debian's iptables if it is missing and we are root with apt-get.

    Returns None when iptables is (now) there, else the reason it could not be had.
    ``timeout_s`` bounds all the apt-get runs together.
    """
    return _ensure(["iptables"], ["iptables"], timeout_s=timeout_s)


def ensure_miniupnpd(*, timeout_s: float = 300.0) -> str | None:
    """Install Debian's miniupnpd (the nftables build, matching the bed's iptables-nft) and
    nft (its tables are made with it) for the ``upnp`` gateway mode, as ``ensure_iptables``."""
    return _ensure(["miniupnpd", "nft"], ["miniupnpd-nftables", "nftables"],
                   timeout_s=timeout_s)


def _ensure(tools: list[str], packages: list[str], *, timeout_s: float) -> str | None:
    """apt-get install ``packages`` unless every one of ``tools`` is on the PATH."""
    what = " and ".join(tools)
    if all(shutil.which(t) is not None for t in tools):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{what} missing (apt-get install {' '.join(packages)})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    end = time.monotonic() + timeout_s
    for cmds in ([install], [["apt-get", "update"], install]):
        try:
            for cmd in cmds:
                log.info("running %s", " ".join(cmd))
                subprocess.run(cmd, check=True, capture_output=True, env=env,
                               timeout=max(1.0, end - time.monotonic()))
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            log.info("%s failed: %s", cmd, e)
            continue
        if all(shutil.which(t) is not None for t in tools):
            return None
    return f"{what} missing and `apt-get install {' '.join(packages)}` failed"
