"""The ``[worker]`` config section and the settings a running worker derives from it.

Host facts left unset (``ncpus``, ``maxmem``, ...) default to what psutil and platform see;
that lookup happens in :mod:`xce_worker.attrs`, not here, so declaring the section (which every
``xce`` command does at start) costs no psutil import.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xcecore.records import ConfigSection, Field

_S, _I, _F, _B, _L, _D = (str,), (int,), (float, int), (bool,), (list,), (dict,)

# Names a site may not reuse for its own strings/numbers: the join attributes themselves.
RESERVED = frozenset({
    "hname", "type", "model", "cpuf", "ncpus", "ncores", "nthreads", "maxmem", "maxswp",
    "maxtmp", "max_slots", "resources", "ngpus", "gpu_model", "gpu_mem",
})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check(section: dict[str, Any]) -> None:
    """Whole-section validation; a ValueError names the key and what is wrong."""
    hname = section.get("hname")
    if hname is not None and (not hname or "@" in hname or any(c.isspace() for c in hname)):
        raise ValueError(f"hname {hname!r}: must be non-empty, without '@' or spaces")
    for key in ("ncpus", "ncores", "nthreads", "slots"):
        value = section.get(key)
        if value is not None and value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    for key in ("maxmem", "maxswp", "maxtmp"):
        value = section.get(key)
        if value is not None and value < 0:
            raise ValueError(f"{key} must be >= 0, got {value}")
    for key in ("monitor_interval", "hello_interval", "cpuf"):
        if section[key] <= 0:
            raise ValueError(f"{key} must be > 0, got {section[key]}")
    parent = section["cgroup_parent"]
    if parent and (not parent.startswith("/") or ".." in parent.split("/")):
        raise ValueError(f"cgroup_parent {parent!r}: must be an absolute cgroup path without ..")
    if not section["containment"]:
        raise ValueError("containment must name a containment (or be 'auto')")
    if section["kill_grace"] < 0:
        raise ValueError(f"kill_grace must be >= 0, got {section['kill_grace']}")
    seen: dict[str, str] = {}
    for name in section["resources"]:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"resources: {name!r} is not a resource name")
        seen[name] = "resources"
    for table, kind in (("strings", str), ("numbers", (int, float))):
        for name, value in section[table].items():
            if not _NAME.match(name):
                raise ValueError(f"{table}: {name!r} is not a resource name")
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"{table}.{name}: expected {table[:-1]}, got {value!r}")
            if name in seen:
                raise ValueError(f"{table}.{name}: already defined in {seen[name]}")
            seen[name] = table
    for name, where in seen.items():
        if name in RESERVED:
            raise ValueError(f"{where}: {name!r} is a built-in host attribute")


SECTION = ConfigSection(
    "worker",
    {
        "hname": Field(_S, None, "host name to join as (default: this machine's host name)"),
        "type": Field(_S, None, "host type (default: machine architecture, e.g. X86_64)"),
        "model": Field(_S, None, "host model (default: the CPU model name)"),
        "cpuf": Field(_F, 1.0, "CPU factor: relative speed of this host"),
        "ncpus": Field(_I, None, "logical CPUs (default: psutil)"),
        "ncores": Field(_I, None, "physical cores (default: psutil)"),
        "nthreads": Field(_I, None, "hardware threads per core (default: ncpus // ncores)"),
        "maxmem": Field(_I, None, "total memory, MB (default: psutil)"),
        "maxswp": Field(_I, None, "total swap, MB (default: psutil)"),
        "maxtmp": Field(_I, None, "size of the temp file system, MB (default: psutil)"),
        "slots": Field(_I, None, "job slots (MXJ); default: ncpus"),
        "resources": Field(_L, [], "boolean resources this host has, e.g. ['gpu', 'ssd']"),
        "strings": Field(_D, {}, "string resources: name -> value"),
        "numbers": Field(_D, {}, "numeric resources: name -> value"),
        "state_dir": Field(_S, None, "spool, job ledger and job output (default: temp dir)"),
        "monitor_interval": Field(_F, 5.0, "seconds between load samples and usage reports"),
        "kill_grace": Field(_F, 10.0, "seconds between SIGTERM and SIGKILL when killing a job"),
        "hello_interval": Field(_F, 5.0, "seconds between liveness probes (hello)"),
        "keep_jobs_on_shutdown": Field(_B, True, "leave running jobs running when stopping"),
        "run_as_user": Field(_B, False, "start each job as its authenticated submitter (the "
                             "worker must run as root); off: jobs run as the worker's own user"),
        "containment": Field(_S, "auto", "job containment: auto (the best available), cgroup2, "
                             "cgroup1, fallback, or a plugin's"),
        "cgroup_parent": Field(_S, "", "cgroup under which the worker's xce-<host> group goes "
                               "(default: the worker's own cgroup)"),
        "bind_cores": Field(_B, True, "bind each job to as many distinct cores as it has "
                            "slots here (cpuset, else CPU affinity)"),
        "freezer": Field(_B, True, "stop/resume jobs through the cgroup freezer where there is "
                         "one (off: SIGSTOP/SIGCONT)"),
        "allow_root_jobs": Field(_B, False, "run jobs as root: with run_as_user, a job root "
                                 "submitted itself; without, any job of a worker running as "
                                 "root in a cluster whose auth is not 'key'"),
    },
    "the worker daemon of one compute host",
    check=_check,
)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What the running worker needs from ``[worker]``, with defaults resolved."""

    hname: str
    state_dir: Path
    monitor_interval: float
    kill_grace: float
    hello_interval: float
    keep_jobs_on_shutdown: bool
    run_as_user: bool
    containment: str = "auto"
    cgroup_parent: str = ""
    bind_cores: bool = True
    freezer: bool = True
    allow_root_jobs: bool = False

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> WorkerSettings:
        """Resolve ``section`` (already validated) into settings."""
        hname = section.get("hname") or socket.gethostname()
        state_dir = section.get("state_dir") or default_state_dir(hname)
        return cls(
            hname=hname,
            state_dir=Path(os.path.expanduser(state_dir)),
            monitor_interval=float(section.get("monitor_interval", 5.0)),
            kill_grace=float(section.get("kill_grace", 10.0)),
            hello_interval=float(section.get("hello_interval", 5.0)),
            keep_jobs_on_shutdown=bool(section.get("keep_jobs_on_shutdown", True)),
            run_as_user=bool(section.get("run_as_user", False)),
            containment=str(section.get("containment") or "auto"),
            cgroup_parent=str(section.get("cgroup_parent") or ""),
            bind_cores=bool(section.get("bind_cores", True)),
            freezer=bool(section.get("freezer", True)),
            allow_root_jobs=bool(section.get("allow_root_jobs", False)),
        )


def check_root_jobs(settings: WorkerSettings, auth: str, euid: int) -> None:
    """Refuse to start a worker that would run every user's jobs as root: running as root,
    ``run_as_user`` off, in a multi-user cluster (``auth`` not ``key``), unless
    ``allow_root_jobs`` says so. Raises ``ValueError`` naming the fix."""
    if euid == 0 and not settings.run_as_user and auth != "key" and not settings.allow_root_jobs:
        raise ValueError(
            f"worker {settings.hname}: runs as root with run_as_user = false in a cluster with "
            f"auth = {auth!r}: every user's job would run as root. Set [worker] run_as_user = "
            "true (jobs run as their submitters), run the worker as a service user, or set "
            "allow_root_jobs = true to accept it")


def default_state_dir(hname: str) -> str:
    """``<temp dir>/xce-worker-<hname>``: distinct per host name, so two workers on one
    machine posing as two hosts never share a spool."""
    return os.path.join(tempfile.gettempdir(), f"xce-worker-{hname}")
