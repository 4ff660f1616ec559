"""The picker's own indexed copy of what it schedules: pending jobs by queue and shape, hosts.

The picker thread owns a :class:`Board` and nothing else touches it: each cycle it drains the
view's journal (the changes the replica applied on the event loop since the last cycle) into
it, so a cycle costs what changed, never a copy of every job.

Pending jobs are grouped per queue into *shapes*: the jobs of one queue with the same
resource requirement and task count are interchangeable for placement, so they are kept
together in submit order (a sorted list of ``(submit_time, jobid)``). Once a shape's first
job does not fit, none of its later jobs can fit in the same cycle (free slots only shrink),
so the picker stops looking at it: 1,000,000 jobs of a few shapes cost a few steps per cycle.
A shape remembers the pend reason its jobs were last given and which jobs arrived since, so
reasons are worked out again only for what changed. Exclusive jobs (``-x``) are shapes of
their own, and the board knows the hosts active exclusive jobs hold (no other job goes there).

Jobs of an inactive queue are *parked*: held by id only (:attr:`Board.parked`), in no shape,
so that a million of them cost one dict entry each to take in (a join's sync) and nothing per
cycle; the queue's activation puts them in their shapes, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from sortedcontainers import SortedList

from xce_scheduler.view import Entry, Record, is_array
from xcecore.protocol import ACTIVE

ShapeKey = tuple[str, int] | tuple[str, int, bool]
"""(resource requirement text, ntasks), and True third for exclusive (``-x``) jobs."""


def order_key(job: Record) -> tuple[float, int]:
    """Order of pending jobs within one queue: submit time, then job id."""
    return (float(job.get("submit_time") or 0.0), job["jobid"])


def exclusive(job: Record) -> bool:
    """Whether a job wants its hosts to itself (``-x``: the record's ``exclusive``)."""
    return job.get("exclusive") is True


def placement(job: Record) -> tuple[str, str, int, tuple[float, int]]:
    """(queue, requirement, ntasks, order key) of a pending job's record; raises
    ``TypeError``/``ValueError`` when it lacks what placement reads, in usable types."""
    ntasks = job.get("ntasks") or 1
    if type(ntasks) is not int or ntasks < 1:
        raise ValueError(f"ntasks {ntasks!r:.40} is not a positive integer")
    queue = job.get("queue") or ""
    resreq = job.get("resreq") or ""
    if type(queue) is not str or type(resreq) is not str:
        raise TypeError("queue and resreq must be strings")
    return queue, resreq, ntasks, (float(job.get("submit_time") or 0.0), job["jobid"])


class Shape:
    """The pending jobs of one queue that share a requirement and a task count, in order."""

    __slots__ = ("exclusive", "fresh", "jobs", "key", "ntasks", "queue", "reason", "resreq")

    def __init__(self, queue: str, resreq: str, ntasks: int, exclusive: bool = False) -> None:
        self.queue = queue
        self.resreq = resreq
        self.ntasks = ntasks
        self.exclusive = exclusive
        self.key: ShapeKey = (resreq, ntasks, True) if exclusive else (resreq, ntasks)
        self.jobs: Any = SortedList()  # of (submit_time, jobid)
        self.fresh: set[int] = set()  # jobs that need their reason worked out again
        self.reason: str | None = None  # what every job past the first misfit was last given

    def __len__(self) -> int:
        return len(self.jobs)


@dataclass
class Drained:
    """What one drain of the journal changed."""

    changes: int = 0  # changes of anything but load values
    loads: int = 0  # changes of load values (resvals)
    left: list[int] = field(default_factory=list)  # jobs that are no longer pending
    moved: list[int] = field(default_factory=list)  # pending arrays whose record changed
    echoed: list[tuple[int, str | None]] = field(default_factory=list)  # pushed pend reasons
    reset: bool = False  # a sync began: reasons are to be worked out (and sent) anew
    completed: bool = False  # a sync ended


class Board:
    """Hosts, queues, site resources, pending jobs by queue and shape, pushed pend reasons."""

    def __init__(self) -> None:
        self.hosts: dict[str, Record] = {}
        self.resvals: dict[str, Record] = {}
        self.queues: dict[str, Record] = {}
        self.cluster: Record = {}
        self.resources: tuple[Any, ...] = ()
        self.pending: dict[int, Record] = {}
        self.parked: dict[str, dict[int, Record]] = {}  # inactive queue -> its pending jobs
        self.by_queue: dict[str, dict[ShapeKey, Shape]] = {}
        self._shape_of: dict[int, Shape] = {}
        self.reasons: dict[int, str] = {}  # pushed (volatile) pend reasons
        self.complete = False  # the view is whole: reasons may be worked out
        self.exclusive_on: dict[str, set[int]] = {}  # host -> the exclusive jobs active on it
        self._exclusive_hosts: dict[int, tuple[str, ...]] = {}  # such a job -> its hosts
        self.rusage_active: dict[int, Record] = {}  # active jobs with rusage: their reservations
        self.rusage_changes: list[tuple[int, Record | None]] = []  # started/ended, for the picker
        self.epoch = 0  # syncs begun: a new one forgets the reasons requested

    # ------------------------------------------------------------------ reading
    def current_reason(self, jobid: int) -> str | None:
        """The reason the controller has for ``jobid``, as last pushed."""
        reason = self.reasons.get(jobid)
        if reason is not None:
            return reason
        job = self.pending.get(jobid)
        return None if job is None else job.get("pend_reason")

    def current_reasons(self, jobids: Iterable[int]) -> dict[int, str | None]:
        """:meth:`current_reason` of each of ``jobids`` (one pass, for a cycle's reasons)."""
        reasons, pending = self.reasons, self.pending
        out: dict[int, str | None] = {}
        for jobid in jobids:
            reason = reasons.get(jobid)
            if reason is None:
                job = pending.get(jobid)
                reason = None if job is None else job.get("pend_reason")
            out[jobid] = reason
        return out

    def shape(self, jobid: int) -> Shape | None:
        """The shape a pending job is in."""
        return self._shape_of.get(jobid)

    def refresh(self, jobids: Iterable[int]) -> None:
        """These pending jobs need their reason worked out again (they were in flight)."""
        for jobid in jobids:
            shape = self._shape_of.get(jobid)
            if shape is not None:
                shape.fresh.add(jobid)

    def host_record(self, name: str) -> Record:
        """The host's record with its latest pushed load values."""
        host = self.hosts[name]
        values = self.resvals.get(name)
        if values is None:
            return host
        return {**host, "resvals": values.get("values") or {}}

    # ------------------------------------------------------------------ the journal
    def drain(self, entries: Iterable[Entry]) -> Drained:
        """Apply the view's journal entries, in order."""
        out = Drained()
        for kind, key, new in entries:
            if kind == "jobs":
                self._job(key, new, out)
                out.changes += 1
            elif kind == "resvals":
                if new is None:
                    self.resvals.pop(key, None)
                else:
                    self.resvals[key] = new
                out.loads += 1
            elif kind == "hosts":
                if new is None:
                    self.hosts.pop(key, None)
                else:
                    self.hosts[key] = new
                out.changes += 1
            elif kind == "queues":
                if new is None:
                    self.queues.pop(key, None)
                else:
                    self.queues[key] = new
                if key in self.parked and not self._inactive(key):
                    self._unpark_queue(key)
                out.changes += 1
            elif kind == "pend_reasons":
                reason = None if new is None else new.get("reason")
                if isinstance(reason, str):
                    self.reasons[key] = reason
                else:
                    reason = None
                    self.reasons.pop(key, None)
                out.echoed.append((key, reason))
            elif kind == "cluster":
                self.cluster = new or {}
                self.resources = tuple(self.cluster.get("resources") or ())
                out.changes += 1
            elif kind == "reset":
                self._reset(key, out)
            elif kind == "complete":
                for name in [q for q in self.parked if not self._inactive(q)]:
                    self._unpark_queue(name)  # its queue is gone, or active after all
                self.complete = out.completed = True
                out.changes += 1
        return out

    def _reset(self, kinds: frozenset[str], out: Drained) -> None:
        self.complete = False
        self.epoch += 1
        out.reset = True
        out.changes += 1
        if "jobs" in kinds:
            out.left += list(self.pending)
            self.pending, self.by_queue, self._shape_of, self.parked = {}, {}, {}, {}
        if "hosts" in kinds:
            self.hosts = {}
        if "jobs" in kinds:
            self.exclusive_on, self._exclusive_hosts = {}, {}
            self.rusage_changes.extend((jobid, None) for jobid in self.rusage_active)
            self.rusage_active = {}
        if "queues" in kinds:
            self.queues = {}
        if "resvals" in kinds:
            self.resvals = {}
        if "pend_reasons" in kinds:
            self.reasons = {}
        if "cluster" in kinds:
            self.cluster, self.resources = {}, ()
        for shapes in self.by_queue.values():  # a new sync: every reason is sent again
            for shape in shapes.values():
                shape.reason = None

    def _inactive(self, queue: Any) -> bool:
        """Whether ``queue`` is known and inactive (its pending jobs are parked)."""
        q = self.queues.get(queue) if type(queue) is str else None
        return q is not None and not q.get("active", True)

    def _job(self, jobid: int, job: Record | None, out: Drained) -> None:
        if job is not None and job.get("state") == "PEND" and self._inactive(job.get("queue")):
            self._park(jobid, job)  # the sync of a million parked jobs comes this way
            return
        self._exclusive(jobid, job)
        self._rusage(jobid, job)
        if job is not None and job.get("state") == "PEND" and not job.get("waiting"):
            # (a job waiting on a dependency is not the picker's until it may run)
            try:
                place = placement(job)
            except (TypeError, ValueError) as exc:
                logger.warning("scheduler: pending job {} has a malformed record ({}); not "
                               "scheduling it", jobid, exc)
            else:
                if is_array(job) and jobid in self.pending:
                    out.moved.append(jobid)  # elements went (or came): it may go again
                self._put(jobid, job, place)
                return
        old = self.pending.pop(jobid, None)
        if old is not None:
            out.left.append(jobid)
            self._unshape(jobid, old)
            self._unpark(jobid, old)

    def _park(self, jobid: int, job: Record) -> None:
        """Hold a pending job of an inactive queue by id, in no shape (a dict entry)."""
        if jobid in self._exclusive_hosts or jobid in self.rusage_active:  # it ran before
            self._exclusive(jobid, job)
            self._rusage(jobid, job)
        old = self.pending.get(jobid)
        if old is not None:
            self._unshape(jobid, old)
            if old.get("queue") != job["queue"]:
                self._unpark(jobid, old)
        self.pending[jobid] = job
        parked = self.parked.get(job["queue"])
        if parked is None:
            parked = self.parked[job["queue"]] = {}
        parked[jobid] = job

    def _unpark(self, jobid: int, old: Record) -> None:
        parked = self.parked.get(old.get("queue"))  # type: ignore[arg-type]
        if parked is not None and parked.pop(jobid, None) is not None and not parked:
            del self.parked[old["queue"]]

    def _unpark_queue(self, queue: str) -> None:
        """The queue dispatches (or is gone): its parked jobs go into their shapes, once."""
        jobs = self.parked.pop(queue, {})
        if len(jobs) > 10_000:
            logger.info("scheduler: queue {} is active: placing its {} waiting job(s) in "
                        "their shapes", queue, len(jobs))
        unused = Drained()
        for jobid, job in jobs.items():
            del self.pending[jobid]  # taken in again as any pending job
            self._job(jobid, job, unused)

    def _exclusive(self, jobid: int, job: Record | None) -> None:
        """Keep :attr:`exclusive_on`: the hosts of active exclusive jobs (no other job goes
        there). Costs the job's hosts."""
        hosts: tuple[str, ...] = ()
        if job is not None and exclusive(job) and job.get("state") in ACTIVE:
            hosts = tuple(str(a.get("host")) for a in job.get("alloc") or ()
                          if isinstance(a, dict))
        old = self._exclusive_hosts.pop(jobid, ())
        if old == hosts:
            if hosts:
                self._exclusive_hosts[jobid] = hosts
            return
        for name in old:
            on = self.exclusive_on.get(name)
            if on is not None:
                on.discard(jobid)
                if not on:
                    del self.exclusive_on[name]
        for name in hosts:
            self.exclusive_on.setdefault(name, set()).add(jobid)
        if hosts:
            self._exclusive_hosts[jobid] = hosts

    def _rusage(self, jobid: int, job: Record | None) -> None:
        """Note active jobs with rusage starting and ending (their reservations are held
        while they run: :mod:`xce_scheduler.holds`)."""
        active = (job is not None and job.get("state") in ACTIVE and bool(job.get("alloc"))
                  and "rusage" in str(job.get("resreq") or ""))
        old = self.rusage_active.get(jobid)
        if active and job is not None:
            if old is None or old.get("alloc") != job.get("alloc") or \
                    old.get("attempt") != job.get("attempt"):
                self.rusage_changes.append((jobid, job))
            self.rusage_active[jobid] = job
        elif old is not None:
            del self.rusage_active[jobid]
            self.rusage_changes.append((jobid, None))

    def _put(self, jobid: int, job: Record, place: tuple[str, str, int, tuple[float, int]]) -> None:
        queue, resreq, ntasks, key = place
        excl = exclusive(job)
        old = self.pending.get(jobid)
        self.pending[jobid] = job
        shape = self._shape_of.get(jobid)
        if shape is not None and old is not None:
            if shape.queue == queue and shape.resreq == resreq and shape.ntasks == ntasks \
                    and shape.exclusive == excl and order_key(old) == key:
                return  # same place: only the record changed (a pend reason, a signal)
            self._unshape(jobid, old)
        elif old is not None:
            self._unpark(jobid, old)  # from an inactive queue to an active one
        shapes = self.by_queue.get(queue)
        if shapes is None:
            shapes = self.by_queue[queue] = {}
        skey: ShapeKey = (resreq, ntasks, True) if excl else (resreq, ntasks)
        shape = shapes.get(skey)
        if shape is None:
            shape = shapes[skey] = Shape(queue, resreq, ntasks, excl)
        shape.jobs.add(key)
        if shape.reason is not None:  # else its whole tail is looked at again anyway
            shape.fresh.add(jobid)
        self._shape_of[jobid] = shape

    def _unshape(self, jobid: int, old: Record) -> None:
        """Take ``jobid`` out of its shape; ``old`` is the record it was placed by."""
        shape = self._shape_of.pop(jobid, None)
        if shape is None:
            return
        shape.jobs.discard(order_key(old))
        shape.fresh.discard(jobid)
        if not shape.jobs:
            shapes = self.by_queue.get(shape.queue)
            if shapes is not None:
                shapes.pop(shape.key, None)
                if not shapes:
                    del self.by_queue[shape.queue]
