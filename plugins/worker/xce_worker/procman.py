"""The process manager: dispatched jobs as real child processes, and their signals.

Each job attempt runs as ``/bin/sh -c <command>`` under a tiny wrapper shell, in a new session
(``start_new_session=True``), so the wrapper's pid is also the job's process group: kill, stop
and resume go to ``killpg`` and reach every process of the job. The wrapper writes the
command's exit status to ``<state_dir>/jobs/<jobid>.<attempt>.status`` before it exits, so a
worker that restarts while a job runs still learns how the job ended.

- working directory: the job's ``cwd`` (default: the worker's home directory);
- environment: the worker's environment, then the job's ``env``, then ``XCE_JOBID``,
  ``XCE_ATTEMPT``, ``XCE_HOSTS``, ``XCE_NTASKS``, ``XCE_QUEUE``, ``XCE_USER``;
- output: stdout/stderr are appended to the files the job's env names in ``XCE_STDOUT`` /
  ``XCE_STDERR`` (relative to the cwd; ``%J`` is the job id, ``%A`` the attempt), by default
  ``<state_dir>/jobs/<jobid>.out`` and ``.err``; stdin is ``/dev/null``;
- reports (spooled in the journal, delivered in order): ``start`` with the pid, ``finish``
  with a shell-style exit status (128+N for a job killed by signal N), ``fail`` with a reason
  when the job cannot start or its command is not found/executable (exit status 127/126).
  *Anything* that goes wrong between the claim of an attempt and its process running (a
  bad record, a NUL byte in its command, cwd or environment, a missing or inaccessible cwd,
  an unwritable output file, an unknown user, a failed ``exec``, even an unexpected error
  here) ends the attempt with ``fail`` and the reason, so the controller marks it EXIT and
  frees its slots: no job stays RUN without a process;
- kill: SIGTERM (and SIGCONT, so a stopped job can act on it), SIGKILL after ``kill_grace``
  seconds; stop: SIGSTOP; resume: SIGCONT; checkpoint: not supported (logged).

Jobs run as the worker's own user. A job allocated to several hosts runs on the first one
(like LSF, which starts the job on the first host and lists all of them in ``LSB_HOSTS``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from loguru import logger

from xce_worker.spool import Journal

# The wrapper: $1 is the command, $2 the status file. Trapping TERM/INT/HUP (with a handler,
# not "ignore", so the command does not inherit an ignored signal) keeps the wrapper alive
# long enough to record how the command ended. The status is written in place with a shell
# builtin (no temp file + /bin/mv: that fork+exec was half the wrapper's cost): the file is
# only read once the wrapper is gone, and a wrapper killed mid-write leaves an empty or
# missing file, both read as "exit status unknown", as before.
WRAPPER = 'trap : TERM INT HUP; /bin/sh -c "$1"; s=$?; printf "%s\\n" "$s" > "$2"; exit "$s"'
SIGNALS = {"kill": signal.SIGTERM, "stop": signal.SIGSTOP, "resume": signal.SIGCONT}
PostFn = Callable[[str, str, dict[str, Any]], None]


class JobError(Exception):
    """A job that cannot be started; the message is the reason reported to the controller."""


def shell_status(returncode: int) -> int:
    """A Popen return code as a shell would say it: 128+N for death by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


@dataclass
class RunningJob:
    """A job attempt this worker runs (or re-adopted after a restart)."""

    jobid: int
    attempt: int
    pid: int
    status_file: Path
    popen: subprocess.Popen[bytes] | None = None  # None when adopted after a restart
    done: threading.Event = field(default_factory=threading.Event)
    killing: bool = False
    stopped: bool = False


@dataclass(frozen=True)
class JobSpec:
    """What starting one job attempt needs, checked from a job record."""

    jobid: int
    attempt: int
    command: str
    cwd: str
    env: dict[str, str]
    hosts: list[str]
    ntasks: int
    queue: str
    user: str

    @classmethod
    def from_record(cls, job: Mapping[str, Any]) -> JobSpec:
        """Check a job record; :class:`JobError` names the first bad field."""
        command = job.get("command")
        if not isinstance(command, str) or not command.strip():
            raise JobError("bad dispatch: the job has no command")
        if "\0" in command:
            raise JobError("bad dispatch: the command holds a NUL byte")
        env = job.get("env") or {}
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise JobError("bad dispatch: env must map strings to strings")
        for k, v in env.items():
            if not k or "=" in k or "\0" in k:
                raise JobError(f"bad dispatch: env name {k[:64]!r} is not a variable name")
            if "\0" in v:
                raise JobError(f"bad dispatch: env {k[:64]} holds a NUL byte")
        cwd = job.get("cwd") or ""
        if not isinstance(cwd, str):
            raise JobError("bad dispatch: cwd must be a string")
        if "\0" in cwd:
            raise JobError("bad dispatch: cwd holds a NUL byte")
        alloc = job.get("alloc") or []
        return cls(
            jobid=int(job["jobid"]), attempt=int(job.get("attempt") or 0), command=command,
            cwd=os.path.expanduser(cwd or "~"), env=dict(env),
            hosts=[str(a.get("host")) for a in alloc if isinstance(a, dict)],
            ntasks=int(job.get("ntasks") or 1), queue=str(job.get("queue") or ""),
            user=str(job.get("user") or ""),
        )


class ProcessManager:
    """Starts, watches, signals and reports this host's jobs."""

    def __init__(self, hname: str, journal: Journal, state_dir: Path, *, kill_grace: float,
                 post: PostFn | None = None, run_as_user: bool = False) -> None:
        self.hname = hname
        self.run_as_user = run_as_user
        self.journal = journal
        self.jobs_dir = state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.kill_grace = kill_grace
        self.post = post
        self._lock = threading.Lock()
        self.running: dict[int, RunningJob] = {}

    # ------------------------------------------------------------------ starting
    def start(self, job: Mapping[str, Any]) -> bool:
        """Start a dispatched job unless its attempt was ever claimed here; True if started.

        Never raises for a bad job: once its attempt is claimed, any failure to start it is
        reported as ``fail`` with the reason, and logged.
        """
        jobid, attempt = job.get("jobid"), job.get("attempt") or 0
        if not _is_int(jobid) or not _is_int(attempt):
            logger.error("worker {}: dispatch without a valid job id and attempt ignored: "
                         "{:.200}", self.hname, repr(job))
            return False
        if not self.journal.claim(jobid, attempt):
            logger.debug("worker {}: job {} attempt {} already started here; not again",
                         self.hname, jobid, attempt)
            return False
        try:
            spec = JobSpec.from_record(job)
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
        logger.info("worker {}: started job {} (attempt {}) as pid {} in {}: {:.120}",
                    self.hname, jobid, attempt, rj.pid, spec.cwd, spec.command)
        if job.get("state") == "USUSP" or job.get("signal") == "stop":
            self.signal(jobid, attempt, "stop")  # stopped before it started: start it stopped
        return True

    def _paths(self, spec: JobSpec) -> tuple[Path, Path]:
        def named(var: str, default: str) -> Path:
            text = spec.env.get(var) or default
            text = text.replace("%J", str(spec.jobid)).replace("%A", str(spec.attempt))
            return Path(spec.cwd, os.path.expanduser(text))
        return (named("XCE_STDOUT", str(self.jobs_dir / f"{spec.jobid}.out")),
                named("XCE_STDERR", str(self.jobs_dir / f"{spec.jobid}.err")))

    def _owner(self, spec: JobSpec) -> Any:
        """The passwd entry to run the job as (``run_as_user``), or None for the worker's own.

        Like LSF's sbatchd, a worker running as root starts each job as its submitting user;
        a user unknown here, or a worker that cannot switch users, fails the job with the
        reason rather than running it as someone else.
        """
        if not self.run_as_user:
            return None
        import pwd

        try:
            owner = pwd.getpwnam(spec.user)
        except KeyError:
            raise JobError(f"user {spec.user!r} is not known on {self.hname}") from None
        if owner.pw_uid == os.geteuid():
            return None
        if os.geteuid() != 0:
            raise JobError(f"cannot run as {spec.user!r}: the worker on {self.hname} is not root "
                           "(set worker.run_as_user = false to run jobs as the worker's user)")
        return owner

    def _spawn(self, spec: JobSpec) -> RunningJob:
        if not os.path.isdir(spec.cwd):
            raise JobError(f"working directory {spec.cwd!r} does not exist on {self.hname}")
        owner = self._owner(spec)
        try:
            popen, status = self._popen(spec, owner)
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            filename = getattr(exc, "filename", None)
            raise JobError(f"cannot start on {self.hname}: "
                           f"{getattr(exc, 'strerror', None) or exc}"
                           f"{f' ({filename})' if filename else ''}") from None
        try:
            return self._watch(spec, popen, status)
        except Exception as exc:
            # It runs but cannot be recorded or watched: its end would never be reported.
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            raise JobError(f"cannot watch the job on {self.hname} ({type(exc).__name__}: "
                           f"{exc}); killed it") from None

    def _popen(self, spec: JobSpec, owner: Any) -> tuple[subprocess.Popen[bytes], Path]:
        """Start the job's wrapper: its process and the file its exit status goes to."""
        out_path, err_path = self._paths(spec)
        status = self.jobs_dir / f"{spec.jobid}.{spec.attempt}.status"
        if owner is not None:
            # The wrapper, running as the user, writes its status where that user may write.
            rundir = self.jobs_dir / f"{spec.jobid}.{spec.attempt}.d"
            rundir.mkdir(exist_ok=True)
            os.chown(rundir, owner.pw_uid, owner.pw_gid)
            status = rundir / "status"
        status.unlink(missing_ok=True)
        env = {**os.environ, **spec.env, "XCE_JOBID": str(spec.jobid),
               "XCE_ATTEMPT": str(spec.attempt), "XCE_HOSTS": " ".join(spec.hosts),
               "XCE_NTASKS": str(spec.ntasks), "XCE_QUEUE": spec.queue, "XCE_USER": spec.user}
        identity: dict[str, Any] = {}
        if owner is not None:
            env.update(HOME=owner.pw_dir, USER=owner.pw_name, LOGNAME=owner.pw_name)
            identity = {"user": owner.pw_uid, "group": owner.pw_gid,
                        "extra_groups": os.getgrouplist(owner.pw_name, owner.pw_gid)}
        with open(out_path, "ab") as out, open(err_path, "ab") as err:
            if owner is not None:
                os.fchown(out.fileno(), owner.pw_uid, owner.pw_gid)
                os.fchown(err.fileno(), owner.pw_uid, owner.pw_gid)
            popen = subprocess.Popen(
                ["/bin/sh", "-c", WRAPPER, f"xce-job-{spec.jobid}", spec.command,
                 str(status)],
                cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True, **identity)
        return popen, status

    def _watch(self, spec: JobSpec, popen: subprocess.Popen[bytes], status: Path) -> RunningJob:
        """Record a started job (journal) and watch it (a thread reports its end)."""
        rj = RunningJob(spec.jobid, spec.attempt, popen.pid, status, popen)
        with self._lock:
            self.running[spec.jobid] = rj
        try:
            # The run record and the start report: one journal write, one fsync.
            self.journal.record_run(spec.jobid, spec.attempt, popen.pid, _create_time(popen.pid),
                                    str(status), note={"jobid": spec.jobid, "event": "start",
                                                       "pid": popen.pid, "attempt": spec.attempt})
            threading.Thread(target=self._wait_child, args=(rj,), daemon=True,
                             name=f"xce-job-{spec.jobid}").start()
        except BaseException:
            with self._lock:
                if self.running.get(spec.jobid) is rj:
                    del self.running[spec.jobid]
            raise
        return rj

    # ------------------------------------------------------------------ ending
    def _wait_child(self, rj: RunningJob) -> None:
        assert rj.popen is not None
        self._finished(rj, shell_status(rj.popen.wait()))

    def _finished(self, rj: RunningJob, status: int | None) -> None:
        with self._lock:
            if self.running.get(rj.jobid) is rj:
                del self.running[rj.jobid]
        rj.done.set()
        if status is None:
            self._report_fail(rj.jobid, rj.attempt, "the worker restarted while the job ran; "
                              "its exit status is unknown")
        elif status in (126, 127):
            what = "not found" if status == 127 else "not executable"
            self._report_fail(rj.jobid, rj.attempt,
                              f"command {what} (exit status {status})", status)
        else:
            logger.info("worker {}: job {} (attempt {}) finished with exit status {}",
                        self.hname, rj.jobid, rj.attempt, status)
            self.journal.notify({"jobid": rj.jobid, "event": "finish", "exit_status": status,
                                 "attempt": rj.attempt})

    def _report_fail(self, jobid: int, attempt: int, reason: str,
                     status: int | None = None) -> None:
        logger.warning("worker {}: job {} (attempt {}) failed: {}", self.hname, jobid, attempt,
                       reason)
        args: dict[str, Any] = {"jobid": jobid, "event": "fail", "reason": reason,
                                "attempt": attempt}
        if status is not None:
            args["exit_status"] = status
        self.journal.notify(args)

    # ------------------------------------------------------------------ signals
    def signal(self, jobid: int, attempt: int | None, name: str) -> None:
        """Apply ``kill``/``stop``/``resume``/``checkpoint`` to a job's process group.

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
        sig = SIGNALS.get(name)
        if sig is None:
            logger.error("worker {}: unknown signal {!r} for job {}; ignored", self.hname, name,
                         jobid)
            return
        if name == "kill":
            self._kill(rj)
            return
        if (name == "stop" and rj.stopped) or (name == "resume" and not rj.stopped):
            return  # a repeated signal (e.g. re-sent in a state push): nothing to do
        rj.stopped = name == "stop"
        self._killpg(rj, sig)
        logger.info("worker {}: {} job {} (process group {})", self.hname,
                    "stopped" if name == "stop" else "resumed", jobid, rj.pid)

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

    def _killpg(self, rj: RunningJob, sig: int) -> None:
        try:
            os.killpg(rj.pid, sig)
        except ProcessLookupError:
            logger.info("worker {}: job {} has no processes left to signal", self.hname,
                        rj.jobid)
        except PermissionError as exc:
            logger.error("worker {}: cannot signal job {}: {}", self.hname, rj.jobid, exc)

    def _kill(self, rj: RunningJob) -> None:
        if rj.killing:
            return
        rj.killing = True
        logger.info("worker {}: killing job {} (process group {}): SIGTERM, SIGKILL after "
                    "{:g} s", self.hname, rj.jobid, rj.pid, self.kill_grace)
        _await_command(rj)
        self._killpg(rj, signal.SIGTERM)
        self._killpg(rj, signal.SIGCONT)

        def escalate() -> None:
            if not rj.done.wait(self.kill_grace):
                logger.warning("worker {}: job {} outlived SIGTERM by {:g} s; SIGKILL",
                               self.hname, rj.jobid, self.kill_grace)
                self._killpg(rj, signal.SIGKILL)

        threading.Thread(target=escalate, daemon=True, name=f"xce-kill-{rj.jobid}").start()

    # ------------------------------------------------------------------ restart
    def adopt(self) -> None:
        """After a restart: watch the journal's jobs that still run, report those that are
        gone (with the status their wrapper recorded, if any)."""
        for entry in self.journal.active():
            status_file = Path(entry.status_file or self.jobs_dir / "none")
            if entry.pid is not None and _same_process(entry.pid, entry.create_time):
                rj = RunningJob(entry.jobid, entry.attempt, entry.pid, status_file)
                with self._lock:
                    self.running[entry.jobid] = rj
                logger.info("worker {}: re-adopted job {} (attempt {}, pid {}) after a restart",
                            self.hname, entry.jobid, entry.attempt, entry.pid)
                threading.Thread(target=self._watch_adopted, args=(rj,), daemon=True,
                                 name=f"xce-job-{entry.jobid}").start()
            else:
                rj = RunningJob(entry.jobid, entry.attempt, entry.pid or 0, status_file)
                logger.info("worker {}: job {} (attempt {}) ended while the worker was down",
                            self.hname, entry.jobid, entry.attempt)
                self._finished(rj, _read_status(status_file))

    def _watch_adopted(self, rj: RunningJob) -> None:
        import psutil

        try:
            proc = psutil.Process(rj.pid)
            while not rj.done.is_set():
                try:
                    proc.wait(timeout=0.5)
                    break
                except psutil.TimeoutExpired:
                    continue
        except psutil.Error:
            pass
        self._finished(rj, _read_status(rj.status_file))

    # ------------------------------------------------------------------ usage
    def sample_usage(self) -> None:
        """Post each running job's resource usage (``update_jusage``, newest value kept)."""
        if self.post is None:
            return
        with self._lock:
            jobs = list(self.running.values())
        for rj in jobs:
            usage = job_usage(rj.pid)
            if usage is not None:
                self.post(f"jusage:{rj.jobid}", "update_jusage",
                          {"jobid": rj.jobid, "usage": usage})

    def usage_loop(self, interval: float, stop: threading.Event) -> None:
        """The process manager's update loop (a monitor thread)."""
        while not stop.wait(interval):
            try:
                self.sample_usage()
            except Exception:
                logger.opt(exception=True).error("worker {}: job usage sample failed",
                                                 self.hname)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, keep_jobs: bool, timeout: float | None = None) -> None:
        """On worker stop: leave jobs running (logged) or kill them and wait for their end."""
        with self._lock:
            jobs = list(self.running.values())
        if not jobs:
            return
        names = ", ".join(f"{rj.jobid} (pid {rj.pid})" for rj in jobs)
        if keep_jobs:
            logger.info("worker {}: leaving {} running job(s) running: {}; a restarted worker "
                        "re-adopts them", self.hname, len(jobs), names)
            return
        logger.info("worker {}: killing {} running job(s) before stopping: {}", self.hname,
                    len(jobs), names)
        for rj in jobs:
            self._kill(rj)
        deadline = time.monotonic() + (timeout if timeout is not None else self.kill_grace + 5)
        for rj in jobs:
            rj.done.wait(max(0.0, deadline - time.monotonic()))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def swapped_bytes(pid: int) -> int:
    """How much of process ``pid`` is swapped out (``VmSwap`` in ``/proc/<pid>/status``);
    0 where the kernel does not say (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmSwap:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def job_usage(pid: int) -> dict[str, Any] | None:
    """Resource usage of the process tree under ``pid`` (None if it is gone).

    ``mem`` is the resident size, ``swap`` what is swapped out, ``vmem`` the virtual size
    (MB each): the virtual size is address space, not swap, and is reported on its own.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    mem = swap = vmem = utime = stime = 0.0
    nthreads, pids = 0, []
    for p in procs:
        try:
            with p.oneshot():
                m, t = p.memory_info(), p.cpu_times()
                mem += m.rss
                vmem += m.vms
                swap += swapped_bytes(p.pid)
                utime += t.user + t.children_user
                stime += t.system + t.children_system
                nthreads += p.num_threads()
                pids.append(p.pid)
        except psutil.Error:
            continue
    mb = 1024 * 1024
    return {"mem": round(mem / mb, 3), "swap": round(swap / mb, 3), "vmem": round(vmem / mb, 3),
            "utime": round(utime, 3),
            "stime": round(stime, 3), "nthreads": nthreads, "pids": pids}


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


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _same_process(pid: int, create_time: float | None) -> bool:
    """True if ``pid`` still names the process the journal recorded (not a reused pid)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.5
    except psutil.Error:
        return False


def _read_status(path: Path) -> int | None:
    """The exit status the job's wrapper recorded, or None if it recorded none."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
