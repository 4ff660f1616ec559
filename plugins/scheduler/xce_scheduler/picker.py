"""The job picker: on its own thread, decides which pending job goes where.

Each cycle takes a snapshot of the view, orders pending jobs by queue priority (highest
first), then submit time, then job id, skips jobs of inactive queues, and places each job on
hosts that are ok, have free slots and satisfy its requirement, best first. Free slots are
``max_slots - used_slots`` minus what is proposed and not yet answered, and go down with every
proposal of the cycle, so a host is never over-committed. Proposals go to the allocator; a job
already proposed is not proposed again until the controller answers. Jobs that fit nowhere get
a pend reason, sent in one batch per cycle and only when it changed.

The picker never calls the controller itself, so it keeps cycling while the allocator waits
for a reconnect.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch, ReasonBatch
from xce_scheduler.matching import (
    HostMap,
    OrderedCandidates,
    Requirements,
    Reservations,
    fast_placement,
    host_map,
    rusage_amounts,
)
from xce_scheduler.status import SchedulerStatus, StatusReporter
from xce_scheduler.view import Record, SchedulerView, ViewSnapshot, free_slots

Alloc = list[dict[str, Any]]
Holds = list[tuple[str, Mapping[str, float]]]  # (host, rusage amounts held there)


def _within_queue(job: Record) -> tuple[Any, ...]:
    """Sort key of pending jobs within one priority: submit time, then job id."""
    return (job.get("submit_time") or 0.0, job["jobid"])


def job_order(queues: dict[str, Record]) -> Callable[[Record], tuple[Any, ...]]:
    """Sort key of pending jobs: queue priority (highest first), submit time, job id."""

    def key(job: Record) -> tuple[Any, ...]:
        queue = queues.get(job.get("queue", ""))
        prio = queue.get("priority", 0) if queue is not None else 0
        return (-prio, job.get("submit_time") or 0.0, job["jobid"])

    return key


@dataclass
class _Cycle:
    """Per-cycle working state: free slots, host maps, and per-requirement answers."""

    snap: ViewSnapshot
    free: dict[str, int]
    eligible: list[HostMap]
    maps: dict[str, HostMap]
    rsv: Reservations
    entries: dict[str, Any] = field(default_factory=dict)
    failed_from: dict[str, int] = field(default_factory=dict)
    diagnosis: dict[str, str] = field(default_factory=dict)


class Picker:
    """The picker loop and one cycle of it (:meth:`cycle`, callable directly in tests).

    A cycle does the full work only when the view changed (or the last one was capped);
    changes of load values alone are picked up at most every ``load_interval`` seconds, so
    a stream of monitor updates does not keep 10,000 pending jobs under evaluation.
    ``submit(items)`` hands a cycle's :class:`Dispatch` and :class:`ReasonBatch` items to the
    allocator and must not wait for their answers. The allocator reports back through :meth:`answered`.
    """

    def __init__(
        self,
        view: SchedulerView,
        requirements: Requirements,
        submit: Callable[[list[Any]], None],
        status: SchedulerStatus | None = None,
        *,
        interval: float = 0.05,
        max_dispatch: int = 1000,
        load_interval: float = 1.0,
        reporter: StatusReporter | None = None,
    ) -> None:
        self.view = view
        self.requirements = requirements
        self.submit = submit
        self.status = status or SchedulerStatus()
        self.interval = interval
        self.max_dispatch = max_dispatch
        self.load_interval = load_interval
        self.reporter = reporter
        self.reasons = R.PendReasons()
        self._lock = threading.Lock()
        self._inflight: dict[int, tuple[Alloc, Holds]] = {}
        self._held: dict[int, int] = {}  # refused job -> view version it was refused at
        self._last_version = -1
        self._last_load = -1
        self._last_full = 0.0
        self._dirty = True
        self._base: dict[str, tuple[Record, HostMap]] = {}
        self._orders: dict[str, tuple[int, list[Record]]] = {}  # queue -> (version, sorted jobs)
        self._settled: dict[str, tuple[int, Record]] = {}  # inactive queue -> (version, record)
        self._resettle = False  # set (from the event loop) when requested reasons were lost

    # ------------------------------------------------------------------ allocator feedback
    def answered(self, jobid: int, ok: bool) -> None:
        """The controller answered the dispatch of ``jobid`` (``ok``: it runs now).

        A refused job is held until the view changes (the push that corrects it); an accepted
        one stays counted as proposed until its push shows it left PEND.
        """
        with self._lock:
            if not ok:
                self._inflight.pop(jobid, None)
                self._held[jobid] = self.view.version
                self._dirty = True
        if not ok:
            self.view.wake.set()

    def inflight(self) -> dict[int, Alloc]:
        """Proposals not yet seen leaving PEND (job id -> alloc), a copy."""
        with self._lock:
            return {jobid: alloc for jobid, (alloc, _) in self._inflight.items()}

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> None:
        """Cycle until ``stop`` is set: at once when woken by a push, else every interval."""
        logger.info("scheduler: picker started (interval {} s, at most {} dispatch(es) a cycle)",
                    self.interval, self.max_dispatch)
        while not stop.is_set():
            self.view.wake.clear()
            started = time.perf_counter()
            try:
                self.cycle()
            except Exception:
                logger.exception("scheduler: picker cycle failed; trying again next cycle")
            worked = self._last_full >= started  # a full cycle, not an idle one
            if self.reporter is not None:
                self.reporter.tick()
            if worked:
                # Rest as long as the cycle took: with 10,000 pending jobs and a stream of
                # pushes the picker then uses at most about half a core, and a short cycle
                # (a few jobs) costs a rest of microseconds.
                stop.wait(min(time.perf_counter() - started, 1.0))
            with self._lock:
                again = self._dirty
            if not again:
                self.view.wake.wait(self.interval)
        if self.reporter is not None:
            self.reporter.tick(force=True)
        logger.info("scheduler: picker stopped after {} cycle(s)", self.status.cycles)

    def cycle(self) -> int:
        """One scheduling cycle; returns the number of dispatches proposed."""
        started = time.perf_counter()
        snap = self.view.snapshot()
        pending_ids = snap.pending_ids
        with self._lock:
            load_due = (snap.load_version != self._last_load
                        and started - self._last_full >= self.load_interval)
            if snap.version == self._last_version and not self._dirty and not load_due:
                self.status.add(cycles=1, idle_cycles=1)
                self.status.update(last_cycle=time.time())
                return 0
            self._last_version, self._dirty = snap.version, False
            self._last_load, self._last_full = snap.load_version, started
            for jobid in [j for j in self._inflight if j not in pending_ids]:
                del self._inflight[jobid]
            for jobid in [j for j, v in self._held.items()
                          if j not in pending_ids or v != snap.version]:
                del self._held[jobid]
            inflight, held = dict(self._inflight), set(self._held)
            if self._resettle:
                self._settled, self._resettle = {}, False
        self.requirements.use_resources(snap.resources)
        cyc = self._start_cycle(snap, inflight)
        wanted: dict[int, str] = {}
        current: dict[int, str | None] = {}  # the pushed reason of each job in ``wanted``
        proposals: list[Dispatch] = []
        new_holds: dict[int, Holds] = {}
        for job in self._inactive_jobs(snap):
            jobid = job["jobid"]
            if jobid not in inflight and jobid not in held:
                wanted[jobid], current[jobid] = R.QUEUE_INACTIVE, job.get("pend_reason")
            else:  # look at this queue again next cycle, when the job may be back
                self._settled.pop(job.get("queue", ""), None)
        for job in self._ordered_jobs(snap):
            jobid = job["jobid"]
            if jobid in inflight or jobid in held:
                continue
            if len(proposals) >= self.max_dispatch:
                with self._lock:
                    self._dirty = True  # more to do: the next cycle starts at once
                break
            alloc, holds, reason = self._place(job, cyc)
            if alloc is None:
                if reason is not None:
                    wanted[jobid], current[jobid] = reason, job.get("pend_reason")
                continue
            for a in alloc:
                cyc.free[a["host"]] -= a["ntasks"]
            for name, amounts in holds:
                cyc.rsv.add(name, amounts)
            proposals.append(Dispatch(jobid, alloc))
            new_holds[jobid] = holds
        changes = self.reasons.changes(wanted, current, snap.epoch, pending_ids)
        self._propose(proposals, new_holds, [ReasonBatch(changes)] if changes else [])
        self.status.add(cycles=1, proposed=len(proposals), reasons_sent=len(changes))
        self.status.update(last_cycle=time.time(),
                           last_cycle_seconds=time.perf_counter() - started,
                           pending=len(snap.pending), hosts=len(snap.hosts),
                           inflight=len(inflight) + len(proposals), view_epoch=snap.epoch)
        return len(proposals)

    # ------------------------------------------------------------------ pieces of a cycle
    def _ordered_jobs(self, snap: ViewSnapshot) -> list[Record]:
        """Pending jobs of active (or unknown) queues in :func:`job_order`.

        Each queue's jobs are sorted once per version of that queue (a queue whose jobs did
        not change keeps its order), then queues go by priority, highest first; queues of
        equal priority are merged by submit time and job id.
        """
        by_prio: dict[int, list[list[Record]]] = {}
        orders: dict[str, tuple[int, list[Record]]] = {}
        for name, qjobs in snap.by_queue.items():
            queue = snap.queues.get(name)
            if queue is not None and not queue.get("active", True):
                continue
            cached = self._orders.get(name)
            if cached is None or cached[0] != qjobs.version:
                cached = (qjobs.version, sorted(qjobs.jobs, key=_within_queue))
            orders[name] = cached
            prio = queue.get("priority", 0) if queue is not None else 0
            by_prio.setdefault(prio, []).append(cached[1])
        self._orders = orders  # queues gone or inactive are dropped from the cache
        out: list[Record] = []
        for prio in sorted(by_prio, reverse=True):
            lists = by_prio[prio]
            out += lists[0] if len(lists) == 1 else heapq.merge(*lists, key=_within_queue)
        return out

    def _inactive_jobs(self, snap: ViewSnapshot) -> list[Record]:
        """Jobs of inactive queues that may need their reason (``queue is inactive``) set.

        A queue whose jobs and record did not change since a cycle already gave them that
        reason is skipped: nothing about them can have changed. Forgotten requests (a lost
        reason batch) and a new full state reset this.
        """
        out: list[Record] = []
        settled: dict[str, tuple[int, Record]] = {}
        for name, qjobs in snap.by_queue.items():
            queue = snap.queues.get(name)
            if queue is None or queue.get("active", True):
                continue
            mark = (qjobs.version, queue)
            before = self._settled.get(name)
            settled[name] = mark
            if before is None or before[0] != mark[0] or before[1] is not queue:
                out += qjobs.jobs
        self._settled = settled
        return out

    def forget_reasons(self, keys: Iterable[str]) -> None:
        """Reasons of ``keys`` were not delivered: the next cycle sends them again."""
        self.reasons.forget(keys)
        with self._lock:
            self._dirty = self._resettle = True
        self.view.wake.set()

    def _propose(self, proposals: list[Dispatch], holds: dict[int, Holds],
                 extra: list[ReasonBatch]) -> None:
        with self._lock:
            for p in proposals:
                self._inflight[p.jobid] = (p.alloc, holds.get(p.jobid, []))
        if proposals or extra:
            self.submit([*proposals, *extra])  # one hand-off per cycle, not per job

    def _base_map(self, name: str, host: Record) -> HostMap:
        cached = self._base.get(name)
        if cached is None or cached[0] is not host:
            cached = (host, host_map(host))
            self._base[name] = cached
        return cached[1]

    def _start_cycle(self, snap: ViewSnapshot,
                     inflight: dict[int, tuple[Alloc, Holds]]) -> _Cycle:
        proposed: Counter[str] = Counter()
        rsv = Reservations()
        for alloc, holds in inflight.values():
            for a in alloc:
                proposed[a["host"]] += a["ntasks"]
            for name, amounts in holds:
                rsv.add(name, amounts)
        for gone in [n for n in self._base if n not in snap.hosts]:
            del self._base[gone]
        free: dict[str, int] = {}
        maps: dict[str, HostMap] = {}  # as reported; held amounts come off when evaluating
        for name, host in snap.hosts.items():
            slots = free_slots(host) - proposed[name]
            if host.get("state") == "ok" and slots > 0:
                free[name] = slots
                maps[name] = {**self._base_map(name, host), "slots": slots}
            else:
                self._base_map(name, host)
        eligible = [rsv.adjusted(m) for m in maps.values()]
        return _Cycle(snap, free, eligible, maps, rsv)

    def _entry(self, text: str, cyc: _Cycle) -> Any:
        """Per requirement and cycle: OrderedCandidates, a compiled req (slow path) or a reason."""
        if text in cyc.entries:
            return cyc.entries[text]
        entry: Any
        try:
            compiled = self.requirements.compile(text)
        except Exception as exc:  # the evaluator's error type is its own (ResreqError here)
            entry = R.bad_requirement(str(getattr(exc, "message", None) or exc))
        else:
            if not fast_placement(compiled):
                entry = compiled
            else:
                try:
                    names = [m.name for m in compiled.match(cyc.eligible, ntasks=1)]
                except Exception as exc:  # a site evaluator's bug must not stop the picker
                    logger.warning("scheduler: evaluating requirement {!r} failed ({}: {})",
                                   text, type(exc).__name__, exc)
                    entry = R.bad_requirement(f"evaluation failed: {exc}")
                else:
                    entry = OrderedCandidates(names, cyc.free, compiled.span, compiled,
                                              self._rusage_check(compiled, cyc))
        cyc.entries[text] = entry
        return entry

    @staticmethod
    def _rusage_check(compiled: Any, cyc: _Cycle) -> Callable[[str], bool] | None:
        """A host re-check of the rusage fit against amounts held this cycle (None: no rusage)."""
        fit = getattr(compiled, "fit", None)
        if not getattr(compiled, "rusage", None) or not callable(fit):
            return None
        held, maps, rsv = cyc.rsv.held, cyc.maps, cyc.rsv

        def qualifies(name: str) -> bool:
            return name not in held or fit(rsv.adjusted(maps[name])) is not None

        return qualifies

    def _place(self, job: Record, cyc: _Cycle) -> tuple[Alloc | None, Holds, str | None]:
        """(allocation, rusage holds, None) for a job that fits, else (None, [], its reason)."""
        text = job.get("resreq") or ""
        ntasks = job.get("ntasks") or 1
        entry = self._entry(text, cyc)
        if isinstance(entry, str):
            return None, [], entry
        if ntasks >= cyc.failed_from.get(text, math.inf):
            # Free slots and held amounts only grow scarcer within a cycle.
            return None, [], cyc.diagnosis[text]
        if isinstance(entry, OrderedCandidates):
            compiled = entry.compiled
            alloc = entry.place(ntasks)
            holds: Holds = []
            if alloc is not None and entry.qualifies is not None:
                for a in alloc:
                    adjusted = cyc.rsv.adjusted(cyc.maps[a["host"]])
                    holds.append((a["host"], rusage_amounts(compiled, compiled.fit(adjusted))))
        else:
            compiled = entry
            alloc, holds = self._place_by_evaluator(entry, ntasks, cyc)
        if alloc is not None:
            return alloc, holds, None
        before = cyc.failed_from.get(text)
        cyc.failed_from[text] = ntasks if before is None else min(before, ntasks)
        if text not in cyc.diagnosis:
            cyc.diagnosis[text] = self._diagnose(compiled, cyc.snap)
        return None, [], cyc.diagnosis[text]

    def _place_by_evaluator(self, compiled: Any, ntasks: int,
                            cyc: _Cycle) -> tuple[Alloc | None, Holds]:
        """Placement by the evaluator itself (``same[...]``, site evaluators), current slots."""
        hosts = [cyc.rsv.adjusted({**cyc.maps[name], "slots": slots})
                 for name, slots in cyc.free.items() if slots > 0]
        matches = [m for m in compiled.match(hosts, ntasks=ntasks) if m.tasks > 0]
        alloc = [{"host": m.name, "ntasks": m.tasks} for m in matches]
        fits = sum(a["ntasks"] for a in alloc) == ntasks and all(
            0 < a["ntasks"] <= cyc.free.get(a["host"], 0) for a in alloc)
        if not fits:
            return None, []
        return alloc, [(m.name, rusage_amounts(compiled, m.alternative)) for m in matches]

    def _diagnose(self, compiled: Any, snap: ViewSnapshot) -> str:
        """Why a requirement fits nowhere: no host matches, all closed/unavailable, or slots."""
        # Every host as if open and empty: does any satisfy the requirement at all?
        every = [{**self._base_map(name, host), "status": "ok",
                  "slots": max(1, int(host.get("max_slots") or 0))}
                 for name, host in snap.hosts.items()]
        matching = {m.name for m in compiled.match(every, ntasks=1)} if every else set()
        if not matching:
            return R.NO_HOST
        if all(snap.hosts[n].get("state") != "ok" for n in matching if n in snap.hosts):
            return R.HOSTS_UNUSABLE
        return R.NO_SLOTS
