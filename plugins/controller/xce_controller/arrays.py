"""Job arrays in the controller state: one record per array, a record per element only once
the element leaves the pending set.

An array (``jobsubmit`` with ``array``) is one :class:`~xce_controller.jobs.Job` whose
``array`` field holds its index expression, its running limit, its pending indexes as runs
(:class:`xcecore.arrayspec.Ranges`: 100,000 pending elements cost a few dozen bytes), how
many are left and how many elements are in each state. Its state sums its elements up:
PEND while indexes are pending (PSUSP while the array is stopped), RUN while elements are
unfinished, then DONE (every element DONE) or EXIT.

``jobdispatch`` of the array takes its lowest pending indexes and makes each an element
record with a job id of its own (Slurm's model; shown as ``ARRAY[INDEX]``), sharing the
array's submission bytes. From then on an element is a job like any other (the worker runs
it, reports it, it is requeued or killed by its own id or as ``ARRAY[INDEX]``); every change
of an element updates its array's counts in the same write (:func:`element_changed`, called
from the state's one job-change helper), so the array record is always current.

Nothing here walks jobs beyond one array's elements, and only for an action on the whole
array that a user asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from xce_controller.jobs import Job, JobTable
from xcecore.arrayspec import ArrayError, Ranges, describe, parse_array
from xcecore.protocol import ACTIVE, FINISHED, PENDING, UNFINISHED
from xcecore.wire import ErrorCode, RemoteError


class Changes(Protocol):
    """What a transition did (:class:`xce_controller.state.Changes`)."""

    result: Any
    rows: list[Any]
    events: list[Any]


class ClusterState(Protocol):
    """What this module uses of :class:`xce_controller.state.ClusterState` (which calls it)."""

    jobs: JobTable
    next_jobid: int
    array_batch: set[int] | None

    def job_changed(self, ch: Any, job: Job, was: str, extra_hosts: Iterable[str] = ()) -> None: ...

    def take_slots(self, ch: Any, job: Job, alloc: list[dict[str, Any]], force: bool) -> None: ...

    def control(self, jobid: int, action: str, now: float, by: str | None = None,
                index: int | None = None) -> Changes: ...


def _conflict(message: str) -> RemoteError:
    return RemoteError(ErrorCode.CONFLICT, message)


def is_array(job: Job) -> bool:
    """``job`` is an array's own record (not an element, not a plain job)."""
    return job.array is not None and "of" not in job.array


def new_array(text: str) -> dict[str, Any]:
    """The ``array`` field of a new array from its index expression (INVALID if malformed)."""
    try:
        spec = parse_array(text)
    except ArrayError as exc:
        raise RemoteError(ErrorCode.INVALID, f"jobsubmit: {exc}", {"arg": "array"}) from None
    return {"spec": describe(spec), "limit": spec.limit, "pending": spec.runs,
            "left": spec.size, "size": spec.size, "counts": {}, "held": False}


def active(array: dict[str, Any]) -> int:
    """Elements of an array that run (or are suspended while running)."""
    counts = array["counts"]
    return sum(counts.get(s, 0) for s in ACTIVE)


def check_limit(st: ClusterState, array_job: Job, more: int) -> None:
    """CONFLICT when ``more`` elements starting would pass the array's ``%limit``."""
    a = array_job.array
    assert a is not None
    limit = a["limit"]
    if limit is not None and active(a) + more > limit:
        raise RemoteError(ErrorCode.CONFLICT, f"array {array_job.jobid} runs {active(a)} of at "
                          f"most {limit} elements at once: cannot start {more} more")


def check_element(st: ClusterState, job: Job) -> None:
    """Before a pending element record (a requeued one) is dispatched: its array's limit."""
    of = job.array_of()
    parent = None if of is None else st.jobs.get(of)
    if parent is not None:
        check_limit(st, parent, 1)


def dispatch(st: ClusterState, parent: Job, allocs: list[list[dict[str, Any]]],
             force: bool, ch: Changes) -> list[Job]:
    """Make the array's lowest pending indexes elements running on ``allocs`` (one each);
    hosts, slots and the queue were checked by the caller. Returns the elements."""
    a = parent.array
    assert a is not None
    if a["held"]:
        raise RemoteError(ErrorCode.CONFLICT, f"array {parent.jobid} is stopped: it dispatches "
                          "no elements until resumed")
    if len(allocs) > a["left"]:
        raise RemoteError(ErrorCode.CONFLICT, f"array {parent.jobid} has {a['left']} pending "
                          f"element(s), not {len(allocs)}")
    check_limit(st, parent, len(allocs))
    pending = Ranges(a["pending"])
    out: list[Job] = []
    st.array_batch = set()
    try:
        for alloc in allocs:
            element = _materialise(st, parent, pending.take(), "PEND")
            st.take_slots(ch, element, alloc, force)
            out.append(element)
    finally:
        _settle_batch(st, ch)
    return out


def _materialise(st: ClusterState, parent: Job, index: int, state: str) -> Job:
    """An element record for ``index`` (taken out of the pending runs by the caller)."""
    a = parent.array
    assert a is not None
    jobid = st.next_jobid
    st.next_jobid += 1
    element = Job(parent._spec, jobid, parent.user, parent.queue, parent.name, parent.ntasks,
                  state, parent.submit_time, usage=parent.usage,
                  array={"of": parent.jobid, "index": index})
    a["left"] -= 1
    counts = a["counts"]
    counts[state] = counts.get(state, 0) + 1
    st.jobs.add(element)
    assert st.array_batch is not None
    st.array_batch.add(parent.jobid)
    return element


def element_changed(st: ClusterState, ch: Changes, job: Job, was: str) -> None:
    """An element's state went from ``was`` to its state: its array's counts follow, and
    the array's record is written and pushed with it (once per write)."""
    of = job.array_of()
    parent = None if of is None else st.jobs.get(of)
    if parent is None or was == job.state or parent.array is None:
        return
    counts = parent.array["counts"]
    left = counts.get(was, 0) - 1
    if left > 0:
        counts[was] = left
    else:
        counts.pop(was, None)
    counts[job.state] = counts.get(job.state, 0) + 1
    if job.end_time is not None and job.state in FINISHED:
        parent.end_time = max(parent.end_time or 0.0, job.end_time)
    if st.array_batch is not None:
        st.array_batch.add(parent.jobid)
    else:
        settle(st, ch, parent)


def settle(st: ClusterState, ch: Changes, parent: Job, now: float | None = None) -> None:
    """Bring the array's state in line with its pending indexes and elements; its row and push."""
    a = parent.array
    assert a is not None
    counts = a["counts"]
    if a["left"] > 0:
        state = "PSUSP" if a["held"] else "PEND"
    elif any(counts.get(s) for s in UNFINISHED):
        state = "RUN"
    else:
        state = "EXIT" if counts.get("EXIT") else "DONE"
        if parent.end_time is None:
            parent.end_time = now
    was = parent.state
    keys = st.jobs.keys(parent)
    parent.state = state
    if state not in FINISHED:
        parent.end_time = None
    if state not in PENDING:
        parent.pend_reason = None
    st.jobs.reindex(parent, keys)
    st.job_changed(ch, parent, was)


def _settle_batch(st: ClusterState, ch: Changes, now: float | None = None) -> None:
    batch, st.array_batch = st.array_batch or set(), None
    for jobid in sorted(batch):
        parent = st.jobs.get(jobid)
        if parent is not None:
            settle(st, ch, parent, now)


def element_id(st: ClusterState, parent: Job, index: int) -> int | None:
    """The job id of element ``index`` of the array, if it has a record."""
    return st.jobs.elements.get((parent.jobid, index))


# Which element states each action of the whole array applies to.
_WHOLE: dict[str, frozenset[str]] = {
    "kill": UNFINISHED,
    "stop": frozenset({"PEND", "RUN", "SSUSP"}),
    "resume": frozenset({"PSUSP", "USUSP", "SSUSP"}),
    "checkpoint": frozenset({"RUN"}),
    "requeue": ACTIVE | FINISHED,
}


def control(st: ClusterState, ch: Changes, parent: Job, index: int | None, action: str,
            now: float, by: str | None = None, killed: str = "killed") -> Changes:
    """``jobctrl`` of an array (``index`` None: the whole array) or of one of its elements,
    into ``ch`` (empty); returns the changes made (``ch``, or an element's own). ``by``:
    who asked; ``killed``: the reason a pending element killed here gets."""
    a = parent.array
    assert a is not None
    name = f"{parent.jobid}[{index}]"
    if index is not None:
        eid = element_id(st, parent, index)
        if eid is not None:
            return st.control(eid, action, now, by)
        pending = Ranges(a["pending"])
        if index not in pending:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no such array element: {name}",
                              {"what": "array element", "name": name})
        if action not in ("kill", "stop"):
            raise _conflict(f"job {name} is {'PSUSP' if a['held'] else 'PEND'}: cannot {action} it")
        pending.remove(index)
        st.array_batch = set()
        try:
            element = _materialise(st, parent, index, "PEND")
            keys = st.jobs.keys(element)
            if action == "kill":
                element.state, element.end_time, element.reason = "EXIT", now, killed
            else:
                element.state = "PSUSP"
            st.jobs.reindex(element, keys)
            st.job_changed(ch, element, "PEND")
        finally:
            _settle_batch(st, ch, now)
        ch.result = element
        return ch
    return _control_all(st, ch, parent, action, now, by)


def _control_all(st: ClusterState, ch: Changes, parent: Job, action: str, now: float,
                 by: str | None) -> Changes:
    a = parent.array
    assert a is not None
    applies = _WHOLE.get(action, frozenset())
    targets = [j for j in st.jobs.by_array.get(parent.jobid, ()) if st.jobs[j].state in applies]
    acted = bool(targets)
    st.array_batch = {parent.jobid}
    try:
        if action == "kill" and a["left"]:
            killed = a["left"]
            Ranges(a["pending"]).clear()
            a["left"] = 0
            a["counts"]["EXIT"] = a["counts"].get("EXIT", 0) + killed
            acted = True
        elif action == "stop" and a["left"] and not a["held"]:
            a["held"] = acted = True
        elif action == "resume" and a["held"]:
            a["held"], acted = False, True
        if not acted:
            raise _conflict(f"array {parent.jobid} is {parent.state}: none of its elements can "
                           f"be given {action}")
        for jobid in targets:
            sub = st.control(jobid, action, now, by)
            ch.rows.extend(sub.rows)
            ch.events.extend(sub.events)
    finally:
        _settle_batch(st, ch, now)
    ch.result = parent
    return ch


def summary(parent: Job) -> dict[str, int]:
    """Elements per state, the pending indexes counted as PEND (or PSUSP while stopped)."""
    a = parent.array
    assert a is not None
    out = dict(a["counts"])
    if a["left"]:
        key = "PSUSP" if a["held"] else "PEND"
        out[key] = out.get(key, 0) + a["left"]
    return out
