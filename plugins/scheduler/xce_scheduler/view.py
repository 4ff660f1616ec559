"""The scheduler's view of the cluster: pending jobs, hosts, queues and cluster config.

Fed by the controller's pushes (``xce_push``, on the event loop): a ``state`` push replaces the
whole view, deltas update it. The picker thread reads it through :meth:`SchedulerView.snapshot`.
Records are never mutated in place (a delta replaces a record with a new dict), so a snapshot
is a set of shallow copies taken under a short lock and stays consistent after it is released.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

Record = dict[str, Any]

RUNNING_STATES = frozenset({"RUN", "USUSP", "SSUSP"})


@dataclass(frozen=True, slots=True)
class ViewSnapshot:
    """A consistent copy of the view for one picker cycle."""

    version: int
    epoch: int
    pending: tuple[Record, ...]
    hosts: Mapping[str, Record]
    queues: Mapping[str, Record]
    resources: tuple[Any, ...]
    cluster: Mapping[str, Any] = field(default_factory=dict)
    load_version: int = 0
    by_queue: Mapping[str, QueueJobs] = field(default_factory=dict)
    pending_ids: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class QueueJobs:
    """The pending jobs of one queue; ``version`` changes whenever any of them changes (a
    job added, removed or replaced), so a picker can reuse what it derived from them."""

    version: int
    jobs: tuple[Record, ...]


def free_slots(host: Mapping[str, Any]) -> int:
    """Slots of ``host`` not used by running jobs (never negative)."""
    try:
        return max(0, int(host.get("max_slots", 0)) - int(host.get("used_slots", 0)))
    except (TypeError, ValueError):
        return 0


class SchedulerView:
    """Thread-safe view of what the scheduler may dispatch, updated from pushes.

    ``version`` grows with every change but load values (``load_version`` counts those),
    ``epoch`` with every full ``state`` (every join and re-join). ``wake`` is set when a
    change may let a job be dispatched now (a new pending job, freed slots, a host or queue
    opened), so the picker does not wait for its next tick.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict[int, Record] = {}
        # The same jobs per queue, with a version per queue and its tuple built on demand: a
        # picker skips (or reuses the order of) queues whose jobs did not change, so 10,000
        # jobs parked in an inactive queue cost nothing per cycle.
        self._by_queue: dict[str, dict[int, Record]] = {}
        self._queue_version: dict[str, int] = {}
        self._queue_tuple: dict[str, QueueJobs] = {}
        self._changes = 0
        self.hosts: dict[str, Record] = {}
        self.queues: dict[str, Record] = {}
        self.cluster: dict[str, Any] = {}
        self.resources: tuple[Any, ...] = ()
        self.version = 0
        self.load_version = 0
        self.epoch = 0
        self.wake = threading.Event()

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> ViewSnapshot:
        """A consistent copy for one picker cycle (O(jobs + hosts) reference copies)."""
        with self._lock:
            by_queue: dict[str, QueueJobs] = {}
            for name, jobs in self._by_queue.items():
                cached = self._queue_tuple.get(name)
                version = self._queue_version[name]
                if cached is None or cached.version != version:
                    cached = self._queue_tuple[name] = QueueJobs(version, tuple(jobs.values()))
                by_queue[name] = cached
            return ViewSnapshot(
                self.version,
                self.epoch,
                tuple(self.pending.values()),
                dict(self.hosts),
                dict(self.queues),
                self.resources,
                dict(self.cluster),
                self.load_version,
                by_queue,
                frozenset(self.pending),
            )

    # ------------------------------------------------------------------ the pending index
    def _put_pending(self, job: Record) -> None:
        jobid = job["jobid"]
        old = self.pending.get(jobid)
        if old is not None and old.get("queue", "") != job.get("queue", ""):
            self._drop_pending(jobid)
        self.pending[jobid] = job
        name = job.get("queue", "")
        self._by_queue.setdefault(name, {})[jobid] = job
        self._bump(name)

    def _drop_pending(self, jobid: int) -> None:
        job = self.pending.pop(jobid, None)
        if job is None:
            return
        name = job.get("queue", "")
        jobs = self._by_queue.get(name)
        if jobs is not None:
            jobs.pop(jobid, None)
            if not jobs:
                del self._by_queue[name]
                self._queue_tuple.pop(name, None)
        self._bump(name)

    def _bump(self, name: str) -> None:
        self._changes += 1  # one counter for all queues: a version is never reused
        self._queue_version[name] = self._changes

    def pend_reason(self, jobid: int) -> str | None:
        """The pend reason the controller last pushed for ``jobid`` (None if none or gone)."""
        with self._lock:
            job = self.pending.get(jobid)
            return None if job is None else job.get("pend_reason")

    # ------------------------------------------------------------------ pushes
    def apply(self, event: str, data: Any) -> None:
        """Apply one push; unknown events and malformed data are logged and ignored."""
        handler = _HANDLERS.get(event)
        if handler is None:
            return
        try:
            with self._lock:
                woke = handler(self, data)
                # Load values change all the time; the picker re-reads them on its slower
                # load cadence, so they do not count as a change of what can be scheduled.
                if event == "resvals":
                    self.load_version += 1
                else:
                    self.version += 1
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            logger.warning("scheduler: ignored malformed {!r} push ({}: {})",
                           event, type(exc).__name__, exc)
            return
        if woke:
            self.wake.set()

    def _state(self, data: Mapping[str, Any]) -> bool:
        self.cluster = dict(data.get("cluster") or {})
        resources = data.get("resources")
        if resources is None:
            resources = self.cluster.get("resources") or ()
        self.resources = tuple(resources)
        self.queues = {q["name"]: q for q in data.get("queues") or ()}
        self.hosts = {h["name"]: h for h in data.get("hosts") or ()}
        self.pending, self._by_queue, self._queue_tuple = {}, {}, {}
        for j in data.get("jobs") or ():
            if j.get("state") == "PEND":
                self._put_pending(j)
        self.epoch += 1
        logger.info("scheduler: full state from {}: {} pending job(s), {} host(s), {} queue(s)",
                    data.get("server", "?"), len(self.pending), len(self.hosts), len(self.queues))
        return True

    def _job(self, job: Record) -> bool:
        jobid = job["jobid"]
        if job.get("state") == "PEND":
            new = jobid not in self.pending
            self._put_pending(job)
            return new
        self._drop_pending(jobid)
        # A job that stopped running freed slots; the host push carries the new count, but
        # waking now lets the picker look as soon as both have arrived.
        return job.get("state") not in RUNNING_STATES

    def _job_removed(self, data: Mapping[str, Any]) -> bool:
        # Purged jobs are finished ones, so normally not pending; drop any copy regardless.
        for jobid in [int(j) for j in data["jobids"]]:
            self._drop_pending(jobid)
        return False

    def _host(self, host: Record) -> bool:
        old = self.hosts.get(host["name"])
        self.hosts[host["name"]] = host
        if host.get("state") != "ok":
            return False
        return old is None or old.get("state") != "ok" or free_slots(host) > free_slots(old)

    def _queue(self, queue: Record) -> bool:
        old = self.queues.get(queue["name"])
        self.queues[queue["name"]] = queue
        return bool(queue.get("active")) and (old is None or not old.get("active"))

    def _resvals(self, data: Mapping[str, Any]) -> bool:
        name = data["host"]
        host = self.hosts.get(name)
        if host is not None:
            self.hosts[name] = {**host, "resvals": dict(data.get("values") or {})}
        return False

    def _pend_reasons(self, data: Mapping[str, Any]) -> bool:
        for key, reason in (data.get("reasons") or {}).items():
            jobid = int(key)
            job = self.pending.get(jobid)
            if job is not None:
                self._put_pending({**job, "pend_reason": reason})
        return False


_HANDLERS: dict[str, Any] = {
    "state": SchedulerView._state,
    "job": SchedulerView._job,
    "job_removed": SchedulerView._job_removed,
    "host": SchedulerView._host,
    "queue": SchedulerView._queue,
    "resvals": SchedulerView._resvals,
    "pend_reasons": SchedulerView._pend_reasons,
}
