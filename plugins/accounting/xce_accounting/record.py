"""The pure core: from a job's previous view and its new record, the rows to write.

No I/O, no clock (``now`` is passed in), no state of its own. :func:`observe` compares what
the role last knew of a job (a :class:`View`, or None) with the record the controller sent
and returns the timeline events and, when an attempt ends, its finished-attempt row, plus the
new view. Everything it returns is keyed so that writing it twice writes nothing twice:

- a finished attempt by ``(jobid, attempt)``;
- an event by ``(jobid, seq)``, ``seq`` counting the job's events from the view it was
  derived from. The view is stored with every event, so after a restart the role continues
  from the last event it committed, and a re-delivery of a version it has seen yields nothing.

A version that arrives in a *sync* (the full state after a join or re-join) rather than as a
live change may hide transitions the role never saw (a stop and resume, a pending reason); the
events derived from it are preceded by a ``gap`` event saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from xcecore.protocol import ACTIVE, FINISHED, PENDING

Record = dict[str, Any]
REQUEUED = "REQUEUED"
"""The state of an attempt row whose run was requeued (killed and put back to PEND)."""

ATTEMPT_COLUMNS = (
    "jobid", "attempt", "array_index", "name", "user", "queue", "project", "submit_time",
    "start_time", "end_time", "hosts", "slots", "resreq", "state", "exit_status", "reason",
    "cpu_time", "max_mem", "wall_time", "wait_time", "mem_limit", "run_limit", "command",
)
"""The columns of a finished attempt, in the order of :class:`AttemptRow`'s values."""


class View(NamedTuple):
    """What the role remembers of a job between two of its versions."""

    attempt: int
    state: str
    reason: str | None = None  # the pending reason last recorded
    hosts: tuple[str, ...] = ()
    start_time: float | None = None
    seq: int = 0  # the last event's seq

    def to_json(self) -> list[Any]:
        """A compact JSON form (stored with the last event of each observation)."""
        return [self.attempt, self.state, self.reason, list(self.hosts), self.start_time, self.seq]

    @classmethod
    def from_json(cls, value: list[Any]) -> View:
        """The inverse of :meth:`to_json`."""
        attempt, state, reason, hosts, start, seq = value
        return cls(int(attempt), str(state), reason, tuple(hosts), start, int(seq))


@dataclass(slots=True)
class EventRow:
    """One timeline event: key ``(jobid, seq)``. ``view`` (the job's view after it) is kept
    on the last event of an observation only: where a restarted role continues from."""

    jobid: int
    seq: int
    attempt: int
    kind: str
    time: float
    user: str
    detail: dict[str, Any]
    view: View | None = None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One finished attempt: key ``(jobid, attempt)``; ``values`` follow :data:`ATTEMPT_COLUMNS`."""

    values: tuple[Any, ...]

    @property
    def key(self) -> tuple[int, int]:
        """``(jobid, attempt)``."""
        return self.values[0], self.values[1]


@dataclass(slots=True)
class Outcome:
    """What one observation produced."""

    view: View | None
    events: list[EventRow] = field(default_factory=list)
    attempts: list[AttemptRow] = field(default_factory=list)


def _hosts(job: Record) -> tuple[str, ...]:
    return tuple(a["host"] for a in job.get("alloc") or ())


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def cpu_time(usage: Any) -> float | None:
    """CPU seconds from a job's usage: ``cputime``, else ``utime`` + ``stime``."""
    if not isinstance(usage, dict):
        return None
    total = _num(usage.get("cputime"))
    if total is None:
        parts = [_num(usage.get(k)) for k in ("utime", "stime")]
        total = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    return total


def max_mem(usage: Any) -> float | None:
    """Peak memory (MB) from a job's usage: ``max_mem``, else the last ``mem`` sample."""
    if not isinstance(usage, dict):
        return None
    found = _num(usage.get("max_mem"))
    return found if found is not None else _num(usage.get("mem"))


def attempt_row(job: Record, attempt: int, state: str, hosts: tuple[str, ...],
                start: float | None, end: float | None, reason: str | None,
                exit_status: Any) -> AttemptRow:
    """The finished-attempt row of ``job``'s ``attempt``."""
    submit = _num(job.get("submit_time"))
    start, end = _num(start), _num(end)
    wall = max(0.0, end - start) if start is not None and end is not None else None
    wait = max(0.0, start - submit) if start is not None and submit is not None else None
    usage = job.get("usage")
    return AttemptRow((
        job["jobid"], attempt, job.get("array_index"), job.get("name") or "", job.get("user") or "",
        job.get("queue") or "", job.get("project") or "", submit, start, end,
        "," + ",".join(hosts) + "," if hosts else "", int(job.get("ntasks") or 1),
        job.get("resreq") or "", state, exit_status if isinstance(exit_status, int) else None,
        reason, cpu_time(usage), max_mem(usage), wall, wait, job.get("mem_limit"),
        job.get("run_limit"), job.get("command") or "",
    ))


class _Builder:
    """Appends events for one job, numbering them and advancing the view (mutable fields:
    building a frozen view per step costs more than the rest of the core)."""

    __slots__ = ("attempt", "hosts", "job", "out", "reason", "seq", "start_time", "state")

    def __init__(self, job: Record, view: View) -> None:
        self.job = job
        self.attempt, self.state, self.reason, self.hosts, self.start_time, self.seq = view
        self.out = Outcome(view)

    def view(self) -> View:
        return View(self.attempt, self.state, self.reason, self.hosts, self.start_time, self.seq)

    def event(self, kind: str, when: float, **detail: Any) -> None:
        self.seq += 1
        self.out.events.append(EventRow(self.job["jobid"], self.seq, self.attempt, kind, when,
                                        self.job.get("user") or "", detail))

    def done(self) -> Outcome:
        """The outcome, the last event carrying the final view."""
        view = self.out.view = self.view()
        if self.out.events:
            self.out.events[-1].view = view
        return self.out


def observe(prev: View | None, job: Record, now: float, *, synced: bool) -> Outcome:
    """The events and finished attempts between ``prev`` and ``job`` (the new version).

    ``synced``: ``job`` came in a sync (after a join or re-join), not as a live change, so
    what happened between ``prev`` and it was not seen: a ``gap`` event says so whenever the
    job changed (or, first seen, when it is no longer a fresh pending job).
    """
    attempt, state = int(job.get("attempt") or 0), job["state"]
    hosts, start = _hosts(job), _num(job.get("start_time"))
    submit = _num(job.get("submit_time")) or now
    fresh = attempt == 0 and state in PENDING and not hosts
    if prev is None:
        b = _Builder(job, View(0, "PEND"))
        if not fresh:
            b.event("gap", now, text="accounting first saw this job after its submission; "
                                     "events before this point may be missing")
        b.event("submitted", submit, queue=job.get("queue"), user=job.get("user"),
                project=job.get("project"), ntasks=job.get("ntasks"), resreq=job.get("resreq"))
        b.attempt = attempt
    else:
        b = _Builder(job, prev)
        changed = (prev.attempt, prev.state, prev.hosts, prev.start_time) != (attempt, state, hosts, start)
        if synced and changed and (prev.state not in FINISHED or prev.attempt != attempt):
            b.event("gap", now, text="changes while accounting was disconnected were not seen one "
                                     "by one; transient states in between may be missing")
        if attempt != prev.attempt:
            _end_attempt(b, prev, now, attempt)
    _advance(b, job, now, attempt, state, hosts, start)
    return b.done()


def _end_attempt(b: _Builder, prev: View, now: float, attempt: int) -> None:
    """The job moved to a later attempt: the earlier one was requeued."""
    job = b.job
    if prev.state not in FINISHED and (prev.state in ACTIVE or prev.hosts):  # a run ended by requeue
        b.out.attempts.append(attempt_row(job, prev.attempt, REQUEUED, prev.hosts,
                                          prev.start_time, now, "requeued", None))
    b.event("requeued", now, attempt=attempt, previous=prev.attempt)
    b.attempt, b.state, b.reason, b.hosts, b.start_time = attempt, "PEND", None, (), None


def _advance(b: _Builder, job: Record, now: float, attempt: int, state: str,
             hosts: tuple[str, ...], start: float | None) -> None:
    """Events from ``b.view`` (same attempt) to the record's state."""
    reason = job.get("pend_reason")
    if state in PENDING:
        if b.state == "PEND" and state == "PSUSP":
            b.event("stopped", now, by="user", state=state)
        elif b.state == "PSUSP" and state == "PEND":
            b.event("resumed", now, state=state)
        b.state = state
        if reason != b.reason and reason is not None:
            b.event("pending", now, reason=reason)
        b.reason = reason
        return
    if hosts and not b.hosts:
        b.event("dispatched", now, hosts=list(hosts), alloc=job.get("alloc"),
                forced=bool(job.get("forced")))
        b.hosts, b.state = hosts, "RUN"
    if start is not None and b.start_time is None:
        b.event("started", start, pid=job.get("pid"))
        b.start_time = start
    if state in ACTIVE and state != b.state:
        if state == "UNKWN":  # not a suspension: its host stopped reporting (it may still run)
            b.event("unknown", now, state=state, hosts=list(hosts or b.hosts))
        elif state == "RUN" and b.state == "UNKWN":
            b.event("reported", now, state=state)
        elif state == "RUN":
            b.event("resumed", now, state=state)
        else:
            b.event("stopped", now, by="user" if state == "USUSP" else "system", state=state)
        b.state = state
    if state in FINISHED and b.state not in FINISHED:
        end = _num(job.get("end_time")) or now
        b.event("finished", end, state=state, exit_status=job.get("exit_status"),
                reason=job.get("reason"), usage=job.get("usage") or {})
        b.out.attempts.append(attempt_row(job, attempt, state, hosts or b.hosts,
                                          start if start is not None else b.start_time, end,
                                          job.get("reason"), job.get("exit_status")))
        b.state = state
