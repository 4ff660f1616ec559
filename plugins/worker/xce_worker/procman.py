"""The process manager: dispatched jobs as real child processes, contained, limited, reported.

Each job attempt runs as ``/bin/sh -c <command>`` under a tiny wrapper shell
(:data:`xce_worker.jobstart.WRAPPER`) in a new session. The wrapper waits on a pipe until the
worker has put it in the job's group (:mod:`xce_worker.containment`: a cgroup, or the
fallback's session), bound it to its cores and set its limits; only then does the command
run, so every process the job makes is in the group. The wrapper writes the command's exit
status to ``<state_dir>/jobs/<jobid>.<attempt>.status`` before it exits, so a worker that
restarts while a job runs still learns how it ended; ``<jobid>.<attempt>.json`` beside it
keeps the start time, run limit and devices for re-adoption.

- working directory: the job's ``cwd`` (default: the worker's home directory);
- environment, output, input: :mod:`xce_worker.jobstart` (a clean base, the submitter's
  variables, ``XCE_*``; ``stdout``/``stderr``/``stdin`` with ``%J``/``%I``/``%A``);
- limits: ``mem_limit`` (bytes) by the group (an OOM kill in it, or a sample over the limit
  where the kernel does not enforce it: reason ``mem_limit``); ``run_limit`` (seconds of
  running, time stopped not counted): SIGTERM, SIGKILL after ``kill_grace``, reason
  ``run_limit``; cores: as many distinct ones as the job has slots here; GPUs:
  ``rusage[ngpus=N]`` gets ``CUDA_VISIBLE_DEVICES`` with N distinct devices;
- reports (spooled in the journal, delivered in order), each with the worker's ``time`` of
  the event: ``start`` with the pid; ``alive`` for a running job the controller shows UNKWN
  (its host was lost to it; e.g. after a worker restart re-adopted the job); ``finish``
  with a shell-style exit status (128+N for death by signal N), an ``exit_reason``
  (:data:`xcecore.jobspec.EXIT_REASONS`) and the final ``usage``; ``fail`` with a reason
  when the job cannot start (bad cwd, unwritable output, no input file, cannot be
  contained) or its command is not found/executable (127/126);
- when the job's command ends, whatever it left behind in its group is killed (as Slurm
  does), the final usage is read, and the group is removed;
- kill: SIGTERM (and SIGCONT/thaw, so a stopped job can act on it) to every member,
  SIGKILL of the whole group after ``kill_grace``; stop/resume: the freezer where the
  containment has one, else SIGSTOP/SIGCONT to every member.

Jobs run as the worker's own user unless ``run_as_user``. A job allocated to several hosts
runs on the first one (like LSF, which starts the job on the first host and lists all of
them in ``LSB_HOSTS``); every job gets ``XCE_HOSTFILE`` (one line per slot), and a job of
several tasks ``XCE_TASK_SECRET``, with which it launches tasks on its hosts
(:mod:`xce_worker.tasks`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import orjson
from loguru import logger

from xce_worker.containment import (
    ContainConfig,
    Containment,
    ContainmentError,
    EndedGroup,
    JobGroup,
    Limits,
    Usage,
)
from xce_worker.containment.binding import DevicePool
from xce_worker.deadlines import Deadlines
from xce_worker.jobstart import (
    NO_FILES,
    NO_FILES_STATUS,
    WRAPPER,
    JobError,
    JobSpec,
    job_env,
    output_paths,
)
from xce_worker.spool import Journal
from xcecore.jobspec import ExitReason, describe_exit

PostFn = Callable[[str, str, dict[str, Any]], None]

__all__ = ["JobError", "ProcessManager", "RunningJob", "create_time", "end_group", "is_int",
           "read_status", "same_process", "shell_status", "wait_gone"]


def shell_status(returncode: int) -> int:
    """A Popen return code as a shell would say it: 128+N for death by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def end_group(group: JobGroup, rusage: Any, hname: str, what: str) -> tuple[Usage, bool]:
    """The end of a job's or task's group once its wrapper ended: kill what it left behind
    (as Slurm does), read the final usage (``rusage``: the wrapper's ``wait4`` figures, None
    for one re-adopted after a restart) and whether the kernel OOM-killed in it, and remove
    the group. ``what`` names its owner in the log ("job 7", "task 1 of job 7"). Never
    raises for the group's own errors: the usage is then not final, which is logged."""
    try:
        if group.pids():
            group.kill()
            group.wait_empty(5.0)
        usage = group.final_usage(rusage)
        oom = group.oom_killed()
        if not group.destroy():
            logger.warning("worker {}: {}'s group {} could not be removed (a process is "
                           "stuck); the next start cleans it", hname, what, group.name)
        return usage, oom
    except OSError as exc:
        logger.error("worker {}: {}'s group {}: {}; its usage is not final", hname, what,
                     group.name, exc)
        return group.final_usage(rusage), False


def wait_gone(pid: int, done: threading.Event) -> None:
    """Wait until process ``pid`` (not our child: re-adopted after a restart) has ended, or
    ``done`` is set; polled, as only the parent can wait for a process's end."""
    import psutil

    try:
        proc = psutil.Process(pid)
        while not done.is_set():
            try:
                proc.wait(timeout=0.5)
                return
            except psutil.TimeoutExpired:
                continue
    except psutil.Error:
        return


@dataclass
class RunningJob:
    """A job attempt this worker runs (or re-adopted after a restart)."""

    jobid: int
    attempt: int
    pid: int
    status_file: Path
    group: JobGroup
    popen: subprocess.Popen[bytes] | None = None  # None when adopted after a restart
    done: threading.Event = field(default_factory=threading.Event)
    killing: bool = False
    stopped: bool = False
    cause: ExitReason | None = None  # why the worker ended it, if it did
    mem_limit: int | None = None
    run_left: float | None = None  # seconds of run limit left (None: no limit)
    run_since: float = 0.0  # monotonic start of the current running stretch
    files: str = "files"  # its input and output paths, for a report that names them

    @property
    def key(self) -> str:
        """``<jobid>.<attempt>``."""
        return f"{self.jobid}.{self.attempt}"


class ProcessManager:
    """Starts, watches, signals and reports this host's jobs."""

    def __init__(self, hname: str, journal: Journal, state_dir: Path, *, kill_grace: float,
                 post: PostFn | None = None, run_as_user: bool = False,
                 containment: Containment | None = None, bind_cores: bool = True,
                 gpus: int = 0, allow_root_jobs: bool = False) -> None:
        self.hname = hname
        self.run_as_user = run_as_user
        self.allow_root_jobs = allow_root_jobs
        self.journal = journal
        self.jobs_dir = state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.kill_grace = kill_grace
        self.post = post
        if containment is None:
            from xce_worker.containment.fallback import Fallback

            containment = Fallback(ContainConfig(hname))
        self.containment = containment
        self.bind_cores = bind_cores
        self.cores = DevicePool(containment.cpus())
        self.gpus = DevicePool(range(gpus))
        self.timers = Deadlines(f"xce-timers-{hname}")
        self._lock = threading.Lock()
        self.running: dict[int, RunningJob] = {}

    # ------------------------------------------------------------------ starting
    def start(self, job: Mapping[str, Any]) -> bool:
        """Start a dispatched job unless its attempt was ever claimed here; True if started.

        Never raises for a bad job: once its attempt is claimed, any failure to start it
        (the record, its group, its limits, its files, the exec, recording it) is reported
        as ``fail`` with the reason, and logged.
        """
        jobid, attempt = job.get("jobid"), job.get("attempt") or 0
        if not is_int(jobid) or not is_int(attempt):
            logger.error("worker {}: dispatch without a valid job id and attempt ignored: "
                         "{:.200}", self.hname, repr(job))
            return False
        if not self.journal.claim(jobid, attempt):
            logger.debug("worker {}: job {} attempt {} already started here; not again",
                         self.hname, jobid, attempt)
            return False
        if job.get("start_time") is not None:
            # Started (the controller has its start report) but never claimed in this journal:
            # this host's worker ran it before its state directory was lost or replaced. Its
            # processes may still run; starting it again would run the job twice.
            self._report_fail(jobid, attempt, (
                f"lost on {self.hname}: it started there (pid {job.get('pid')}) but the worker "
                f"has no record of it (its state directory was lost or replaced); not started "
                "again"), exit_reason=None)
            return False
        try:
            spec = JobSpec.from_record(job, self.hname)
            rj = self._spawn(spec)
        except JobError as exc:
            self._report_fail(jobid, attempt, str(exc))
            return False
        except Exception as exc:  # a defect here must not leave the job RUN with no process
            logger.opt(exception=True).error("worker {}: starting job {} failed unexpectedly",
                                             self.hname, jobid)
            self._report_fail(jobid, attempt,
                              f"cannot start on {self.hname}: {type(exc).__name__}: {exc}")
            return False
        logger.info("worker {}: started job {} (attempt {}) as pid {} in {} (group {}{}{}): "
                    "{:.120}", self.hname, jobid, attempt, rj.pid, spec.cwd, rj.group.name,
                    f", mem limit {spec.mem_limit} B" if spec.mem_limit else "",
                    f", run limit {spec.run_limit} s" if spec.run_limit else "", spec.command)
        if job.get("state") == "USUSP" or job.get("signal") == "stop":
            self.signal(jobid, attempt, "stop")  # stopped before it started: start it stopped
        return True

    def _owner(self, spec: JobSpec) -> Any:
        """The passwd entry to run the job as (``run_as_user``), or None for the worker's own.

        Like LSF's sbatchd (and Slurm's slurmd, by uid), a worker running as root starts each
        job as its submitter: the uid the controller authenticated, or -- for a job a front
        end submitted for a user -- that user's name looked up here. Root is refused unless
        root submitted the job itself and ``allow_root_jobs`` is set. A user unknown here, or
        a worker that cannot switch users, fails the job with the reason rather than running
        it as someone else.
        """
        if not self.run_as_user:
            return None
        import pwd

        try:
            owner = pwd.getpwuid(spec.uid) if spec.uid is not None else pwd.getpwnam(spec.user)
        except KeyError:
            who = f"uid {spec.uid} ({spec.user})" if spec.uid is not None else f"user {spec.user!r}"
            raise JobError(f"{who} is not known on {self.hname}") from None
        if owner.pw_uid == 0:
            if spec.uid != 0:
                raise JobError(f"job of {spec.user!r} would run as root on {self.hname}: a job "
                               f"submitted {'via ' + spec.via if spec.via else 'by another uid'} "
                               "never runs as root")
            if not self.allow_root_jobs:
                raise JobError(f"root's job refused on {self.hname}: jobs run as root only with "
                               "[worker] allow_root_jobs = true")
        if owner.pw_uid == os.geteuid():
            return None
        if os.geteuid() != 0:
            raise JobError(f"cannot run as {owner.pw_name!r}: the worker on {self.hname} is not "
                           "root (set worker.run_as_user = false to run jobs as the worker's user)")
        return owner

    def _devices(self, spec: JobSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Bind the job to cores and GPUs (released by :meth:`_release`)."""
        ngpus = spec.gpus_wanted()
        if ngpus > len(self.gpus.items):
            raise JobError(f"the job asks for {ngpus} GPU(s); {self.hname} has "
                           f"{len(self.gpus.items)}")
        cpus = self.cores.take(spec.key, spec.slots) if self.bind_cores else ()
        gpus = self.gpus.take(spec.key, ngpus) if ngpus else ()
        return cpus, gpus

    def _release(self, key: str) -> None:
        (self.jobs_dir / f"{key}.hosts").unlink(missing_ok=True)  # its host file
        self.cores.give(key)
        self.gpus.give(key)
        self.timers.cancel(f"run:{key}")
        self.timers.cancel(f"kill:{key}")

    def _spawn(self, spec: JobSpec) -> RunningJob:
        """Start ``spec`` contained; every failure is a :class:`JobError` (or an unexpected
        exception) that leaves nothing behind: no process, no group, no cores or GPUs held."""
        if not os.path.isdir(spec.cwd):
            raise JobError(f"working directory {spec.cwd!r} does not exist on {self.hname}")
        paths = output_paths(spec, self.jobs_dir)
        owner = self._owner(spec)
        status = self.jobs_dir / f"{spec.key}.status"  # the wrapper's stdout: opened here
        cpus, gpus = self._devices(spec)
        try:
            extra = {"XCE_CPUS": ",".join(map(str, cpus))} if cpus else {}
            if gpus:
                extra.update(CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)),
                             CUDA_DEVICE_ORDER="PCI_BUS_ID", XCE_GPUS=",".join(map(str, gpus)))
            task_key = self._parallel(spec, owner, extra)
            env = job_env(spec, owner, extra)
            group = self._group(spec, cpus)
            try:
                popen = self._popen(spec, env, paths, status, owner, group, cpus)
            except BaseException:
                group.destroy()
                raise
        except BaseException:
            self._release(spec.key)
            raise
        try:
            return self._watch(spec, popen, status, group, paths, (cpus, gpus), task_key)
        except Exception as exc:
            # It runs but cannot be recorded or watched: its end would never be reported.
            self._abandon(spec.key, popen, group)
            raise JobError(f"cannot watch the job on {self.hname} ({type(exc).__name__}: "
                           f"{exc}); killed it") from None

    def _parallel(self, spec: JobSpec, owner: Any, extra: dict[str, str]) -> str | None:
        """The job's host file (``XCE_HOSTFILE``: one line per slot, as MPI launchers read
        it) and, for a job of several tasks, its task secret (``XCE_TASK_SECRET``, which
        ``xce task launch`` presents); the secret's SHA-256, for the start report."""
        path = self.jobs_dir / f"{spec.key}.hosts"
        lines = "".join(f"{h}\n" * n for h, n in spec.slots_by_host) or f"{self.hname}\n"
        path.write_text(lines)
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid)
        extra["XCE_HOSTFILE"] = str(path)
        if spec.ntasks <= 1 and len(spec.hosts) <= 1:
            return None
        secret = secrets.token_hex(32)
        extra["XCE_TASK_SECRET"] = secret
        return hashlib.sha256(secret.encode()).hexdigest()

    def _group(self, spec: JobSpec, cpus: tuple[int, ...]) -> JobGroup:
        """The job's new, empty group with its limits."""
        try:
            return self.containment.create(spec.key, Limits(spec.mem_limit, cpus))
        except (ContainmentError, OSError) as exc:
            raise JobError(f"cannot contain the job on {self.hname}: {exc}") from None

    def _watch(self, spec: JobSpec, popen: subprocess.Popen[bytes], status: Path,
               group: JobGroup, paths: tuple[Path, Path, Path | None],
               devices: tuple[tuple[int, ...], tuple[int, ...]],
               task_key: str | None = None) -> RunningJob:
        """Record a started job (journal, re-adoption info) and watch it (its run limit, a
        thread that reports its end)."""
        started = time.time()
        rj = RunningJob(spec.jobid, spec.attempt, popen.pid, status, group, popen,
                        mem_limit=spec.mem_limit, files=_files(*paths),
                        run_left=float(spec.run_limit) if spec.run_limit else None,
                        run_since=time.monotonic())
        with self._lock:
            self.running[spec.jobid] = rj
        try:
            self._write_info(rj, started, *devices)
            # The run record and the start report: one journal write, one fsync.
            self.journal.record_run(spec.jobid, spec.attempt, popen.pid,
                                    create_time(popen.pid), str(status),
                                    note={"jobid": spec.jobid, "event": "start",
                                          "pid": popen.pid, "attempt": spec.attempt,
                                          "time": round(started, 6),
                                          **({"task_key": task_key} if task_key else {})})
            self._arm_run_limit(rj)
            threading.Thread(target=self._wait_child, args=(rj,), daemon=True,
                             name=f"xce-job-{spec.jobid}").start()
        except BaseException:
            with self._lock:
                if self.running.get(spec.jobid) is rj:
                    del self.running[spec.jobid]
            raise
        return rj

    def _abandon(self, key: str, popen: subprocess.Popen[bytes], group: JobGroup) -> None:
        """Kill a started job that cannot be watched, everything it made, and its group."""
        with contextlib.suppress(OSError):
            group.kill()
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        with contextlib.suppress(OSError):
            group.wait_empty(5.0)
            group.destroy()
        self._release(key)
        self._info_path(key).unlink(missing_ok=True)

    def _popen(self, spec: JobSpec, env: dict[str, str], paths: tuple[Path, Path, Path | None],
               status: Path, owner: Any, group: JobGroup,
               cpus: tuple[int, ...]) -> subprocess.Popen[bytes]:
        """Start the wrapper gated, contain it, then open the gate."""
        out_path, err_path, in_path = paths
        identity: dict[str, Any] = {}
        if owner is not None:
            identity = {"user": owner.pw_uid, "group": owner.pw_gid,
                        "extra_groups": os.getgrouplist(owner.pw_name, owner.pw_gid)}
        if in_path is not None and not in_path.is_file():
            raise JobError(f"cannot start on {self.hname}: input file {str(in_path)!r} does "
                           "not exist")
        if owner is not None:  # the default files are in the worker's spool: give them over
            for path in {out_path, err_path}:
                if path.parent == self.jobs_dir:
                    path.touch()
                    os.chown(path, owner.pw_uid, owner.pw_gid)
        gate_r, gate_w = os.pipe()
        try:
            try:
                with open(status, "wb") as status_fh:  # truncated: empty means "unknown"
                    popen = subprocess.Popen(
                        ["/bin/sh", "-c", WRAPPER, f"xce-job-{spec.jobid}", spec.command,
                         str(in_path) if in_path is not None else os.devnull,
                         str(out_path), str(err_path)],
                        cwd=spec.cwd, env=env, stdin=gate_r, stdout=status_fh,
                        stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                        **identity)
            finally:
                os.close(gate_r)
        except BaseException as exc:
            os.close(gate_w)
            if isinstance(exc, OSError | ValueError | TypeError | subprocess.SubprocessError):
                raise JobError(self._cannot_start(exc)) from None
            raise
        return self._contain(popen, gate_w, group, cpus)

    def _contain(self, popen: subprocess.Popen[bytes], gate_w: int, group: JobGroup,
                 cpus: tuple[int, ...]) -> subprocess.Popen[bytes]:
        """Put the gated wrapper in its group, bound to its cores, then let it run."""
        try:
            try:
                group.attach(popen.pid)
                if cpus:
                    os.sched_setaffinity(popen.pid, cpus)
            except BaseException as exc:
                os.close(gate_w)  # the wrapper reads EOF and exits 125 without running anything
                gate_w = -1
                popen.wait()
                if isinstance(exc, ContainmentError | OSError):
                    raise JobError(f"cannot contain the job on {self.hname}: {exc}") from None
                raise
            try:
                os.write(gate_w, b"go\n")
            except OSError as exc:  # the wrapper is gone (EPIPE): nothing of the job ran
                popen.wait()
                raise JobError(f"cannot start on {self.hname}: the job's wrapper ended before "
                               f"it was let run ({exc.strerror or exc})") from None
        finally:
            if gate_w >= 0:
                os.close(gate_w)
        return popen

    def _cannot_start(self, exc: BaseException) -> str:
        """The reason for an exec (or Popen) error: its words and the file it names."""
        filename = getattr(exc, "filename", None)
        return (f"cannot start on {self.hname}: {getattr(exc, 'strerror', None) or exc}"
                f"{f' ({filename})' if filename else ''}")

    def _info_path(self, key: str) -> Path:
        return self.jobs_dir / f"{key}.json"

    def _write_info(self, rj: RunningJob, started: float, cpus: tuple[int, ...],
                    gpus: tuple[int, ...]) -> None:
        """What re-adoption needs besides the journal (not fsynced: a machine crash ends the
        job anyway; a worker crash leaves it in the page cache)."""
        info = {"started": started, "run_limit": rj.run_left, "mem_limit": rj.mem_limit,
                "cpus": list(cpus), "gpus": list(gpus)}
        self._info_path(rj.key).write_bytes(orjson.dumps(info))

    def _read_info(self, key: str) -> dict[str, Any]:
        try:
            info = orjson.loads(self._info_path(key).read_bytes())
            return info if isinstance(info, dict) else {}
        except (OSError, orjson.JSONDecodeError):
            return {}

    # ------------------------------------------------------------------ limits
    def _arm_run_limit(self, rj: RunningJob) -> None:
        if rj.run_left is None:
            return
        rj.run_since = time.monotonic()
        self.timers.after(f"run:{rj.key}", max(0.0, rj.run_left),
                          lambda: self._limit_reached(rj, "run_limit"))

    def _pause_run_limit(self, rj: RunningJob) -> None:
        """Stopped time does not count against the run limit."""
        if rj.run_left is not None and self.timers.pending(f"run:{rj.key}"):
            self.timers.cancel(f"run:{rj.key}")
            rj.run_left -= time.monotonic() - rj.run_since

    def _limit_reached(self, rj: RunningJob, cause: ExitReason) -> None:
        if rj.done.is_set() or rj.killing:
            return
        rj.cause = cause
        logger.warning("worker {}: job {} (attempt {}): {}; ending it", self.hname, rj.jobid,
                       rj.attempt, describe_exit(cause))
        if cause == "mem_limit":
            rj.killing = True
            rj.group.kill()  # at once: memory beyond the limit hurts the host's other jobs
        else:
            self._kill(rj)

    # ------------------------------------------------------------------ ending
    def _wait_child(self, rj: RunningJob) -> None:
        assert rj.popen is not None
        try:
            _, wstatus, rusage = os.wait4(rj.pid, 0)
        except ChildProcessError:  # reaped by another waiter in this process: ask its file
            rj.popen.returncode = 0
            self._finished(rj, read_status(rj.status_file), None, time.time())
            return
        ended = time.time()
        rj.popen.returncode = os.waitstatus_to_exitcode(wstatus)
        self._finished(rj, shell_status(rj.popen.returncode), rusage, ended)

    def _finished(self, rj: RunningJob, status: int | None, rusage: Any, ended: float) -> None:
        usage, oom = end_group(rj.group, rusage, self.hname, f"job {rj.jobid}")
        self._release(rj.key)
        self._info_path(rj.key).unlink(missing_ok=True)
        with self._lock:
            if self.running.get(rj.jobid) is rj:
                del self.running[rj.jobid]
        rj.done.set()
        cause = rj.cause or ("mem_limit" if oom else None)
        base = {"jobid": rj.jobid, "attempt": rj.attempt, "time": round(ended, 6),
                "usage": usage.report()}
        if status is None and cause is None:
            self._report_fail(rj.jobid, rj.attempt, "the worker restarted while the job ran; "
                              "its exit status is unknown", time_=ended)
        elif cause is None and status == NO_FILES_STATUS and _no_files(rj.status_file):
            self._report_fail(rj.jobid, rj.attempt, f"cannot start on {self.hname}: the job's "
                              f"{rj.files} cannot be opened by its user", status, time_=ended)
        elif cause is None and status in (126, 127):
            what = "not found" if status == 127 else "not executable"
            self._report_fail(rj.jobid, rj.attempt,
                              f"command {what} (exit status {status})", status, time_=ended)
        else:
            code = status if status is not None else 128 + signal.SIGKILL
            reason: ExitReason = cause or ("done" if code == 0 else
                                           "signal" if code > 128 else "exit_code")
            logger.info("worker {}: job {} (attempt {}) finished with exit status {} ({}; cpu "
                        "{:.2f} s, peak mem {:.1f} MB)", self.hname, rj.jobid, rj.attempt, code,
                        describe_exit(reason, code), usage.utime + usage.stime,
                        usage.max_mem / 2**20)
            self.journal.notify({**base, "event": "finish", "exit_status": code,
                                 "exit_reason": reason})

    def _report_fail(self, jobid: int, attempt: int, reason: str, status: int | None = None,
                     time_: float | None = None, *, exit_reason: str | None = "no_start") -> None:
        """Spool a ``fail`` report: ``exit_reason`` ``no_start`` (it could not start: the
        controller says so), None for a job that did start once (its reason as given)."""
        logger.warning("worker {}: job {} (attempt {}) failed: {}", self.hname, jobid, attempt,
                       reason)
        args: dict[str, Any] = {"jobid": jobid, "event": "fail", "reason": reason,
                                "attempt": attempt,
                                "time": round(time_ if time_ is not None else time.time(), 6)}
        if exit_reason is not None:
            args["exit_reason"] = exit_reason
        if status is not None:
            args["exit_status"] = status
        self.journal.notify(args)

    def report_alive(self, jobid: int, attempt: int) -> bool:
        """The controller shows a job of ours UNKWN (this host was lost to it): if it runs
        here, report ``alive`` (spooled after its start report); True if reported."""
        with self._lock:
            rj = self.running.get(jobid)
        if rj is None or rj.attempt != attempt or rj.done.is_set():
            return False
        logger.info("worker {}: job {} (attempt {}) is UNKWN at the controller and runs here "
                    "(pid {}); reporting it alive", self.hname, jobid, attempt, rj.pid)
        self.journal.notify({"jobid": jobid, "attempt": attempt, "event": "alive",
                             "time": round(time.time(), 6)})
        return True

    # ------------------------------------------------------------------ signals
    def signal(self, jobid: int, attempt: int | None, name: str) -> None:
        """Apply ``kill``/``stop``/``resume``/``checkpoint`` to a job's group.

        A signal for a job this worker does not run is logged and, for a kill of a job that
        never started here, reported as ``fail`` so the job does not stay RUN forever.
        """
        with self._lock:
            rj = self.running.get(jobid)
        if rj is None or (attempt is not None and rj.attempt != attempt):
            self._signal_not_running(jobid, attempt, name)
            return
        if name == "checkpoint":
            logger.warning("worker {}: checkpoint of job {} is not supported; ignored",
                           self.hname, jobid)
            return
        if name == "kill":
            rj.cause = rj.cause or "killed"
            self._kill(rj)
            return
        if name not in ("stop", "resume"):
            logger.error("worker {}: unknown signal {!r} for job {}; ignored", self.hname, name,
                         jobid)
            return
        if (name == "stop" and rj.stopped) or (name == "resume" and not rj.stopped):
            return  # a repeated signal (e.g. re-sent in a state push): nothing to do
        self._stop_or_resume(rj, name == "stop")
        logger.info("worker {}: {} job {} ({})", self.hname,
                    "stopped" if name == "stop" else "resumed", jobid,
                    "freezer" if rj.group.freezer else "SIGSTOP/SIGCONT")

    def _stop_or_resume(self, rj: RunningJob, stop: bool) -> None:
        rj.stopped = stop
        try:
            if stop:
                self._pause_run_limit(rj)
                rj.group.freeze() if rj.group.freezer else rj.group.signal(signal.SIGSTOP)
            else:
                rj.group.thaw() if rj.group.freezer else rj.group.signal(signal.SIGCONT)
                self._arm_run_limit(rj)
        except OSError as exc:
            logger.error("worker {}: cannot {} job {}: {}", self.hname,
                         "stop" if stop else "resume", rj.jobid, exc)

    def _signal_not_running(self, jobid: int, attempt: int | None, name: str) -> None:
        entry = self.journal.known(jobid, attempt or 0) if attempt is not None else None
        if entry is not None and entry.ended:
            logger.info("worker {}: {} for job {} (attempt {}): it already ended; its "
                        "end report tells the controller", self.hname, name, jobid, attempt)
        elif name == "kill" and attempt is not None and entry is None:
            # Claim it so a late dispatch of this attempt never starts it.
            if self.journal.claim(jobid, attempt):
                self._report_fail(jobid, attempt, f"killed before it started on {self.hname}")
        else:
            logger.warning("worker {}: {} for job {} (attempt {}), which does not run here; "
                           "ignored", self.hname, name, jobid, attempt)

    def _kill(self, rj: RunningJob) -> None:
        if rj.killing:
            return
        rj.killing = True
        logger.info("worker {}: killing job {} (group {}): SIGTERM, SIGKILL after {:g} s",
                    self.hname, rj.jobid, rj.group.name, self.kill_grace)
        try:
            if rj.stopped:
                self._stop_or_resume(rj, stop=False)
            _await_command(rj)
            rj.group.signal(signal.SIGTERM)
            rj.group.signal(signal.SIGCONT)
        except OSError as exc:
            logger.error("worker {}: cannot signal job {}: {}", self.hname, rj.jobid, exc)

        def escalate() -> None:
            if not rj.done.is_set():
                logger.warning("worker {}: job {} outlived SIGTERM by {:g} s; SIGKILL of its "
                               "group", self.hname, rj.jobid, self.kill_grace)
                rj.group.kill()

        self.timers.after(f"kill:{rj.key}", self.kill_grace, escalate)

    # ------------------------------------------------------------------ restart
    def adopt(self, keep: Iterable[str] = ()) -> None:
        """After a restart: watch the journal's jobs that still run, report those that are
        gone (with the status their wrapper recorded, if any), then remove every group of
        this worker that no running job owns and that is not in ``keep`` (the groups of the
        re-adopted tasks, :meth:`xce_worker.tasks.TaskRunner.adopt`)."""
        for entry in self.journal.active():
            key = f"{entry.jobid}.{entry.attempt}"
            status_file = Path(entry.status_file or self.jobs_dir / "none")
            info = self._read_info(key)
            group = self.containment.adopt(key, entry.pid) or EndedGroup(key)
            alive = entry.pid is not None and same_process(entry.pid, entry.create_time)
            rj = RunningJob(entry.jobid, entry.attempt, entry.pid or 0, status_file, group,
                            mem_limit=info.get("mem_limit"))
            if alive:
                limit = info.get("run_limit")
                if isinstance(limit, int | float):
                    rj.run_left = float(limit) - (time.time() - float(info.get("started", 0)))
                self.cores.hold(key, info.get("cpus") or ())
                self.gpus.hold(key, info.get("gpus") or ())
                with self._lock:
                    self.running[entry.jobid] = rj
                logger.info("worker {}: re-adopted job {} (attempt {}, pid {}, group {}) after "
                            "a restart", self.hname, entry.jobid, entry.attempt, entry.pid,
                            group.name)
                self._arm_run_limit(rj)
                threading.Thread(target=self._watch_adopted, args=(rj,), daemon=True,
                                 name=f"xce-job-{entry.jobid}").start()
            else:
                logger.info("worker {}: job {} (attempt {}) ended while the worker was down",
                            self.hname, entry.jobid, entry.attempt)
                self._finished(rj, read_status(status_file), None, time.time())
        with self._lock:
            kept = {rj.key for rj in self.running.values()} | set(keep)
        removed = self.containment.cleanup_stale(kept)
        if removed:
            logger.info("worker {}: removed {} stale job group(s) of a previous run: {}",
                        self.hname, len(removed), ", ".join(removed))

    def _watch_adopted(self, rj: RunningJob) -> None:
        wait_gone(rj.pid, rj.done)
        self._finished(rj, read_status(rj.status_file), None, time.time())

    # ------------------------------------------------------------------ usage
    def sample_jobs(self) -> None:
        """Post each running job's usage (``update_jusage``, newest kept) and enforce the
        memory limits the kernel does not (a sample over the limit, or an OOM kill that left
        part of the job running, ends the job with reason ``mem_limit``)."""
        with self._lock:
            jobs = list(self.running.values())
        for rj in jobs:
            try:
                usage = rj.group.usage()
                oom = rj.group.oom_killed()
            except OSError:
                continue  # ending right now: the final figures come with its end report
            if rj.mem_limit is not None and not rj.killing and (
                    oom or (not rj.group.kernel_mem_limit and usage.mem > rj.mem_limit)):
                self._limit_reached(rj, "mem_limit")
            if self.post is not None and not rj.done.is_set():
                self.post(f"jusage:{rj.jobid}", "update_jusage",
                          {"jobid": rj.jobid, "usage": usage.report()})

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, keep_jobs: bool, timeout: float | None = None) -> None:
        """On worker stop: leave jobs running (logged) or kill them and wait for their end."""
        with self._lock:
            jobs = list(self.running.values())
        if not jobs:
            self.containment.close()
            return
        names = ", ".join(f"{rj.jobid} (pid {rj.pid})" for rj in jobs)
        if keep_jobs:
            logger.info("worker {}: leaving {} running job(s) running: {}; a restarted worker "
                        "re-adopts them", self.hname, len(jobs), names)
            return
        logger.info("worker {}: killing {} running job(s) before stopping: {}", self.hname,
                    len(jobs), names)
        for rj in jobs:
            rj.cause = rj.cause or "killed"
            self._kill(rj)
        deadline = time.monotonic() + (timeout if timeout is not None else self.kill_grace + 5)
        for rj in jobs:
            rj.done.wait(max(0.0, deadline - time.monotonic()))
        self.containment.close()


def is_int(value: Any) -> TypeGuard[int]:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _files(out: Path, err: Path, stdin: Path | None) -> str:
    names = [f"output file {str(out)!r}"]
    if err != out:
        names.append(f"error file {str(err)!r}")
    if stdin is not None:
        names.append(f"input file {str(stdin)!r}")
    return " or ".join(names)


def _no_files(status_file: Path) -> bool:
    """True if the wrapper said it could not open the job's files."""
    try:
        return status_file.read_text().strip() == NO_FILES
    except OSError:
        return False


def _await_command(rj: RunningJob, timeout: float = 1.0) -> None:
    """Wait (briefly) until the wrapper has forked the job's command.

    The wrapper traps SIGTERM to outlive its command; a SIGTERM that reached the group before
    the command existed would be absorbed by the wrapper alone and the command would only
    die at SIGKILL. A freshly started job is the only case, so this costs nothing usually.
    """
    import psutil

    def started(wrapper: psutil.Process, argv: list[str]) -> bool:
        # A forked child runs the wrapper's own code (same argv) until it execs the command.
        for child in wrapper.children():
            try:
                if child.cmdline() != argv:
                    return True
            except psutil.Error:
                continue
        return False

    deadline = time.monotonic() + timeout
    try:
        wrapper = psutil.Process(rj.pid)
        argv = wrapper.cmdline()
        while not rj.done.is_set() and not started(wrapper, argv):
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
    except psutil.Error:
        return


def create_time(pid: int) -> float | None:
    """The process start time of ``pid`` (psutil's), None if it is gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def same_process(pid: int, create_time: float | None) -> bool:
    """True if ``pid`` still names the process the journal recorded (not a reused pid)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.5
    except psutil.Error:
        return False


def read_status(path: Path) -> int | None:
    """The exit status the job's wrapper recorded, or None if it recorded none."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
