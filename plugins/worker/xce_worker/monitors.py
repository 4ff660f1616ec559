"""The worker's monitors: hardware facts, load indices and job usage, each on its own thread.

``update_resvals`` replaces a host's values as a whole, so both monitors write their part to
one :class:`ResvalBoard`, which posts the merged values with ``post_latest``: the send never
blocks a monitor, and while the controller is unreachable only the newest values wait. The
board also writes them to ``<state_dir>/resvals.json`` (what ``lsload`` would show), which
lets an operator (and the tests) see the monitors keep sampling during an outage.

Load indices, in LSF's names and units: ``r15s``, ``r1m``, ``r15m`` (run-queue length,
averaged over 15 s, 1 min, 15 min), ``ut`` (CPU utilisation, 0..1), ``pg`` (paging, pages/s),
``io`` (disk I/O, KB/s), ``ls`` (login sessions), ``it`` (idle time of the most recently used
terminal, minutes), ``mem``, ``swp``, ``tmp`` (available memory, swap, temp space, MB).

Job usage (``update_jusage``, newest value kept per job) comes from each job's group
(:meth:`xce_worker.containment.JobGroup.usage`): cumulative CPU time (``utime``, ``stime``,
``cputime``, s), memory now and at its peak so far (``mem``, ``max_mem``, MB), ``swap`` where
the group accounts it, ``nprocs`` and ``pids``. The same sample enforces memory limits the
kernel does not (:meth:`xce_worker.procman.ProcessManager.sample_jobs`). A parallel job's
tasks on this host are sampled alike and posted with their task number
(:meth:`xce_worker.tasks.TaskRunner.sample`): the controller adds them to the job's live
figure. Final figures are not sampled: they come with the job's (or the task's) end report.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from loguru import logger

from xce_worker.attrs import MB, host_facts

if TYPE_CHECKING:
    from xce_worker.procman import ProcessManager

PostFn = Callable[[str, str, dict[str, Any]], None]


class ResvalBoard:
    """The host's monitor values, merged from every monitor and posted as one update."""

    def __init__(self, post: PostFn | None, state_dir: Path | None = None) -> None:
        self._post = post
        self._file = state_dir / "resvals.json" if state_dir is not None else None
        self._lock = threading.Lock()
        self._parts: dict[str, dict[str, Any]] = {}
        self.updates = 0

    def update(self, part: str, values: dict[str, Any]) -> dict[str, Any]:
        """Replace ``part``'s values and post the merged set; the merged values."""
        with self._lock:
            self._parts[part] = dict(values)
            merged: dict[str, Any] = {}
            for vals in self._parts.values():
                merged.update(vals)
            merged["sampled_at"] = round(time.time(), 3)
            self.updates += 1
            if self._file is not None:
                # Under the lock: both monitors write through the same temporary file.
                tmp = self._file.with_suffix(".tmp")
                tmp.write_bytes(orjson.dumps({"updates": self.updates, "values": merged}))
                os.replace(tmp, self._file)
        if self._post is not None:
            self._post("resvals", "update_resvals", {"values": merged})
        return merged


class LoadSampler:
    """Computes the load indices; rates are deltas since the previous sample."""

    def __init__(self, tmp_dir: str | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.tmp_dir = tmp_dir or tempfile.gettempdir()
        self._last = time.monotonic()
        self._r15s: float | None = None
        self._swap = self._swap_io()
        self._disk = self._disk_bytes()
        psutil.cpu_percent(interval=None)  # primes the counter: the first answer is from here

    def _swap_io(self) -> float:
        s = self._psutil.swap_memory()
        return float(s.sin + s.sout)

    def _disk_bytes(self) -> float:
        try:
            d = self._psutil.disk_io_counters()
        except (OSError, RuntimeError):
            return 0.0
        return float(d.read_bytes + d.write_bytes) if d is not None else 0.0

    @staticmethod
    def _procs_running() -> float | None:
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("procs_running"):
                        return max(0.0, float(line.split()[1]) - 1.0)  # minus this sampler
        except (OSError, ValueError, IndexError):
            pass
        return None

    def _idle_minutes(self, users: list[Any]) -> float:
        now = time.time()
        idle = None
        for u in users:
            if not u.terminal:
                continue
            try:
                atime = os.stat(os.path.join("/dev", u.terminal)).st_atime
            except OSError:
                continue
            idle = min(idle, now - atime) if idle is not None else now - atime
        if idle is None:  # nobody logged in on a terminal: idle since boot
            idle = now - self._psutil.boot_time()
        return round(max(0.0, idle) / 60.0, 1)

    def sample(self) -> dict[str, Any]:
        """One sample of every load index."""
        ps = self._psutil
        now = time.monotonic()
        dt = max(now - self._last, 1e-3)
        self._last = now
        r1m, _r5m, r15m = os.getloadavg()
        running = self._procs_running()
        if running is None or self._r15s is None:
            self._r15s = r1m
        else:  # exponential average with a 15 s time constant, like LSF's r15s
            self._r15s += (1.0 - math.exp(-dt / 15.0)) * (running - self._r15s)
        swap, disk = self._swap_io(), self._disk_bytes()
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        pg = max(0.0, swap - self._swap) / page / dt
        io = max(0.0, disk - self._disk) / 1024.0 / dt
        self._swap, self._disk = swap, disk
        users = ps.users()
        try:
            tmp = ps.disk_usage(self.tmp_dir).free / MB
        except OSError:
            tmp = 0.0
        return {
            "r15s": round(self._r15s, 2), "r1m": round(r1m, 2), "r15m": round(r15m, 2),
            "ut": round(ps.cpu_percent(interval=None) / 100.0, 3),
            "pg": round(pg, 1), "io": round(io, 1), "ls": len(users),
            "it": self._idle_minutes(users),
            "mem": round(ps.virtual_memory().available / MB, 1),
            "swp": round(ps.swap_memory().free / MB, 1), "tmp": round(tmp, 1),
        }


def _loop(name: str, hname: str, interval: float, stop: threading.Event,
          tick: Callable[[], object]) -> None:
    """Run ``tick`` every ``interval`` until ``stop``; a failed tick is logged, not fatal."""
    logger.info("worker {}: {} monitor started (every {:g} s)", hname, name, interval)
    while True:
        try:
            tick()
        except Exception:
            logger.opt(exception=True).error("worker {}: {} monitor sample failed; next in "
                                             "{:g} s", hname, name, interval)
        if stop.wait(interval):
            break
    logger.info("worker {}: {} monitor stopped", hname, name)


def hardware_monitor(board: ResvalBoard, hname: str, interval: float,
                     stop: threading.Event, facts: Callable[[], dict[str, Any]] = host_facts) -> None:
    """Static facts (ncpus, maxmem, ...): sampled rarely, as hardware seldom changes.

    ``facts`` gives them; the worker passes :func:`xce_worker.attrs.host_view` of its section,
    so configured values replace what the hardware says.
    """
    _loop("hardware", hname, interval, stop, lambda: board.update("hardware", facts()))


def system_monitor(board: ResvalBoard, hname: str, interval: float,
                   stop: threading.Event, sampler: LoadSampler | None = None) -> None:
    """Load indices every ``interval`` seconds."""
    sampler = sampler or LoadSampler()
    _loop("system", hname, interval, stop, lambda: board.update("load", sampler.sample()))


def jobs_monitor(procman: ProcessManager, hname: str, interval: float,
                 stop: threading.Event, tasks: Callable[[], object] | None = None) -> None:
    """Each running job's usage every ``interval`` seconds (and the sampled memory limits),
    and with ``tasks`` (:meth:`xce_worker.tasks.TaskRunner.sample`) each running task's."""
    def tick() -> None:
        procman.sample_jobs()
        if tasks is not None:
            tasks()

    _loop("jobs", hname, interval, stop, tick)
