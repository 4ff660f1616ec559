"""A parallel job's launched tasks on this host (``xce task launch``, the controller's
``task_launch``): started, contained, killed and reported like the job itself.

The controller lists a job's tasks in its record (``tasks``); the record's push reaches the
worker of every host of the job, whose :class:`TaskRunner` starts each task named for its
host that is still PEND, once. A task runs as its job does (its user, working directory,
environment with ``XCE_TASKID``, limits) under the job's wrapper
(:data:`xce_worker.jobstart.WRAPPER`, gated until it is in its group), in a group of its own
named ``<jobid>.<attempt>.t<task>`` with the job's memory limit, and writes to the job's
output and error files (append: on a shared file system every task's output meets the job's;
the default files are the spool's ``<jobid>.out`` of each host).

Reports (spooled in the journal like the job's): ``task_start`` with the pid, ``task_finish``
with the exit status and the final usage (added to the job's), ``task_fail`` when it cannot
start. When the job ends (its record leaves this worker's replica, or is no longer active)
or the controller's sync no longer lists it, its tasks here are killed (SIGTERM, SIGKILL after
``kill_grace``) and report how they ended; stopping or resuming the job stops or resumes
them too.

A worker that restarts while tasks run re-adopts them, as it does its jobs: each running
task has ``<jobid>.<attempt>.t<task>.json`` beside its status file (pid, process start time,
status file), read at start before any push; a task still running (the same process, not a
reused pid) is watched, killed with its job and reported as before, its group kept and its
final usage read from it; one that ended meanwhile is reported with the status its wrapper
recorded. A task the controller shows RUN here that this worker does not run (its record
was lost) is reported failed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from xce_worker.containment import ContainmentError, EndedGroup, Limits
from xce_worker.jobstart import NO_FILES_STATUS, JobError, JobSpec, job_env, output_paths
from xce_worker.procman import (
    ProcessManager,
    RunningJob,
    create_time,
    end_group,
    is_int,
    read_status,
    same_process,
    shell_status,
    wait_gone,
)
from xcecore.protocol import ACTIVE

TaskKey = tuple[int, int, int]  # (jobid, attempt, task)


@dataclass
class RunningTask(RunningJob):
    """One task this worker runs (a :class:`RunningJob` so the process manager's kill
    serves it; its own key names its group, files and timers)."""

    task: int = 0

    @property
    def key(self) -> str:
        """``<jobid>.<attempt>.t<task>``."""
        return f"{self.jobid}.{self.attempt}.t{self.task}"


class TaskRunner:
    """Starts, kills and reports the tasks of this host (``pm``'s) from job records."""

    def __init__(self, pm: ProcessManager) -> None:
        self.pm = pm
        self.hname = pm.hname
        self._lock = threading.Lock()
        self.running: dict[TaskKey, RunningTask] = {}
        self._seen: dict[tuple[int, int], set[int]] = {}  # tasks started here, per attempt

    # ------------------------------------------------------------------ from records
    def job(self, job: dict[str, Any]) -> None:
        """A job record allocated here: start its tasks for this host, or kill them all
        once it is no longer active."""
        jobid, attempt = job.get("jobid"), job.get("attempt") or 0
        if not isinstance(jobid, int) or not isinstance(attempt, int):
            return
        if job.get("state") not in ACTIVE:
            self.gone(jobid)
            return
        self._older_attempts(jobid, attempt)
        t = job.get("tasks") or {}
        records, commands = t.get("list") or (), t.get("commands") or ()
        seen = self._seen.setdefault((jobid, attempt), set())
        for rec in records:
            if not isinstance(rec, dict) or rec.get("host") != self.hname:
                continue
            n = rec.get("task")
            if not isinstance(n, int) or n in seen:
                continue
            if rec.get("state") == "PEND":
                seen.add(n)
                launch = rec.get("launch")
                command = commands[launch] if isinstance(launch, int) and \
                    0 <= launch < len(commands) else None
                self._start(job, command, n)
            elif rec.get("state") == "RUN":  # started here before a restart, not re-adopted
                seen.add(n)
                self._report(jobid, attempt, n, "task_fail", reason=f"the worker on {self.hname} "
                             "restarted and does not run the task (its record was lost)")

    def gone(self, jobid: int) -> None:
        """The job ended (or is no longer allocated here): kill its tasks here."""
        with self._lock:
            doomed = [rt for k, rt in self.running.items() if k[0] == jobid]
            for key in [k for k in self._seen if k[0] == jobid]:
                del self._seen[key]
        for rt in doomed:
            logger.info("worker {}: job {} ended: killing its task {} (pid {})", self.hname,
                        jobid, rt.task, rt.pid)
            rt.cause = rt.cause or "killed"
            self.pm._kill(rt)

    def stop_or_resume(self, jobid: int, stop: bool) -> None:
        """The job was stopped or resumed: so are its tasks here (freezer or SIGSTOP/CONT)."""
        with self._lock:
            tasks = [rt for k, rt in self.running.items() if k[0] == jobid]
        for rt in tasks:
            if rt.stopped != stop and not rt.killing:
                self.pm._stop_or_resume(rt, stop)
                logger.info("worker {}: {} task {} of job {}", self.hname,
                            "stopped" if stop else "resumed", rt.task, jobid)

    def keep_only(self, listed: set[tuple[Any, Any]]) -> None:
        """The controller's sync: kill the tasks of jobs it no longer lists here."""
        with self._lock:
            jobs = {(k[0], k[1]) for k in self.running}
        for jobid, attempt in jobs:
            if (jobid, attempt) not in listed:
                self.gone(jobid)

    def _older_attempts(self, jobid: int, attempt: int) -> None:
        with self._lock:
            old = [k for k in self.running if k[0] == jobid and k[1] != attempt]
        if old:
            self.gone(jobid)

    # ------------------------------------------------------------------ starting
    def _start(self, job: dict[str, Any], command: Any, n: int) -> None:
        jobid, attempt = int(job["jobid"]), int(job.get("attempt") or 0)
        try:
            if not isinstance(command, str) or not command.strip():
                raise JobError("the task has no command")
            spec = dataclasses.replace(JobSpec.from_record(job, self.hname), command=command)
            rt = self._spawn(spec, n)
        except JobError as exc:
            self._report(jobid, attempt, n, "task_fail", reason=str(exc))
            return
        except Exception as exc:
            logger.opt(exception=True).error("worker {}: starting task {} of job {} failed "
                                             "unexpectedly", self.hname, n, jobid)
            self._report(jobid, attempt, n, "task_fail",
                         reason=f"cannot start on {self.hname}: {type(exc).__name__}: {exc}")
            return
        logger.info("worker {}: started task {} of job {} as pid {} (group {}): {:.120}",
                    self.hname, n, jobid, rt.pid, rt.group.name, command)

    def _spawn(self, spec: JobSpec, n: int) -> RunningTask:
        pm = self.pm
        if not os.path.isdir(spec.cwd):
            raise JobError(f"working directory {spec.cwd!r} does not exist on {self.hname}")
        paths = output_paths(spec, pm.jobs_dir)
        owner = pm._owner(spec)
        key = f"{spec.key}.t{n}"
        status = pm.jobs_dir / f"{key}.status"
        env = job_env(spec, owner, {"XCE_TASKID": str(n), "XCE_TASK_HOST": self.hname})
        try:
            group = pm.containment.create(key, Limits(spec.mem_limit, ()))
        except (ContainmentError, OSError) as exc:
            raise JobError(f"cannot contain the task on {self.hname}: {exc}") from None
        try:
            popen = pm._popen(spec, env, paths, status, owner, group, ())
        except BaseException:
            group.destroy()
            raise
        rt = RunningTask(spec.jobid, spec.attempt, popen.pid, status, group, popen, task=n)
        with self._lock:
            self.running[(spec.jobid, spec.attempt, n)] = rt
        self._write_info(rt)
        self._report(spec.jobid, spec.attempt, n, "task_start", pid=popen.pid)
        threading.Thread(target=self._wait, args=(rt,), daemon=True,
                         name=f"xce-task-{spec.jobid}.{n}").start()
        return rt

    # ------------------------------------------------------------------ ending
    def _wait(self, rt: RunningTask) -> None:
        assert rt.popen is not None
        _, wstatus, rusage = os.wait4(rt.pid, 0)
        ended = time.time()
        rt.popen.returncode = os.waitstatus_to_exitcode(wstatus)
        self._ended(rt, shell_status(rt.popen.returncode), rusage, ended)

    def _watch_adopted(self, rt: RunningTask) -> None:
        wait_gone(rt.pid, rt.done)
        self._ended(rt, read_status(rt.status_file), None, time.time())

    def _ended(self, rt: RunningTask, code: int | None, rusage: Any, ended: float) -> None:
        """The task's wrapper ended (``code``: its shell-style status, None if unknown):
        end its group, forget it, report how it ended."""
        usage, _ = end_group(rt.group, rusage, self.hname, f"task {rt.task} of job {rt.jobid}")
        self.pm.timers.cancel(f"kill:{rt.key}")
        self._info_path(rt.key).unlink(missing_ok=True)
        with self._lock:
            self.running.pop((rt.jobid, rt.attempt, rt.task), None)
        rt.done.set()
        Path(rt.status_file).unlink(missing_ok=True)
        if code is None and rt.cause is None:
            self._report(rt.jobid, rt.attempt, rt.task, "task_fail", time_=ended,
                         reason=f"the worker on {self.hname} restarted while the task ran; its "
                         "exit status is unknown", usage=usage.report())
            return
        if code == NO_FILES_STATUS and rt.cause is None:
            self._report(rt.jobid, rt.attempt, rt.task, "task_fail", time_=ended,
                         reason=f"the job's files cannot be opened by its user on {self.hname}")
            return
        code = code if code is not None else 128 + signal.SIGKILL
        logger.info("worker {}: task {} of job {} finished with exit status {}{}", self.hname,
                    rt.task, rt.jobid, code, " (killed)" if rt.cause else "")
        self._report(rt.jobid, rt.attempt, rt.task, "task_finish", time_=ended,
                     exit_status=code, usage=usage.report())

    # ------------------------------------------------------------------ usage
    def sample(self) -> None:
        """Post each running task's usage (``update_jusage`` with its ``task``, newest kept
        per task): the controller adds the job's tasks to its live figure, as the final one
        counts every task. On the jobs monitor's thread, after the jobs' own samples."""
        post = self.pm.post
        if post is None:
            return
        with self._lock:
            tasks = list(self.running.values())
        for rt in tasks:
            try:
                usage = rt.group.usage()
            except OSError:
                continue  # ending right now: its final figures come with its end report
            if not rt.done.is_set():
                post(f"jusage:{rt.key}", "update_jusage",
                     {"jobid": rt.jobid, "task": rt.task, "usage": usage.report()})

    # ------------------------------------------------------------------ restart
    def _info_path(self, key: str) -> Path:
        return self.pm.jobs_dir / f"{key}.json"

    def _write_info(self, rt: RunningTask) -> None:
        """What re-adoption needs (``<jobid>.<attempt>.t<task>.json``; not fsynced, as for a
        job: a machine crash ends the task anyway, a worker crash leaves it in the page
        cache). A task whose file cannot be written runs on, but a restart ends it."""
        info = {"jobid": rt.jobid, "attempt": rt.attempt, "task": rt.task, "pid": rt.pid,
                "ct": create_time(rt.pid), "status": str(rt.status_file)}
        try:
            self._info_path(rt.key).write_bytes(orjson.dumps(info))
        except OSError as exc:
            logger.warning("worker {}: task {} of job {}: cannot record it for re-adoption "
                           "({}); a worker restart ends it", self.hname, rt.task, rt.jobid, exc)

    def adopt(self) -> set[str]:
        """After a restart, before any push: re-adopt the tasks a previous run of this worker
        started that still run (watched, killed and reported as if started by this run),
        report those that ended meanwhile; the keys of the groups to keep."""
        kept: set[str] = set()
        for path in sorted(self.pm.jobs_dir.glob("*.t*.json")):
            try:
                info = orjson.loads(path.read_bytes())
                problem = _bad_record(info)
                if problem:
                    raise ValueError(problem)
                jobid, attempt, n, pid = (info[k] for k in ("jobid", "attempt", "task", "pid"))
            except (OSError, orjson.JSONDecodeError, ValueError) as exc:
                logger.error("worker {}: task record {} is unreadable ({}); removed, its task "
                             "not re-adopted (what runs in its group ends with the stale "
                             "groups); going on with the other records", self.hname, path, exc)
                path.unlink(missing_ok=True)
                continue
            key = f"{jobid}.{attempt}.t{n}"
            group = self.pm.containment.adopt(key, pid) or EndedGroup(key)
            status = Path(info.get("status") or self.pm.jobs_dir / f"{key}.status")
            rt = RunningTask(jobid, attempt, pid, status, group, task=n)
            with self._lock:
                self._seen.setdefault((jobid, attempt), set()).add(n)
            if same_process(pid, info.get("ct")):
                with self._lock:
                    self.running[(jobid, attempt, n)] = rt
                kept.add(key)
                logger.info("worker {}: re-adopted task {} of job {} (pid {}, group {}) after a "
                            "restart", self.hname, n, jobid, pid, group.name)
                threading.Thread(target=self._watch_adopted, args=(rt,), daemon=True,
                                 name=f"xce-task-{jobid}.{n}").start()
            else:
                logger.info("worker {}: task {} of job {} ended while the worker was down",
                            self.hname, n, jobid)
                self._ended(rt, read_status(status), None, time.time())
        return kept

    def _report(self, jobid: int, attempt: int, n: int, event: str,
                time_: float | None = None, **more: Any) -> None:
        if event == "task_fail":
            logger.warning("worker {}: task {} of job {} failed: {}", self.hname, n, jobid,
                           more.get("reason"))
        self.pm.journal.notify({"jobid": jobid, "attempt": attempt, "event": event, "task": n,
                                "time": round(time_ if time_ is not None else time.time(), 6),
                                **more})

    def shutdown(self, keep: bool, timeout: float) -> None:
        """On worker stop: kill the tasks (unless ``keep``: left running, for the next start
        to re-adopt) and wait."""
        with self._lock:
            tasks = list(self.running.values())
        if keep or not tasks:
            return
        for rt in tasks:
            rt.cause = rt.cause or "killed"
            self.pm._kill(rt)
        deadline = time.monotonic() + timeout
        for rt in tasks:
            rt.done.wait(max(0.0, deadline - time.monotonic()))


def _bad_record(info: Any) -> str:
    """What is wrong with a task record read back at a restart ("" if nothing): ``jobid``,
    ``attempt``, ``task``, ``pid`` integers, ``ct`` (the process start time) a number or
    null, ``status`` a path or null."""
    if not isinstance(info, dict):
        return f"not a JSON object but {type(info).__name__}"
    for k in ("jobid", "attempt", "task", "pid"):
        if k not in info:
            return f"no {k!r}"
        if not is_int(info[k]):
            return f"{k!r} is {info[k]!r}, not an integer"
    ct = info.get("ct")
    if ct is not None and (isinstance(ct, bool) or not isinstance(ct, int | float)):
        return f"'ct' (the process start time) is {ct!r}, not a number"
    status = info.get("status")
    if status is not None and not isinstance(status, str):
        return f"'status' is {status!r}, not a path"
    return ""
