"""The fault test bed's side of the operating system: tools, processes by namespace, leftovers.

Kept apart from :mod:`faultbed` (the hosts and their faults) so that each reads in one
sitting. Nothing here knows a host: only network namespaces (by inode), pids and mounts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from loguru import logger

from xcecore.log import pid_alive
from xcecore.testing import netns

PREFIX = "xfb"
TOOLS = {"ip": "iproute2", "nft": "nftables", "nsenter": "util-linux", "ss": "iproute2",
         "mount": "mount", "umount": "mount", "sysctl": "procps"}
STALE = re.compile(rf"^{PREFIX}(\d+)x\d+-")
"""A bed's names: ``xfb<pid>x<n>-<what>``; a dead pid means a crashed run left them."""


class BedError(RuntimeError):
    """The bed cannot be built here (not root, a tool missing) or a fault cannot be applied."""


def requirements() -> str | None:
    """None when this machine can run the bed; else what is missing, as a sentence."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, nftables and mounts need CAP_SYS_ADMIN/CAP_NET_ADMIN)")
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            missing.append(f"the {tool!r} command (Debian package {package})")
    if not os.path.exists("/proc/self/ns/net"):
        missing.append("Linux network namespaces")
    if not missing:
        return None
    return ("the fault test bed needs " + "; ".join(missing)
            + " (scripts/install-system-deps.sh installs the tools; CI runs as root)")


def run(cmd: Sequence[str], *, input: str | None = None, check: bool = True) -> str:
    """Run a command; its stdout (BedError with its stderr when it fails and ``check``)."""
    proc = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise BedError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def pids_in(ns_inode: int) -> list[int]:
    """Every process whose network namespace is ``ns_inode`` (never this process)."""
    out = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino == ns_inode:
                out.append(int(entry.name))
        except OSError:  # gone, or a zombie (its namespaces are already released)
            continue
    return out


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, D, T, Z...), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def clean_stale() -> list[str]:
    """Remove namespaces and mounts of beds whose process is gone; what was removed."""
    removed: list[str] = []
    names = sorted(os.listdir(netns.NETNS_DIR)) if os.path.isdir(netns.NETNS_DIR) else []
    for name in names:
        m = STALE.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            kill_all(netns.inode_of(name))
        run(["ip", "netns", "del", name], check=False)
        removed.append(f"network namespace {name}")
    for source, target in mounts():
        m = STALE.match(source + "-")
        if m is not None and not pid_alive(int(m.group(1))):
            run(["umount", "-l", target], check=False)
            removed.append(f"mount {source} on {target}")
    if removed:
        logger.warning("fault bed: removed what an earlier run left behind: {}", "; ".join(removed))
    return removed


def mounts() -> list[tuple[str, str]]:
    """(source, mount point) of every mount a bed made (its source names a bed)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(PREFIX):
            out.append((parts[0], parts[1].replace("\\040", " ")))
    return out


def kill_all(ns_inode: int, timeout: float = 10.0) -> None:
    """SIGKILL every process of a namespace until none is left (BedError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = pids_in(ns_inode)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise BedError(f"processes {pids} survive SIGKILL (uninterruptible sleep?)")
        time.sleep(0.01)  # the kernel finishes their exit; polled with a deadline
