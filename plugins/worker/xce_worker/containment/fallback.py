"""The fallback containment: a process group and session, rlimits, and sampling.

For hosts with no usable cgroups (a container without them, a kernel without them, a worker
that may not write them). Each job's wrapper starts a new session, so the job's processes
are those whose session is the wrapper's pid (a scan of ``/proc``); kill and stop signal the
process group and every process of the session.

What it cannot do, and says so in the worker's start line: a process that calls ``setsid``
(a daemon's double fork) leaves the session and escapes kill and accounting; memory is
limited per process by ``RLIMIT_DATA`` (set on the wrapper before it runs, inherited by the
job; an allocation past it fails with ENOMEM) and for the whole job by sampling (the process
manager kills the job, reason "memory limit exceeded", when the sum of its processes' RSS
passes the limit at a sample, as LSF does without cgroups); CPU time at the end comes from the
wrapper's ``wait4`` rusage (processes it waited for, directly or through its children), peak
memory from samples of the members' ``VmHWM`` (``ru_maxrss`` would report the worker's own
RSS, which the wrapper had when it was forked): a peak between two samples in a process that
ended before the next one is missed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from typing import Any

from xce_worker.containment import ContainConfig, Containment, JobGroup, Limits, Usage
from xce_worker.containment.cgroupfs import all_pids, kill_pids, proc_stat


def probe(config: ContainConfig) -> int:
    """Always available; the lowest score."""
    return 0


def build(config: ContainConfig) -> Fallback:
    """The fallback containment."""
    return Fallback(config)


class Fallback(Containment):
    """Groups that are sessions."""

    name = "fallback"

    def describe(self) -> str:
        """What it does, and what escapes it."""
        return ("fallback (process group and session, RLIMIT_DATA per process, memory limits "
                "by sampling, stop/resume by SIGSTOP/SIGCONT); a process that calls setsid "
                "escapes it")

    def create(self, key: str, limits: Limits) -> FallbackGroup:
        """A group that becomes the wrapper's session at :meth:`FallbackGroup.attach`."""
        return FallbackGroup(f"session-{key}", limits)

    def reopen(self, key: str) -> FallbackGroup | None:
        """Nothing survives a worker restart but the wrapper's pid, which the process
        manager re-adopts itself."""
        return None

    def existing(self) -> list[str]:
        """Fallback groups are not kept anywhere."""
        return []

    def adopt(self, key: str, pid: int | None) -> FallbackGroup | None:
        """The session of a re-adopted job is its wrapper's pid."""
        if pid is None:
            return None
        group = FallbackGroup(f"session-{key}", Limits())
        group.sid = pid
        return group


class FallbackGroup(JobGroup):
    """A job's session (its id is the wrapper's pid)."""

    def __init__(self, name: str, limits: Limits) -> None:
        super().__init__(name, limits)
        self.sid: int | None = None
        self._cpu = (0.0, 0.0)  # the most CPU (user, system) a sample saw

    def attach(self, pid: int) -> None:
        """Take the wrapper's session as the group; set ``RLIMIT_DATA`` on it."""
        self.sid = pid
        if self.limits.mem is not None:
            # If the kernel refuses, the sampled limit still holds: the job is not refused.
            with contextlib.suppress(OSError, ValueError):
                resource.prlimit(pid, resource.RLIMIT_DATA, (self.limits.mem, self.limits.mem))

    def pids(self) -> list[int]:
        """Processes whose session is the wrapper's (or in its process group)."""
        if self.sid is None:
            return []
        out = []
        for pid in all_pids():
            st = proc_stat(pid)
            if st is not None and st.state != "Z" and (st.session == self.sid or
                                                        st.pgrp == self.sid):
                out.append(pid)
        return out

    def signal(self, sig: int) -> int:
        """The process group first (atomic for it), then the rest of the session."""
        if self.sid is None:
            return 0
        n = 0
        try:
            os.killpg(self.sid, sig)
            n = 1
        except ProcessLookupError:
            pass
        return n + kill_pids([p for p in self.pids() if p != self.sid], sig)

    def kill(self) -> None:
        """SIGKILL the session, in rounds until nothing of it is left (bounded)."""
        for _ in range(20):
            if self.signal(signal.SIGKILL) == 0 or self.wait_empty(0.1):
                return

    def usage(self) -> Usage:
        """Summed over the session's processes (their own and waited-for children's CPU)."""
        stats = [s for s in (proc_stat(p) for p in self.pids()) if s is not None]
        pids = [s.pid for s in stats]
        u = Usage(pids=pids)
        u.utime = sum(s.utime + s.cutime for s in stats)
        u.stime = sum(s.stime + s.cstime for s in stats)
        u.mem = sum(s.rss for s in stats)
        self.sample_members(u)
        self._cpu = (max(self._cpu[0], u.utime), max(self._cpu[1], u.stime))
        return u

    def final_usage(self, rusage: Any | None) -> Usage:
        """CPU from ``wait4``'s rusage of the wrapper (every process it waited for, directly
        or through its children), against the samples; the peak memory from the samples
        (``ru_maxrss`` cannot serve: it keeps the worker's own RSS at the fork)."""
        u = Usage()
        if rusage is not None:
            u.utime, u.stime = float(rusage.ru_utime), float(rusage.ru_stime)
        u.utime, u.stime = max(u.utime, self._cpu[0]), max(u.stime, self._cpu[1])
        u.max_mem = self._peak
        return u

    def destroy(self) -> bool:
        """Nothing to remove."""
        return True
