"""The job picker: on its own thread, decides which pending job goes where.

Each cycle drains the view's journal into the picker's own :class:`~xce_scheduler.board.Board`
(what changed since the last cycle, nothing more), then goes through the pending jobs of the
active queues by queue priority (highest first), then submit time, then job id, and places
each job on hosts that are ok, have free slots and satisfy its requirement, best first. Free
slots are ``max_slots - used_slots`` minus what is proposed and not yet answered, and go down
with every proposal of the cycle, so a host is never over-committed. Proposals go to the
allocator; a job already proposed is not proposed again until the controller answers.

A cycle's cost follows what it finds to do, not how many jobs wait: the jobs of one queue
with the same requirement and task count (a *shape*) are interchangeable, so when one of them
does not fit, the cycle leaves the rest of its shape alone; jobs parked in an inactive queue
are not looked at and get no reason from the scheduler (their reason is derived from the
queue where a job is shown). Jobs that fit nowhere get a pend
reason, worked out again only for jobs new to their shape or when their shape's reason
changes, and sent only when it differs from what the controller has. No reason is sent
while the view is incomplete (a sync streaming): "fits nowhere" from a partial view would
be wrong.

Exclusive jobs (``-x``): a host an exclusive job runs on (or is proposed to) gets no other
job, and an exclusive job goes only to hosts with nothing running or proposed; the pend
reasons say which of the two keeps a job waiting.

The picker never calls the controller itself, so it keeps cycling while the allocator waits
for a reconnect.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from loguru import logger

from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch, ReasonBatch
from xce_scheduler.board import Board, Shape, exclusive, order_key
from xce_scheduler.holds import RunningHolds
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
from xce_scheduler.view import RUNNING_STATES, Record, SchedulerView, free_slots, is_array
from xcecore.schema.limits import DISPATCH_MORE_MAX

Alloc = list[dict[str, Any]]
Holds = list[tuple[str, Mapping[str, float]]]  # (host, rusage amounts held there)
REASON_BATCH = 2000
"""Pend reasons per ``set_pend_reason`` call: a batch's frame stays small at any scale."""


@dataclass
class _Cycle:
    """Per-cycle working state: free slots, host maps, and per-requirement answers."""

    free: dict[str, int]
    eligible: list[HostMap]
    maps: dict[str, HostMap]
    rsv: Reservations
    empty: set[str] = field(default_factory=set)  # usable hosts with nothing running or proposed
    taken: set[str] = field(default_factory=set)  # hosts exclusive jobs run on or are proposed to
    entries: dict[str, Any] = field(default_factory=dict)
    failed_from: dict[str, int] = field(default_factory=dict)
    diagnosis: dict[str, str] = field(default_factory=dict)


@dataclass
class _Pass:
    """What one cycle decides: proposals, their rusage holds, and the reasons it wants."""

    inflight: Mapping[int, Any]
    held: set[int]
    complete: bool
    proposals: list[Dispatch] = field(default_factory=list)
    holds: dict[int, Holds] = field(default_factory=dict)
    wanted: dict[int, str] = field(default_factory=dict)
    capped: bool = False
    looked: int = 0  # jobs looked at


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
        self.board = Board()  # the picker thread's own: nothing else touches it
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
        self._held: set[int] = set()  # refused jobs, held until the view changes
        self._lost: list[str] = []  # reasons not delivered (from the allocator)
        self._loads_waiting = False
        self._last_full = 0.0
        self._dirty = True
        self._base: dict[str, tuple[Record, Record | None, HostMap]] = {}
        self.holds = RunningHolds()  # rusage of running jobs (the picker thread's own)

    # ------------------------------------------------------------------ allocator feedback
    def answered(self, jobid: int, ok: bool) -> None:
        """The controller answered the dispatch of ``jobid`` (``ok``: it runs now).

        A refused job is held until the view changes (the push that corrects it); an accepted
        one stays counted as proposed until its push shows it left PEND.
        """
        with self._lock:
            if not ok:
                self._inflight.pop(jobid, None)
                self._held.add(jobid)
                self._dirty = True
        if not ok:
            self.view.wake.set()

    def inflight(self) -> dict[int, Alloc]:
        """Proposals not yet seen leaving PEND (job id -> alloc), a copy."""
        with self._lock:
            return {jobid: alloc for jobid, (alloc, _) in self._inflight.items()}

    def forget_reasons(self, keys: Iterable[str]) -> None:
        """Reasons of ``keys`` were not delivered: the next cycle sends them again."""
        with self._lock:
            self._lost.extend(keys)
            self._dirty = True
        self.view.wake.set()

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
                with self._lock:
                    self._dirty = True
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
        board = self.board
        drained = board.drain(self.view.take())
        if board.rusage_changes:  # before the jobs that left PEND leave the in-flight table
            ran, board.rusage_changes = board.rusage_changes, []
            self._hold_running(ran, time.time())
        self.reasons.settle(drained.echoed)
        if drained.left:
            self.reasons.drop(drained.left)
        with self._lock:
            for jobid in chain(drained.left, drained.moved):
                self._inflight.pop(jobid, None)
                self._held.discard(jobid)
            returned: list[int] = []
            if drained.changes and self._held:  # the view changed: refused jobs may go again
                returned, self._held = list(self._held), set()
            lost, self._lost = self._lost, []
            self._loads_waiting = self._loads_waiting or bool(drained.loads)
            load_due = self._loads_waiting and started - self._last_full >= self.load_interval
            load_due = load_due or self.holds.due(time.time())  # a reservation's duration ended
            if not (drained.changes or self._dirty or load_due or lost or returned):
                self.status.add(cycles=1, idle_cycles=1)
                self.status.update(last_cycle=time.time())
                return 0
            self._dirty = self._loads_waiting = False
            self._last_full = started
            work = _Pass(dict(self._inflight), set(self._held), board.complete)
        board.refresh(returned)
        if lost:
            self.reasons.forget(lost)
            board.refresh(int(k) for k in lost)
        self.requirements.use_resources(board.resources)
        self._schedule(work)
        changes = self.reasons.changes(work.wanted, board.current_reasons(work.wanted), board.epoch)
        if work.capped:
            with self._lock:
                self._dirty = True  # more to do: the next cycle starts at once
        items = list(_batches(changes))
        self._propose(work.proposals, work.holds, items)
        self.status.add(cycles=1, proposed=len(work.proposals), reasons_sent=len(changes))
        took = time.perf_counter() - started
        self.status.passed(took)
        self.status.update(last_cycle=time.time(),
                           last_cycle_seconds=took,
                           pending=len(board.pending), hosts=len(board.hosts),
                           inflight=len(work.inflight) + len(work.proposals),
                           view_epoch=board.epoch, looked=work.looked,
                           view_complete=board.complete)
        return len(work.proposals)

    def _hold_running(self, changes: list[tuple[int, Record | None]], now: float) -> None:
        """Jobs with rusage that started or ended: their hosts' reservations while they run.

        A job the picker proposed holds the alternative it was placed by; one it did not
        (a forced dispatch, a job running before this scheduler started) its first one."""
        compiled: dict[str, Any] = {}  # requirement -> its rusage alternatives, this batch
        for jobid, rec in changes:
            if rec is None:
                self.holds.end(jobid)
                continue
            text = rec.get("resreq") or ""
            if text not in compiled:
                try:
                    compiled[text] = getattr(self.requirements.compile(text), "rusage", None)
                except Exception:  # a bad requirement: the job runs, it reserves nothing
                    compiled[text] = None
            alts = compiled[text]
            if not alts:
                self.holds.end(jobid)
                continue
            with self._lock:
                flight = self._inflight.get(jobid)
            holds: Holds = list(flight[1]) if flight is not None and flight[1] else []
            index = 0
            if holds:
                index = next((i for i, alt in enumerate(alts) if dict(alt) == dict(holds[0][1])), 0)
            else:
                hosts = dict.fromkeys(str(a.get("host")) for a in rec.get("alloc") or ()
                                      if isinstance(a, dict))
                holds = [(host, dict(alts[0])) for host in hosts]
            alt = alts[index]
            self.holds.start(jobid, holds, float(rec.get("start_time") or now),
                             getattr(alt, "durations", {}), getattr(alt, "decays", {}))

    # ------------------------------------------------------------------ pieces of a cycle
    def _schedule(self, work: _Pass) -> None:
        """Place jobs queue priority by queue priority; give parked jobs their reason."""
        board = self.board
        levels: dict[int, list[Shape]] = {}
        for name, shapes in board.by_queue.items():
            queue = board.queues.get(name)
            if queue is not None and not queue.get("active", True):
                # Their reason is the queue's (xcecore.protocol.pend_reason: shown from the
                # queue record, never sent per job, so a failover re-sends nothing for them).
                # Marked, so that the queue's activation looks at every one of its jobs again.
                for shape in shapes.values():
                    shape.reason = R.QUEUE_INACTIVE
                    shape.fresh.clear()
                continue
            prio = queue.get("priority", 0) if queue is not None else 0
            levels.setdefault(prio, []).extend(shapes.values())
        cyc: list[_Cycle] = []  # built on the first job that needs it
        for prio in sorted(levels, reverse=True):
            self._place_level(levels[prio], cyc, work)
            if work.capped:
                return

    def _place_level(self, shapes: list[Shape], cyc: list[_Cycle], work: _Pass) -> None:
        """Queues of one priority: their shapes merged by submit time, then job id."""
        inflight, held, pending = work.inflight, work.held, self.board.pending
        iters: list[Iterator[tuple[float, int]]] = [iter(shape.jobs) for shape in shapes]
        heap: list[tuple[tuple[float, int], int]] = []
        for i, it in enumerate(iters):
            first = next(it, None)
            if first is not None:
                heap.append((first, i))
        heapq.heapify(heap)
        while heap:
            key, i = heap[0]
            shape = shapes[i]
            jobid = key[1]
            if jobid not in inflight and jobid not in held:
                if len(work.proposals) >= self.max_dispatch:
                    work.capped = True
                    return
                if not cyc:
                    cyc.append(self._start_cycle(work.inflight))
                work.looked += 1
                job = pending[jobid]
                array = is_array(job)
                if array:  # an array: one entry that yields its elements
                    misfit, reason = self._place_array(jobid, job, cyc[0], work)
                else:
                    alloc, holds, reason = self._place(job, cyc[0])
                    misfit = alloc is None
                if misfit:
                    heapq.heappop(heap)  # none of the shape's later jobs fits this cycle
                    if reason is not None and work.complete:
                        self._tail_reason(shape, reason, key, iters[i], work)
                    continue
                if not array:
                    assert alloc is not None
                    for a in alloc:
                        cyc[0].free[a["host"]] -= a["ntasks"]
                        cyc[0].empty.discard(a["host"])
                        if shape.exclusive:
                            cyc[0].free[a["host"]] = 0  # the host is the job's alone
                    for name, amounts in holds:
                        cyc[0].rsv.add(name, amounts)
                    work.proposals.append(Dispatch(jobid, alloc))
                    work.holds[jobid] = holds
            nxt = next(iters[i], None)
            if nxt is None:
                heapq.heappop(heap)
                shape.reason = None  # every job of the shape placed (or in flight)
                shape.fresh.clear()
            else:
                heapq.heapreplace(heap, (nxt, i))

    def _place_array(self, jobid: int, job: Record, cyc: _Cycle,
                     work: _Pass) -> tuple[bool, str | None]:
        """Place as many of an array's pending elements as fit (within its ``%limit`` and the
        cycle's dispatch cap) as one proposal. Returns (an element did not fit: a misfit of
        the shape, the reason to give)."""
        a = job["array"]
        left = a.get("left") or 0
        limit = a.get("limit")
        if limit is not None:
            running = sum((a.get("counts") or {}).get(s, 0) for s in RUNNING_STATES)
            if running >= limit:
                if work.complete:
                    work.wanted[jobid] = R.array_limit(limit)
                return False, None
            left = min(left, limit - running)
        room = min(left, DISPATCH_MORE_MAX + 1, self.max_dispatch - len(work.proposals))
        alone = exclusive(job)
        allocs: list[Alloc] = []
        held: Holds = []
        reason: str | None = None
        while len(allocs) < room:
            alloc, holds, reason = self._place(job, cyc)
            if alloc is None:
                break
            for entry in alloc:
                cyc.free[entry["host"]] -= entry["ntasks"]
                cyc.empty.discard(entry["host"])
                if alone:
                    cyc.free[entry["host"]] = 0  # the host is the element's alone
            for name, amounts in holds:
                cyc.rsv.add(name, amounts)
            allocs.append(alloc)
            held.extend(holds)
        if allocs:
            work.proposals.append(Dispatch(jobid, allocs[0], tuple(allocs[1:])))
            work.holds[jobid] = held
            return len(allocs) < room, None  # its own reason: it is in flight
        return True, reason

    def _tail_reason(self, shape: Shape, reason: str, first: tuple[float, int] | None,
                     rest: Iterator[tuple[float, int]], work: _Pass) -> None:
        """Give ``reason`` to the shape's jobs from ``first`` on (None: all of them).

        Only when the shape's reason changed are all of them looked at; otherwise only the
        jobs that arrived (or came back from being in flight) since the last cycle.
        """
        inflight, held, wanted = work.inflight, work.held, work.wanted
        if shape.reason != reason:
            keys = chain((first,), rest) if first is not None else rest
            for _, jobid in keys:
                if jobid not in inflight and jobid not in held:
                    wanted[jobid] = reason
            shape.reason = reason
        elif shape.fresh:
            pending = self.board.pending
            for jobid in shape.fresh:
                job = pending.get(jobid)
                if job is None or jobid in inflight or jobid in held:
                    continue
                if first is None or order_key(job) >= first:
                    wanted[jobid] = reason
        shape.fresh.clear()

    def _propose(self, proposals: list[Dispatch], holds: dict[int, Holds],
                 extra: list[ReasonBatch]) -> None:
        with self._lock:
            for p in proposals:
                self._inflight[p.jobid] = (p.every_alloc(), holds.get(p.jobid, []))
        if proposals or extra:
            self.submit([*proposals, *extra])  # one hand-off per cycle, not per job

    def _base_map(self, name: str) -> HostMap:
        """The evaluator's mapping of a host, cached per pushed record and load values."""
        board = self.board
        host, values = board.hosts[name], board.resvals.get(name)
        cached = self._base.get(name)
        if cached is None or cached[0] is not host or cached[1] is not values:
            cached = (host, values, host_map(board.host_record(name)))
            self._base[name] = cached
        return cached[2]

    def _start_cycle(self, inflight: Mapping[int, tuple[Alloc, Holds]]) -> _Cycle:
        proposed: Counter[str] = Counter()
        rsv = Reservations()
        board = self.board
        taken = set(board.exclusive_on)  # hosts of exclusive jobs: no other job goes there
        for jobid, (alloc, holds) in inflight.items():
            excl = exclusive(board.pending.get(jobid) or {})
            for a in alloc:
                proposed[a["host"]] += a["ntasks"]
                if excl:
                    taken.add(a["host"])
            for name, amounts in holds:
                rsv.add(name, amounts)
        for name, amounts in self.holds.held(time.time()).items():  # running jobs' rusage
            rsv.add(name, amounts)
        hosts = self.board.hosts
        if len(self._base) > len(hosts):
            for gone in [n for n in self._base if n not in hosts]:
                del self._base[gone]
        free: dict[str, int] = {}
        maps: dict[str, HostMap] = {}  # as reported; held amounts come off when evaluating
        empty: set[str] = set()
        for name, host in hosts.items():
            slots = free_slots(host) - proposed[name]
            if host.get("state") == "ok" and slots > 0 and name not in taken:
                free[name] = slots
                maps[name] = {**self._base_map(name), "slots": slots}
                if not host.get("used_slots") and not proposed[name]:
                    empty.add(name)
        eligible = [rsv.adjusted(m) for m in maps.values()]
        return _Cycle(free, eligible, maps, rsv, empty, taken)

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
        excl = exclusive(job)
        entry = self._entry(text, cyc)
        if isinstance(entry, str):
            return None, [], entry
        key = text + "\0exclusive" if excl else text  # an exclusive misfit says nothing of others
        if ntasks >= cyc.failed_from.get(key, math.inf):
            # Free slots and held amounts only grow scarcer within a cycle.
            return None, [], cyc.diagnosis[key]
        if isinstance(entry, OrderedCandidates):
            compiled = entry.compiled
            if excl:  # its own candidates: the requirement's hosts that are empty
                entry = OrderedCandidates([n for n in entry.names if n in cyc.empty], entry.free,
                                          entry.span, compiled, entry.qualifies)
            alloc = entry.place(ntasks)
            holds: Holds = []
            if alloc is not None and entry.qualifies is not None:
                for a in alloc:
                    adjusted = cyc.rsv.adjusted(cyc.maps[a["host"]])
                    holds.append((a["host"], rusage_amounts(compiled, compiled.fit(adjusted))))
        else:
            compiled = entry
            alloc, holds = self._place_by_evaluator(entry, ntasks, cyc, excl)
        if alloc is not None:
            return alloc, holds, None
        before = cyc.failed_from.get(key)
        cyc.failed_from[key] = ntasks if before is None else min(before, ntasks)
        if key not in cyc.diagnosis:
            why = self._diagnose(compiled, cyc)
            cyc.diagnosis[key] = R.EXCLUSIVE_WAIT if excl and why in (R.NO_SLOTS,
                                                                      R.HOSTS_EXCLUSIVE) else why
        return None, [], cyc.diagnosis[key]

    def _place_by_evaluator(self, compiled: Any, ntasks: int, cyc: _Cycle,
                            excl: bool = False) -> tuple[Alloc | None, Holds]:
        """Placement by the evaluator itself (``same[...]``, site evaluators), current slots
        (``excl``: on empty hosts only)."""
        hosts = [cyc.rsv.adjusted({**cyc.maps[name], "slots": slots})
                 for name, slots in cyc.free.items() if slots > 0 and (
                     not excl or name in cyc.empty)]
        matches = [m for m in compiled.match(hosts, ntasks=ntasks) if m.tasks > 0]
        alloc = [{"host": m.name, "ntasks": m.tasks} for m in matches]
        fits = sum(a["ntasks"] for a in alloc) == ntasks and all(
            0 < a["ntasks"] <= cyc.free.get(a["host"], 0) for a in alloc)
        if not fits:
            return None, []
        return alloc, [(m.name, rusage_amounts(compiled, m.alternative)) for m in matches]

    def _diagnose(self, compiled: Any, cyc: _Cycle | None = None) -> str:
        """Why a requirement fits nowhere: no host matches, all closed/unavailable, hosts
        taken by exclusive jobs, amounts reserved (with this cycle's ``cyc``), or slots."""
        # Every host as if open and empty: does any satisfy the requirement at all?
        hosts = self.board.hosts
        every = [{**self._base_map(name), "status": "ok",
                  "slots": max(1, int(host.get("max_slots") or 0))}
                 for name, host in hosts.items()]
        matching = {m.name for m in compiled.match(every, ntasks=1)} if every else set()
        if not matching:
            return R.NO_HOST
        if all(hosts[n].get("state") != "ok" for n in matching if n in hosts):
            return R.HOSTS_UNUSABLE
        if cyc is not None and cyc.taken and any(
                n in cyc.taken and free_slots(hosts[n]) > 0 for n in matching if n in hosts):
            return R.HOSTS_EXCLUSIVE
        if cyc is not None and cyc.rsv.held and getattr(compiled, "rusage", None) and any(
                cyc.rsv.held.get(n) and cyc.free.get(n, 0) > 0 for n in matching):
            return R.RESERVED  # slots are free there: what it asks for is held
        return R.NO_SLOTS


def _batches(changes: Mapping[str, str]) -> Iterator[ReasonBatch]:
    """``changes`` as reason batches of at most :data:`REASON_BATCH` each."""
    items = list(changes.items())
    for start in range(0, len(items), REASON_BATCH):
        yield ReasonBatch(dict(items[start:start + REASON_BATCH]))
