"""The job table: compact job records and the indexes every job query pages through.

A job is a slotted dataclass (:class:`Job`) whose immutable submission -- project, command,
working directory, environment, resource requirement, and whatever else a submission carries
-- is one JSON object kept as bytes (``_spec``), never decoded by the controller: the record's
JSON is its mutable fields (orjson writes a slotted dataclass natively and skips the
underscored field) with the submission's members spliced in. So a new submission field
needs no code here, and a job costs about 500 bytes in memory (measured:
``benchmarks/bench_scale.py``). Repeated strings (users, queues, hosts, reasons) are
interned, allocations are shared :class:`Slot` tuples.

Every change of a job goes through :class:`JobTable`, which keeps the indexes: all jobs, per
state, user, queue, name and host (sorted :class:`~xce_controller.idset.IdSet` of ids),
the active jobs of each host, the pending jobs that have a pend reason, jobs per (queue,
state), and finished jobs by end time for the cleaner. A query (:class:`Query`) walks the
smallest index that covers it in job-id order from its cursor, so paging is stable while the
table changes, and a scan budget bounds what one page may examine.

In the store a job is two blobs: the submission, and its mutable fields as a JSON array in
:data:`STORED` order (decoded fast at load). New mutable fields are appended to the class,
with a default, so rows written before them still load.
"""

from __future__ import annotations

import gc
import heapq
import operator
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from xce_controller.buckets import TimeBuckets
from xce_controller.idset import IdSet
from xcecore.protocol import ACTIVE, FINISHED, JOB_STATES, PENDING

STATES: Final[dict[str, str]] = {s: s for s in JOB_STATES}
"""Each state's one string object (a loaded or given state is replaced by it)."""
EMPTY: Final[dict[str, Any]] = {}
"""The shared empty usage of jobs that have none (never mutated: usage is replaced whole)."""


@dataclass(frozen=True, slots=True)
class Slot:
    """Tasks of a job on one host (JSON: ``{"host": ..., "ntasks": ...}``); shared, immutable."""

    host: str
    ntasks: int


Alloc = tuple[Slot, ...]
_SLOTS: dict[tuple[str, int], Slot] = {}
_SINGLE: dict[Slot, Alloc] = {}


def slot(host: str, ntasks: int) -> Slot:
    """The shared :class:`Slot` for ``host`` and ``ntasks``."""
    key = (host, ntasks)
    s = _SLOTS.get(key)
    if s is None:
        s = _SLOTS[key] = Slot(sys.intern(host), ntasks)
    return s


def make_alloc(pairs: Iterable[tuple[str, int]]) -> Alloc:
    """An allocation from ``(host, ntasks)`` pairs (a one-host allocation is shared)."""
    slots = tuple(slot(h, n) for h, n in pairs)
    if len(slots) == 1:
        one = _SINGLE.get(slots[0])
        if one is None:
            one = _SINGLE[slots[0]] = slots
        return one
    return slots


@dataclass(slots=True, eq=False)
class Job:
    """One job. ``_spec`` is the submission's JSON object (bytes, never decoded here)."""

    _spec: bytes
    jobid: int
    user: str
    queue: str
    name: str
    ntasks: int
    state: str
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    alloc: Alloc = ()
    pid: int | None = None
    exit_status: int | None = None
    pend_reason: str | None = None
    reason: str | None = None
    signal: str | None = None
    attempt: int = 0
    forced: bool = False
    usage: dict[str, Any] = field(default_factory=lambda: EMPTY)
    rev: int = 0
    lost_at: float | None = None  # when it went UNKWN (its host went unavail)
    lost_from: str | None = None  # the state it had then, which its worker's re-join restores
    # A job array's record: {"spec", "limit", "pending" (index runs), "left", "size",
    # "counts" (its element records per state)}; an element's: {"of": array id, "index"}
    # (xce_controller.arrays). None for a plain job.
    array: dict[str, Any] | None = None
    # Why a job with a dependency may not run yet (xce_controller.depends); None: it may.
    waiting: str | None = None
    # A parallel job's tasks (xce_controller.tasks): {"key": SHA-256 of its task secret,
    # "blocked": bool, "list": [task records]}; None for a job that never had any.
    tasks: dict[str, Any] | None = None

    def array_of(self) -> int | None:
        """The array this job is an element of (None: it is not one)."""
        a = self.array
        return None if a is None else a.get("of")

    def json(self) -> bytes:
        """The record as members see it: every field and the submission's, one object."""
        own = orjson.dumps(self)
        spec = self._spec
        if len(spec) <= 2:  # "{}"
            return own[:-1] + b"}"  # a copy: orjson's own buffer is not kept
        return own[:-1] + b"," + spec[1:]

    def row(self) -> bytes:
        """The mutable fields as the store keeps them (a JSON array in :data:`STORED` order)."""
        return orjson.dumps(_stored(self))

    def hosts(self) -> frozenset[str]:
        return frozenset(s.host for s in self.alloc)

    def runs_on(self, host: str) -> bool:
        return any(s.host == host for s in self.alloc)

    def spec(self) -> dict[str, Any]:
        """The submission, decoded (for tests and tools; the controller never needs it)."""
        out: dict[str, Any] = orjson.loads(self._spec)
        return out


def is_exclusive(job: Job) -> bool:
    """Whether ``job`` was submitted with ``-x`` (its submission's ``exclusive``). The
    submission stays encoded: it is decoded only when the word is in it."""
    if b'"exclusive"' not in job._spec:
        return False
    return bool(job.spec().get("exclusive") is True)


STORED: Final[tuple[str, ...]] = tuple(f for f in Job.__dataclass_fields__ if f != "_spec")
"""The fields of a stored row, in order."""
_stored = operator.attrgetter(*STORED)
RECORD_FIELDS: Final = frozenset(STORED)
"""Names a submission may not use for its own fields (they are the record's)."""


def reported_time(told: float | None, floor: float | None, now: float) -> float:
    """When a worker's report says its event happened (its ``time``, the worker's clock),
    bounded by what the controller knows: never later than ``now`` and never earlier than
    ``floor`` (the job's submission for a start, its start for an end). A worker whose clock
    runs hours off can then give no job a start in the future or an end before its start;
    within the bounds its time is kept, so a report delivered after an outage keeps the
    moment it happened. ``told`` None: now."""
    if told is None:
        return now
    return min(max(told, floor), now) if floor is not None else min(told, now)


def job_from_row(spec: bytes, data: bytes) -> Job:
    """A job from its two stored blobs."""
    job = Job(spec, *orjson.loads(data))
    normalise(job)
    return job


def normalise(job: Job, intern: Any = sys.intern, states: Mapping[str, str] = STATES) -> None:
    """Interned strings, shared allocations and empty usage, for a job decoded from JSON."""
    job.user = intern(job.user)
    job.queue = intern(job.queue)
    job.state = states[job.state]
    if job.name:
        job.name = intern(job.name)
    alloc: Any = job.alloc
    job.alloc = make_alloc((a["host"], a["ntasks"]) for a in alloc) if alloc else ()
    if not job.usage:
        job.usage = EMPTY
    if job.pend_reason is not None:
        job.pend_reason = intern(job.pend_reason)
    if job.lost_from is not None:
        job.lost_from = states[job.lost_from]
    if job.array is not None and "of" not in job.array:  # an array's own record
        job.array["counts"] = {states[k]: v for k, v in job.array["counts"].items()}


def new_spec(args: Mapping[str, Any]) -> bytes:
    """The submission blob of a ``jobsubmit``: its arguments but the record's own fields,
    with the defaults of the known ones (a copy of orjson's buffer: it is kept)."""
    spec: dict[str, Any] = {"project": args.get("project", "default"),
                            "command": args["command"], "cwd": args.get("cwd", ""),
                            "env": args.get("env", {}), "resreq": args.get("resreq", "")}
    for k, v in args.items():
        if k not in spec and k not in RECORD_FIELDS:
            spec[k] = v
    return bytes(memoryview(orjson.dumps(spec)))


# -- queries -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """What a job query selects; every given criterion must hold."""

    states: frozenset[str] = frozenset()
    user: str | None = None
    queue: str | None = None
    host: str | None = None
    name: str | None = None
    first: int = 1  # lowest job id
    last: int | None = None  # highest job id
    jobids: tuple[int, ...] | None = None  # sorted, distinct
    array: int | None = None  # only the elements of this array

    def matches(self, job: Job) -> bool:
        return ((self.array is None or job.array_of() == self.array)
                and (not self.states or job.state in self.states)
                and (self.user is None or job.user == self.user)
                and (self.queue is None or job.queue == self.queue)
                and (self.name is None or job.name == self.name)
                and (self.host is None or job.runs_on(self.host))
                and self.first <= job.jobid
                and (self.last is None or job.jobid <= self.last))

    def key(self) -> bytes:
        """A canonical encoding (a cursor is bound to the query that made it)."""
        return orjson.dumps([sorted(self.states), self.user, self.queue, self.host, self.name,
                             self.first, self.last, self.jobids, self.array])


@dataclass(slots=True)
class Page:
    """One page of a query: the jobs' JSON, and where the next page starts (None: done)."""

    jobs: list[bytes]
    next: int | None
    scanned: int


# -- the table ---------------------------------------------------------------------------------

Keys = tuple[str, Alloc, bool, float | None]
"""What the indexes know of a job: state, allocation, has a pend reason, end time."""


class JobTable:
    """Every job of the state, and the indexes over them (one writer: the event loop)."""

    def __init__(self, clean_width: float = 60.0) -> None:
        self.jobs: dict[int, Job] = {}
        self.all = IdSet()
        self.by_state: dict[str, IdSet] = {s: IdSet() for s in JOB_STATES}
        self.by_user: dict[str, IdSet] = {}
        self.by_queue: dict[str, IdSet] = {}
        self.by_name: dict[str, IdSet] = {}  # named jobs only
        self.by_host: dict[str, IdSet] = {}  # jobs whose allocation names the host
        self.by_array: dict[int, IdSet] = {}  # array id -> its element records
        self.elements: dict[tuple[int, int], int] = {}  # (array id, index) -> element id
        self.waiting: set[int] = set()  # pending jobs held by a dependency
        self.active_on: dict[str, set[int]] = {}  # host -> its active jobs
        self.exclusive_on: dict[str, set[int]] = {}  # host -> its active exclusive (-x) jobs
        self.reasons = IdSet()  # pending jobs with a pend reason
        self.counts: dict[tuple[str, str], int] = {}  # (queue, state) -> jobs
        self.ends: TimeBuckets[int] = TimeBuckets(clean_width)  # finished jobs by end time

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, jobid: object) -> bool:
        return jobid in self.jobs

    def __iter__(self) -> Iterator[int]:
        """Job ids, ascending."""
        return iter(self.all)

    def get(self, jobid: int) -> Job | None:
        return self.jobs.get(jobid)

    def __getitem__(self, jobid: int) -> Job:
        return self.jobs[jobid]

    def values(self) -> Iterable[Job]:
        return self.jobs.values()

    def highest(self) -> int:
        return self.all.last() or 0

    def active_jobs(self, host: str) -> list[Job]:
        """The active jobs on ``host``, by id."""
        return [self.jobs[j] for j in sorted(self.active_on.get(host, ()))]

    # -- changing ----------------------------------------------------------------------------

    def add(self, job: Job) -> None:
        """Index a job that is not in the table."""
        jid = job.jobid
        if jid in self.jobs:
            raise ValueError(f"job {jid} is already in the table")
        self.jobs[jid] = job
        self.all.add(jid)
        state, queue = job.state, job.queue
        self.by_state[state].add(jid)
        _index(self.by_user, job.user, jid)
        _index(self.by_queue, queue, jid)
        if job.name:
            _index(self.by_name, job.name, jid)
        array = job.array
        of = None if array is None else array.get("of")
        if of is not None:
            assert array is not None
            _index(self.by_array, of, jid)
            self.elements[(of, array["index"])] = jid
        counts, key = self.counts, (queue, state)
        counts[key] = counts.get(key, 0) + 1  # (never 0 after an addition)
        if job.alloc:  # a submission has none: nothing to place
            self._place(jid, (), False, job)
        if job.pend_reason is not None and job.state in PENDING:
            self.reasons.add(jid)
        if job.waiting is not None and job.state in PENDING:
            self.waiting.add(jid)
        if job.state in FINISHED and job.end_time is not None:
            self.ends.file(jid, job.end_time)

    def remove(self, jobid: int) -> Job | None:
        """Take a job out of the table and every index."""
        job = self.jobs.pop(jobid, None)
        if job is None:
            return None
        self.all.discard(jobid)
        self.by_state[job.state].discard(jobid)
        _unindex(self.by_user, job.user, jobid)
        _unindex(self.by_queue, job.queue, jobid)
        if job.name:
            _unindex(self.by_name, job.name, jobid)
        of = job.array_of()
        if of is not None:
            _unindex(self.by_array, of, jobid)
            self.elements.pop((of, job.array["index"]), None)  # type: ignore[index]
        self._count(job.queue, job.state, -1)
        for s in job.alloc:
            _unindex(self.by_host, s.host, jobid)
            if job.state in ACTIVE:
                self._inactive(s.host, jobid)
        self.reasons.discard(jobid)
        self.waiting.discard(jobid)
        return job

    @staticmethod
    def keys(job: Job) -> Keys:
        """Take before changing ``job``; give to :meth:`reindex` after."""
        return (job.state, job.alloc, job.pend_reason is not None, job.end_time)

    def reindex(self, job: Job, before: Keys) -> None:
        """Bring the indexes up to date with ``job`` changed since ``before``."""
        state0, alloc0, reason0, end0 = before
        jid, state = job.jobid, job.state
        if state != state0:
            self.by_state[state0].discard(jid)
            self.by_state[state].add(jid)
            self._count(job.queue, state0, -1)
            self._count(job.queue, state, 1)
        if alloc0 is not job.alloc or (state0 in ACTIVE) != (state in ACTIVE):
            self._place(jid, alloc0, state0 in ACTIVE, job)
        if state in PENDING and job.pend_reason is not None:
            self.reasons.add(jid)
        elif reason0:
            self.reasons.discard(jid)
        if job.waiting is not None and state in PENDING:
            self.waiting.add(jid)
        elif self.waiting:
            self.waiting.discard(jid)
        if state in FINISHED and job.end_time is not None and (
                state0 not in FINISHED or end0 != job.end_time):
            self.ends.file(jid, job.end_time)

    def _place(self, jid: int, alloc0: Alloc, was_active: bool, job: Job) -> None:
        """Move ``jid`` from its old allocation's hosts to its new one's."""
        now_active = job.state in ACTIVE
        for s in alloc0:
            if s not in job.alloc:
                _unindex(self.by_host, s.host, jid)
            if was_active:
                self._inactive(s.host, jid)
        exclusive = now_active and bool(job.alloc) and is_exclusive(job)
        for s in job.alloc:
            if s not in alloc0:
                _index(self.by_host, s.host, jid)
            if now_active:
                self.active_on.setdefault(s.host, set()).add(jid)
            if exclusive:
                self.exclusive_on.setdefault(s.host, set()).add(jid)

    def _inactive(self, host: str, jid: int) -> None:
        for index in (self.active_on, self.exclusive_on):
            on = index.get(host)
            if on is not None:
                on.discard(jid)
                if not on:
                    del index[host]

    def _count(self, queue: str, state: str, n: int) -> None:
        key = (queue, state)
        left = self.counts.get(key, 0) + n
        if left:
            self.counts[key] = left
        else:
            self.counts.pop(key, None)

    def due_finished(self, before: float, most: int) -> list[int]:
        """At most ``most`` finished jobs that ended before ``before`` (from the end-time
        buckets: only what is due is looked at)."""
        out: list[int] = []
        taken: set[int] = set()  # a job filed twice (finished, requeued, finished) counts once
        later: list[tuple[int, float]] = []  # filed again once this pass is done
        while len(out) < most:
            batch = self.ends.due(before, most - len(out))
            if not batch:
                break
            for jid in batch:
                job = self.jobs.get(jid)
                if job is None or job.state not in FINISHED or job.end_time is None:
                    continue  # removed or requeued since it was filed
                if job.end_time >= before:
                    later.append((jid, job.end_time))
                elif jid not in taken:
                    taken.add(jid)
                    out.append(jid)
        for jid, end in later:
            self.ends.refile(jid, end, before)
        return out

    # -- queries ---------------------------------------------------------------------------

    def page(self, q: Query, start: int, limit: int, max_bytes: int, budget: int) -> Page:
        """Up to ``limit`` matching jobs with id >= ``start``, in id order, at most about
        ``max_bytes`` of JSON (always at least one job) and ``budget`` jobs examined."""
        out: list[bytes] = []
        size = scanned = 0
        last = q.last
        for jid in self.candidates(q, max(start, q.first)):
            if last is not None and jid > last:
                break
            if scanned >= budget:
                return Page(out, jid, scanned)
            scanned += 1
            job = self.jobs[jid]
            if not q.matches(job):
                continue
            data = job.json()
            if out and size + len(data) > max_bytes:
                return Page(out, jid, scanned)
            out.append(data)
            size += len(data)
            if len(out) >= limit:
                return Page(out, jid + 1, scanned)
        return Page(out, None, scanned)

    def candidates(self, q: Query, start: int) -> Iterator[int]:
        """Ids >= ``start`` of the smallest index that holds every match of ``q``."""
        if q.jobids is not None:
            return (j for j in q.jobids if j >= start and j in self.jobs)
        if q.array is not None:
            return self.by_array.get(q.array, IdSet()).iter_from(start)
        if q.host is not None and q.states and q.states <= ACTIVE:  # a host's running jobs
            return iter(sorted(j for j in self.active_on.get(q.host, ()) if j >= start))
        options: list[list[IdSet]] = []
        if q.states:
            options.append([self.by_state[s] for s in sorted(q.states)])
        for index, value in ((self.by_user, q.user), (self.by_queue, q.queue),
                             (self.by_host, q.host), (self.by_name, q.name)):
            if value is not None:
                found = index.get(value)
                if found is None and not (index is self.by_name and value == ""):
                    return iter(())
                if found is not None:
                    options.append([found])
        if not options:
            return self.all.iter_from(start)
        best = min(options, key=lambda sets: sum(len(s) for s in sets))
        if len(best) == 1:
            return best[0].iter_from(start)
        return heapq.merge(*(s.iter_from(start) for s in best))

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def load(cls, jobs: Iterable[Job], clean_width: float = 60.0) -> JobTable:
        """:meth:`build` for a store's whole load (on a thread), with the collector off
        meanwhile, and every object alive at its end frozen (``gc.freeze``) before the
        collector is on again.

        Why both: a million new objects would cost three times as long in collections; and
        the collector being off does not keep them out of the young generation, so the first
        collection after it -- of generation 0, on whichever thread allocates next -- walked
        all of them holding the GIL, which stalled the event loop (its heartbeats, lease
        renewals and queries) for 1.7 s with 1,000,000 jobs on a loaded 2-core machine
        (tests/controller/test_ctl_load_stall.py). Frozen, they are never scanned again; the
        state lives as long as the candidate, and reference counting still frees a removed
        job.
        """
        enabled = gc.isenabled()
        gc.disable()
        try:
            table = cls.build(jobs, clean_width)
            gc.freeze()
            return table
        finally:
            if enabled:
                gc.enable()

    @classmethod
    def build(cls, jobs: Iterable[Job], clean_width: float = 60.0) -> JobTable:
        """A table of ``jobs`` given in ascending id order (a store's rows, by key): the
        indexes are built in one pass, without a search per job."""
        t = cls(clean_width)
        ids: list[int] = []
        per: dict[str, dict[str, list[int]]] = {"state": {}, "user": {}, "queue": {},
                                                "name": {}, "host": {}}
        st, us, qu, na, ho = (per[k] for k in ("state", "user", "queue", "name", "host"))
        table = t.jobs
        counts = t.counts
        reasons: list[int] = []
        ar: dict[int, list[int]] = {}
        for job in jobs:
            jid = job.jobid
            table[jid] = job
            ids.append(jid)
            state = job.state
            _append(st, state, jid)
            _append(us, job.user, jid)
            _append(qu, job.queue, jid)
            if job.name:
                _append(na, job.name, jid)
            arr = job.array_of()
            if arr is not None:
                _append(ar, arr, jid)
                t.elements[(arr, job.array["index"])] = jid  # type: ignore[index]
            key = (job.queue, state)
            counts[key] = counts.get(key, 0) + 1
            if job.alloc:
                active = state in ACTIVE
                exclusive = active and is_exclusive(job)
                for s in job.alloc:
                    _append(ho, s.host, jid)
                    if active:
                        t.active_on.setdefault(s.host, set()).add(jid)
                    if exclusive:
                        t.exclusive_on.setdefault(s.host, set()).add(jid)
            if job.pend_reason is not None and state in PENDING:
                reasons.append(jid)
            if job.waiting is not None and state in PENDING:
                t.waiting.add(jid)
            if state in FINISHED and job.end_time is not None:
                t.ends.file(jid, job.end_time)
        if len(table) != len(ids):
            raise ValueError("JobTable.build: a job id is given twice")
        # Every list is ascending: the jobs came in id order (checked just above: no id twice).
        of = IdSet.of_ascending
        t.all = of(ids)
        t.reasons = of(reasons)
        for state_name, lst in st.items():
            t.by_state[state_name] = of(lst)
        t.by_user = {k: of(v) for k, v in us.items()}
        t.by_queue = {k: of(v) for k, v in qu.items()}
        t.by_name = {k: of(v) for k, v in na.items()}
        t.by_host = {k: of(v) for k, v in ho.items()}
        t.by_array = {k: of(v) for k, v in ar.items()}
        return t

    def used_slots(self) -> dict[str, int]:
        """Slots taken on each host by its active jobs."""
        used: dict[str, int] = {}
        for host, ids in self.active_on.items():
            jobs = self.jobs
            used[host] = sum(s.ntasks for j in ids for s in jobs[j].alloc if s.host == host)
        return used


def _index(index: dict[Any, IdSet], key: Any, jid: int) -> None:
    found = index.get(key)
    if found is None:
        found = index[key] = IdSet()
    found.add(jid)


def _unindex(index: dict[Any, IdSet], key: Any, jid: int) -> None:
    found = index.get(key)
    if found is not None:
        found.discard(jid)
        if not found:
            del index[key]


def _append(groups: dict[Any, list[int]], key: Any, jid: int) -> None:
    lst = groups.get(key)
    if lst is None:
        groups[key] = [jid]
    else:
        lst.append(jid)
