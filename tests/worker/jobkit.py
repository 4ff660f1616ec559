"""Shared helpers of the job-execution tests: a process manager on a chosen containment, job
records, waiting for end reports, and cgroup lookups for assertions."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from xce_worker.containment import ContainConfig, Containment, builtin_specs, select
from xce_worker.containment.cgroupfs import parse_mountinfo
from xce_worker.monitors import jobs_monitor
from xce_worker.procman import ProcessManager
from xce_worker.spool import Journal

from xcecore.testing import wait_for

PY = sys.executable
MB = 1024 * 1024


def need_root() -> None:
    """Cgroup tests fail (never skip) without root, naming what they need."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it makes real cgroups (CI runs as root)")


def have_cgroup(version: int, controller: str | None = None) -> bool:
    """True if a cgroup hierarchy of ``version`` (with ``controller``, for v1) is mounted."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = parse_mountinfo(fh.read())
    return any(m.version == version and (controller is None or controller in m.controllers)
               for m in mounts)


def containment(kind: str, hname: str) -> Containment:
    """The built-in containment ``kind``, for a worker posing as ``hname``."""
    specs = {s.name: s for s in builtin_specs()}
    return select(specs, kind, ContainConfig(hname, instance=uuid.uuid4().hex[:8]))


def job(jobid: int, command: str, host: str = "h1", **kw: Any) -> dict[str, Any]:
    """A dispatched job record for ``host``."""
    return {"jobid": jobid, "attempt": 0, "command": command, "state": "RUN",
            "alloc": [{"host": host, "ntasks": 1}], "cwd": "", "env": {}, **kw}


def notes(pm: ProcessManager, jobid: int) -> list[dict[str, Any]]:
    """The reports of ``jobid`` spooled so far."""
    return [n.args for n in pm.journal.pending() if n.args["jobid"] == jobid]


def ended(pm: ProcessManager, jobid: int, timeout: float = 30) -> dict[str, Any]:
    """Wait for the end report of ``jobid``."""
    def end() -> dict[str, Any] | None:
        return next((a for a in notes(pm, jobid) if a["event"] in ("finish", "fail")), None)
    result: dict[str, Any] = wait_for(end, timeout, what=f"end of job {jobid}")
    return result


def text_of(path: Path) -> str:
    """The file's text, or "" while the job has not made it yet."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def is_dead(pid: int) -> bool:
    """True if ``pid`` is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def group_dirs(c: Containment) -> list[Path]:
    """Every job group directory of containment ``c`` that exists now."""
    return [p for base in c.bases() if base.is_dir() for p in base.iterdir() if p.is_dir()]


@contextmanager
def manager(tmp_path: Path, kind: str, *, sample: float | None = 0.05, hname: str = "h1",
            kill_grace: float = 0.5, **kw: Any) -> Iterator[ProcessManager]:
    """A process manager on containment ``kind`` with its jobs monitor running every
    ``sample`` seconds; on exit every job is killed and every group it made is removed
    (asserted: a group left behind fails the test)."""
    c = containment(kind, hname)
    pm = ProcessManager(hname, Journal(tmp_path / "state" / "journal.jsonl"), tmp_path / "state",
                        kill_grace=kill_grace, containment=c,
                        post=lambda k, op, a: posts.append((k, op, a)), **kw)
    posts: list[tuple[str, str, dict[str, Any]]] = []
    pm.posts = posts  # type: ignore[attr-defined]
    stop = threading.Event()
    sampler = None
    if sample is not None:
        sampler = threading.Thread(target=jobs_monitor, args=(pm, hname, sample, stop),
                                   daemon=True)
        sampler.start()
    try:
        yield pm
    finally:
        stop.set()
        pm.shutdown(keep_jobs=False, timeout=10)
        if sampler is not None:
            sampler.join(5)
        left = group_dirs(c)
        for base in c.bases():
            from xce_worker.containment import remove_groups

            remove_groups(base)
        assert not left, f"job groups left behind: {left}"
        assert not any(b.exists() for b in c.bases()), "the worker's base group was not removed"
