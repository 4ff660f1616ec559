"""A parallel job's tasks beyond its first: launched from inside the job, run by the workers
of its other hosts (like LSF's blaunch, Slurm's srun inside an allocation).

A job allocated to several hosts runs its first task (rank 0) on its first host; that worker
gives the job a random secret (``XCE_TASK_SECRET``) and reports only its SHA-256 with the
job's ``start`` (:func:`set_key`). ``task_launch`` (:func:`launch`) from inside the job must
act for the job's owner and present the secret; it adds one task record per named host to the
job's ``tasks`` and the job record's push carries them to the workers of those hosts, which
start them and report ``task_start`` / ``task_finish`` / ``task_fail`` (:func:`notify`).

The job ends when its first task ends; its workers then kill the tasks they still run and
report how they ended (accepted after the job ended). A host that becomes unavail while a
task runs there fails the job: it is killed with the reason naming the host
(:func:`host_lost`). ``task_block`` (:func:`block`) pauses launches.

A task record: ``{"task", "host", "launch" (its command: ``commands[launch]``, one per
``task_launch``), "state" (PEND, RUN, DONE, EXIT), "pid", "exit_status", "launch_time",
"start_time", "end_time", "reason", "usage"}`` (``usage``: the worker's latest sample while
the task runs, its final figures once it ended; the job's live usage sums its first task's
latest sample, kept in ``tasks`` as ``first_usage``, and every task's: :func:`live_usage`).
The record travels with every push of its
job (to the job's hosts), so a job's tasks are bounded: at most :data:`TASKS_MAX`, their
commands at most :data:`TASK_COMMANDS_MAX` characters in all. All of it is pure: state
changes returned as :class:`~xce_controller.state.Changes`, as in ``state.py``.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Protocol

from xce_controller.jobs import Job, reported_time
from xcecore.protocol import ACTIVE, FINISHED
from xcecore.schema.limits import TASK_COMMANDS_MAX, TASKS_MAX
from xcecore.wire import ErrorCode, RemoteError


class Changes(Protocol):
    """What a transition did (:class:`xce_controller.state.Changes`)."""

    result: Any
    rows: list[Any]
    events: list[Any]


class ClusterState(Protocol):
    """What this module uses of :class:`xce_controller.state.ClusterState` (which calls it)."""

    hosts: dict[str, dict[str, Any]]

    def job_changed(self, ch: Any, job: Job, was: str, extra_hosts: Any = ()) -> None: ...

    def signal_job(self, ch: Any, job: Job, signal: str) -> None: ...

TASK_ENDED = frozenset({"DONE", "EXIT"})
SUMMED = ("utime", "stime", "cputime", "max_mem")
"""Usage figures a task adds to its job's (CPU seconds; peak memory per host, summed)."""
LIVE_SUMMED = (*SUMMED, "mem", "swap", "nprocs")
"""...and while the job runs, what its tasks use now (memory, processes) too."""
FIRST_USAGE = "first_usage"
"""The key, in a running job's ``tasks``, of its first task's latest sample (the live sum)."""


def _tasks(job: Job) -> dict[str, Any]:
    if job.tasks is None:
        job.tasks = {"blocked": False, "list": []}
    return job.tasks


def set_key(job: Job, key: str) -> None:
    """The job's ``start`` carried the SHA-256 of its task secret."""
    _tasks(job)["key"] = key


def launch(st: ClusterState, ch: Changes, job: Job, hosts: list[str], command: str,
           secret: str, now: float) -> None:
    """``task_launch`` into ``ch`` (the caller acts for the job's owner: checked by the op)."""
    jid = job.jobid
    if job.state != "RUN":
        raise RemoteError(ErrorCode.CONFLICT, f"task_launch: job {jid} is {job.state}, not RUN")
    t = job.tasks
    key = t.get("key") if t is not None else None
    if not isinstance(key, str):
        raise RemoteError(ErrorCode.DENIED, f"task_launch: job {jid} has no task secret (it is "
                          "not allocated to several hosts, or its start is not reported yet)")
    if not hmac.compare_digest(hashlib.sha256(secret.encode()).hexdigest(), key):
        raise RemoteError(ErrorCode.DENIED, f"task_launch: wrong task secret for job {jid}: "
                          "only the job itself (XCE_TASK_SECRET) may launch its tasks")
    outside = [h for h in dict.fromkeys(hosts) if not job.runs_on(h)]
    if outside:
        raise RemoteError(ErrorCode.INVALID, f"task_launch: host(s) {', '.join(outside)} not in "
                          f"job {jid}'s allocation ({' '.join(s.host for s in job.alloc)})",
                          {"arg": "hosts", "outside": outside})
    down = [h for h in dict.fromkeys(hosts) if not st.hosts.get(h, {}).get("available")]
    if down:
        raise RemoteError(ErrorCode.CONFLICT, f"task_launch: host(s) {', '.join(down)} of job "
                          f"{jid} unavailable", {"unavailable": down})
    assert t is not None
    if t.get("blocked"):
        raise RemoteError(ErrorCode.CONFLICT, f"task_launch: task launches of job {jid} are "
                          "blocked (xce task unblock)", {"blocked": True})
    records: list[dict[str, Any]] = t["list"]
    if len(records) + len(hosts) > TASKS_MAX:
        raise RemoteError(ErrorCode.INVALID, f"task_launch: job {jid} would have more than "
                          f"{TASKS_MAX} tasks", {"arg": "hosts"})
    commands: list[str] = t.setdefault("commands", [])
    if sum(map(len, commands)) + len(command) > TASK_COMMANDS_MAX:
        raise RemoteError(ErrorCode.INVALID, f"task_launch: job {jid}'s task commands would "
                          f"pass {TASK_COMMANDS_MAX:,} characters in all", {"arg": "command"})
    commands.append(command)
    first = len(records) + 1
    ids = list(range(first, first + len(hosts)))
    for n, host in zip(ids, hosts, strict=True):
        records.append({"task": n, "host": host, "launch": len(commands) - 1, "state": "PEND",
                        "pid": None, "exit_status": None, "launch_time": now,
                        "start_time": None, "end_time": None, "reason": None})
    ch.result = {"jobid": jid, "tasks": ids}
    st.job_changed(ch, job, job.state)


def block(st: ClusterState, ch: Changes, job: Job, blocked: bool) -> None:
    """``task_block`` into ``ch``: pause or resume the job's task launches."""
    if job.state not in ACTIVE:
        raise RemoteError(ErrorCode.CONFLICT, f"task_block: job {job.jobid} is {job.state}: it "
                          "launches no tasks")
    ch.result = job
    _tasks(job)["blocked"] = blocked
    st.job_changed(ch, job, job.state)


def _task(job: Job, host: str, n: int) -> dict[str, Any]:
    for rec in (job.tasks or {}).get("list", ()):
        if rec["task"] == n:
            if rec["host"] != host:
                raise RemoteError(ErrorCode.DENIED, f"task {n} of job {job.jobid} runs on "
                                  f"{rec['host']}, not {host}")
            return rec  # type: ignore[no-any-return]
    raise RemoteError(ErrorCode.NOT_FOUND, f"job {job.jobid} has no task {n}")


def _add_usage(total: dict[str, Any], usage: Any,
               keys: tuple[str, ...] = SUMMED) -> dict[str, Any]:
    if not isinstance(usage, dict):
        return total
    out = dict(total)
    for k in keys:
        v = usage.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = round(float(out.get(k, 0)) + v, 6)
    return out


def live_usage(job: Job, host: str, task: int | None,
               usage: dict[str, Any]) -> dict[str, Any] | None:
    """A sample of a running job's usage from ``host``: its first task's (``task`` None) or
    a launched task's. The job's live figure: its first task's latest sample plus every
    task's latest (a running one's sample, an ended one's final figures), as the final
    figure counts every task; None for a late sample (of a task that is not running, or of
    a job with tasks that ended).

    The first task's latest sample is kept in ``tasks`` (:data:`FIRST_USAGE`), each task's
    in its record's ``usage``. A primary that has no first-task sample yet (just promoted)
    records a task's sample and sums at the first task's next one."""
    t = job.tasks
    if task is None:
        if not t or not t.get("list"):
            return usage  # no launched tasks: the first task's is the job's
        if job.state in FINISHED:
            return None  # a sample overtaken by the end report: the final sum stands
        t[FIRST_USAGE] = usage
        return _live_sum(t)
    rec = _task(job, host, task)
    if rec["state"] != "RUN":
        return None
    rec["usage"] = usage
    return _live_sum(t) if t and FIRST_USAGE in t else None


def _live_sum(t: dict[str, Any]) -> dict[str, Any]:
    total = dict(t[FIRST_USAGE])
    for rec in t.get("list", ()):
        total = _add_usage(total, rec.get("usage"), LIVE_SUMMED)
    return total


def total_usage(job: Job, usage: dict[str, Any]) -> dict[str, Any]:
    """The job's final usage: its first task's plus every task's that ended before it (the
    live sum's first-task sample is dropped: the job ended)."""
    if job.tasks:
        job.tasks.pop(FIRST_USAGE, None)
    for rec in (job.tasks or {}).get("list", ()):
        if rec["state"] in TASK_ENDED:
            usage = _add_usage(usage, rec.get("usage"))
    return usage


def notify(st: ClusterState, ch: Changes, host: str, job: Job, args: dict[str, Any],
           now: float) -> None:
    """``task_start`` / ``task_finish`` / ``task_fail`` from the worker of ``host``, into
    ``ch``."""
    rec = _task(job, host, args["task"])
    event = args["event"]
    when = reported_time(args.get("time"), rec.get("start_time") if event != "task_start"
                         else job.submit_time, now)
    ch.result = job
    if rec["state"] in TASK_ENDED:
        return  # re-delivered after a failover, or ended by its host's loss
    if event == "task_start":
        rec.update(state="RUN", pid=args["pid"], start_time=when)
    else:
        code, was = args.get("exit_status"), rec["state"]
        rec.update(state="DONE" if event == "task_finish" and code == 0 else "EXIT",
                   exit_status=code, end_time=when)
        if event == "task_fail":
            text = str(args.get("reason", "failed"))
            rec["reason"] = "could not start: " + text if was == "PEND" else "failed: " + text
        if "usage" in args:
            rec["usage"] = args["usage"]
            if job.state in FINISHED:  # ended after its job (killed then): adds to it now
                job.usage = _add_usage(job.usage, args["usage"])
            elif job.tasks and FIRST_USAGE in job.tasks:  # the live sum, with its final
                job.usage = _live_sum(job.tasks)
    st.job_changed(ch, job, job.state)


def host_lost(st: ClusterState, ch: Changes, job: Job, host: str) -> None:
    """``host`` (not the job's first) became unavail: its unfinished tasks are lost, and a
    job that had one there is killed, the reason naming the host."""
    lost = [rec for rec in (job.tasks or {}).get("list", ())
            if rec["host"] == host and rec["state"] not in TASK_ENDED]
    if not lost:
        return
    for rec in lost:
        rec.update(state="EXIT", reason=f"host {host} became unavailable")
    if job.state in ACTIVE and job.signal != "kill":
        st.signal_job(ch, job, "kill")
        names = ", ".join(str(rec["task"]) for rec in lost)
        job.reason = f"killed: host {host} of task(s) {names} became unavailable"
    st.job_changed(ch, job, job.state)
