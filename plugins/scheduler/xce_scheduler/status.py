"""What the scheduler is doing, for operators and tests: cycle count, last cycle, dispatches.

The picker and the allocator update one :class:`SchedulerStatus` under its lock; the picker
logs it at DEBUG every ``log_interval`` seconds and writes it as JSON to ``[scheduler]
status_file`` (atomically, by rename) so process-level tests can watch the picker keep cycling
while the allocator is blocked in a reconnect.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from xcecore.metrics import Histogram

PASS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds of a full scheduling cycle."""


@dataclass
class SchedulerStatus:
    """Counters of the picker and the allocator; read with :meth:`as_dict`.

    ``cycles`` counts every picker cycle (``idle_cycles`` those that found the view unchanged),
    ``batches`` the ``jobdispatch_many`` calls the controller answered,
    ``inflight`` the proposals not yet seen leaving PEND, ``allocator_busy`` the controller
    calls the allocator is waiting on (they wait through a reconnect), ``looked`` the jobs the
    last full cycle looked at, ``view_epoch`` the syncs begun and ``view_complete`` whether
    the view is whole (no reasons are sent while it is not).
    """

    pid: int = field(default_factory=os.getpid)
    cycles: int = 0
    idle_cycles: int = 0
    last_cycle: float = 0.0
    last_cycle_seconds: float = 0.0
    pending: int = 0
    hosts: int = 0
    proposed: int = 0
    dispatched: int = 0
    refused: int = 0
    failed: int = 0
    batches: int = 0
    inflight: int = 0
    allocator_busy: int = 0
    reasons_sent: int = 0
    view_epoch: int = 0
    view_complete: bool = False
    looked: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _passes: Histogram = field(default_factory=lambda: Histogram(PASS_BUCKETS), repr=False,
                               compare=False)  # seconds of each full cycle (metrics)

    def update(self, **values: Any) -> None:
        """Set counters (``cycles=3``) under the lock."""
        with self._lock:
            for key, value in values.items():
                setattr(self, key, value)

    def add(self, **deltas: int) -> None:
        """Add to counters (``dispatched=1``) under the lock."""
        with self._lock:
            for key, delta in deltas.items():
                setattr(self, key, getattr(self, key) + delta)

    def passed(self, seconds: float) -> None:
        """A full cycle took ``seconds`` (its histogram, for ``xce_scheduler_pass_seconds``)."""
        with self._lock:
            self._passes.observe(seconds)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able copy of every counter."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def metrics(self) -> list[Any]:
        """``xce_scheduler_*`` families (at a scrape, on the exporter's thread)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            now = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
            passes = self._passes.family("xce_scheduler_pass_seconds", "seconds of each full "
                                         "scheduling cycle")
        out: list[Any] = [passes]
        for key, what in (("cycles", "scheduling cycles (idle ones included)"),
                          ("idle_cycles", "cycles that found nothing changed"),
                          ("proposed", "dispatches proposed"),
                          ("dispatched", "dispatches the controller accepted"),
                          ("refused", "dispatches the controller refused"),
                          ("failed", "dispatches that failed (no answer)"),
                          ("batches", "jobdispatch_many calls the controller answered"),
                          ("reasons_sent", "pending-reason changes sent")):
            c = CounterMetricFamily(f"xce_scheduler_{key}", what)
            c.add_metric([], float(now[key]))
            out.append(c)
        for key, what in (("pending", "pending jobs in the view"),
                          ("hosts", "hosts in the view"),
                          ("inflight", "proposals not yet seen leaving PEND"),
                          ("allocator_busy", "controller calls the allocator waits on"),
                          ("view_complete", "1 when the view is whole (synced)"),
                          ("last_cycle_seconds", "seconds the last full cycle took"),
                          ("last_cycle", "when the last cycle ran (Unix time)")):
            g = GaugeMetricFamily(f"xce_scheduler_{key}", what)
            g.add_metric([], float(now[key]))
            out.append(g)
        return out


class StatusReporter:
    """Writes the status file and the periodic DEBUG line, each at most at its own cadence."""

    def __init__(self, status: SchedulerStatus, path: str | None, log_interval: float = 5.0,
                 write_interval: float = 0.05) -> None:
        self.status = status
        self.path = Path(path) if path else None
        self.log_interval = log_interval
        self.write_interval = write_interval
        self._last_log = 0.0
        self._last_write = 0.0
        self._warned = False

    def tick(self, force: bool = False) -> None:
        """Log and write the status if their intervals have passed (or ``force``)."""
        now = time.monotonic()
        if force or now - self._last_log >= self.log_interval:
            self._last_log = now
            s = self.status.as_dict()
            logger.debug("scheduler: {} cycle(s), last {:.1f} ms ago; {} pending, {} host(s), "
                         "{} proposed, {} dispatched, {} refused, {} in flight",
                         s["cycles"], (time.time() - s["last_cycle"]) * 1000, s["pending"],
                         s["hosts"], s["proposed"], s["dispatched"], s["refused"], s["inflight"])
        if self.path is not None and (force or now - self._last_write >= self.write_interval):
            self._last_write = now
            self.write()

    def write(self) -> None:
        """Write the status file atomically; a failure is logged once, never raised."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(orjson.dumps({**self.status.as_dict(), "time": time.time()}))
            os.replace(tmp, self.path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("scheduler: cannot write status file {} ({}); going on without",
                               self.path, exc)
