"""What starting one job attempt needs: its checked spec, environment, files and wrapper.

- :class:`JobSpec` — a job record from the controller, checked (a bad field is a
  :class:`JobError` naming it, reported as the job's ``fail`` reason);
- :func:`job_env` — a clean base (``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL`` of the
  user the job runs as), then the environment the submitter sent (all of it by default, as
  LSF does; ``--env`` chooses), then the ``XCE_*`` variables;
- :func:`output_paths` — ``stdout``/``stderr``/``stdin`` with ``%J``/``%I``/``%A``, relative to
  the job's cwd; stderr goes with stdout when only stdout is named (as ``bsub -o``);
- :data:`WRAPPER` — the shell that runs the command, gated until the worker has put it in
  the job's group, and records the command's exit status.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xcecore.jobspec import JobSpecError, expand_path

# The wrapper: $1 is the command, $2 the job's input (a file or /dev/null), $3 and $4 its
# output and error files; its stdout is the status file, opened by the worker (so the wrapper
# can write it whoever it runs as and wherever the worker's spool is). Its stdin starts as the
# gate: it waits for one line there (the worker writes it once the wrapper is in the job's
# group, bound to its cores, with its rlimits: nothing of the job runs outside of them). (The
# gate and the status are stdin and stdout, not descriptors of their own, because dash takes
# only descriptors 0-9 in redirections.) It keeps the status file as descriptor 3, which the
# command does not inherit. Then it opens the job's files itself, as the user the job runs
# as, so a job can read and write only what its user may (a root worker opening them would
# let a job append to any file); if it cannot, it writes NO_FILES as its status and exits 124
# without running the command. Trapping TERM/INT/HUP (with a handler, not "ignore", so the
# command does not inherit an ignored signal) keeps the wrapper alive long enough to record
# how the command ended. The status is one write of a builtin: a wrapper killed before it
# leaves an empty file, read as "exit status unknown".
NO_FILES = "no-files"
NO_FILES_STATUS = 124
WRAPPER = ('read _ || exit 125; exec 3>&1 >/dev/null; '
           '{ true <"$2" && true >>"$3" && true 2>>"$4"; } 2>/dev/null || '
           f'{{ echo {NO_FILES} >&3; exit {NO_FILES_STATUS}; }}; '
           'exec <"$2" >>"$3" 2>>"$4"; trap : TERM INT HUP; '
           '/bin/sh -c "$1" 3>&-; s=$?; printf "%s\\n" "$s" >&3; exit "$s"')
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class JobError(Exception):
    """A job that cannot be started; the message is the reason reported to the controller."""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _opt_int(job: Mapping[str, Any], name: str, low: int) -> int | None:
    value = job.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise JobError(f"bad dispatch: {name} must be an integer >= {low}, got {value!r}")
    return value


def _opt_str(job: Mapping[str, Any], name: str) -> str | None:
    value = job.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise JobError(f"bad dispatch: {name} must be a string")
    if "\0" in value:
        raise JobError(f"bad dispatch: {name} holds a NUL byte")
    return value


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
    slots: int  # tasks allocated on this host: the cores it is bound to
    queue: str
    user: str
    mem_limit: int | None = None
    run_limit: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    stdin: str | None = None
    resreq: str = ""
    uid: int | None = None  # the submitter's authenticated uid (None: a front end's user)
    via: str | None = None  # the front end it was submitted through, if any
    array_id: int | None = None  # the array it is an element of
    index: int = 0  # its index in that array (0 when it is not an element, as LSF's %I)
    slots_by_host: tuple[tuple[str, int], ...] = ()  # the allocation: (host, tasks there)

    @property
    def key(self) -> str:
        """``<jobid>.<attempt>``: the name of its group and its files."""
        return f"{self.jobid}.{self.attempt}"

    @classmethod
    def from_record(cls, job: Mapping[str, Any], hname: str = "") -> JobSpec:
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
        alloc = [a for a in job.get("alloc") or [] if isinstance(a, dict)]
        here = [a for a in alloc if a.get("host") == hname]
        slots = here[0].get("ntasks") if here else 1
        resreq = job.get("resreq") or ""
        uid = job.get("uid")
        if uid is not None and (not isinstance(uid, int) or isinstance(uid, bool) or uid < 0):
            raise JobError(f"bad dispatch: uid {str(uid)[:32]!r} is not a user id")
        via = job.get("via")
        array = job.get("array")
        of, index = (array.get("of"), array.get("index")) if isinstance(array, dict) else (None, 0)
        if of is not None and not (type(of) is int and type(index) is int and index >= 0):
            raise JobError("bad dispatch: array element without an int 'of' and 'index'")
        return cls(
            jobid=int(job["jobid"]), attempt=int(job.get("attempt") or 0), command=command,
            cwd=os.path.expanduser(cwd or "~"), env=dict(env),
            hosts=[str(a.get("host")) for a in alloc],
            ntasks=int(job.get("ntasks") or 1),
            slots=slots if isinstance(slots, int) and slots >= 1 else 1,
            queue=str(job.get("queue") or ""), user=str(job.get("user") or ""),
            mem_limit=_opt_int(job, "mem_limit", 1), run_limit=_opt_int(job, "run_limit", 1),
            stdout=_opt_str(job, "stdout"), stderr=_opt_str(job, "stderr"),
            stdin=_opt_str(job, "stdin"), resreq=resreq if isinstance(resreq, str) else "",
            uid=uid, via=via if isinstance(via, str) else None,
            array_id=of, index=index if of is not None and isinstance(index, int) else 0,
            slots_by_host=tuple((str(a.get("host")), _count(a.get("ntasks"))) for a in alloc),
        )

    def gpus_wanted(self) -> int:
        """``ngpus`` of the first rusage alternative that names it (0 if none does)."""
        if "ngpus" not in self.resreq:
            return 0
        from xcecore.resreq.parser import parse

        try:
            parsed = parse(self.resreq)
        except Exception:
            return 0  # the scheduler accepted it; a requirement we cannot read asks no GPUs
        for alternative in parsed.rusage or ():
            for group in alternative:
                for item in group.items:
                    if item.name == "ngpus":
                        return max(0, int(item.value))
        return 0


def base_env(owner: Any | None) -> dict[str, str]:
    """The clean environment every job starts from, for ``owner`` (a passwd entry; None:
    the worker's own user)."""
    if owner is None:
        import pwd

        try:
            owner = pwd.getpwuid(os.geteuid())
        except KeyError:
            return {"PATH": DEFAULT_PATH, "SHELL": "/bin/sh"}
    return {"PATH": DEFAULT_PATH, "HOME": owner.pw_dir, "USER": owner.pw_name,
            "LOGNAME": owner.pw_name, "SHELL": owner.pw_shell or "/bin/sh"}


def job_env(spec: JobSpec, owner: Any | None, extra: Mapping[str, str]) -> dict[str, str]:
    """Base, then the submitter's variables, then ``XCE_*`` (and ``extra``: devices)."""
    env = {**base_env(owner), **spec.env}
    if owner is not None:  # a job run as its user is that user, whatever the env claims
        env.update(HOME=owner.pw_dir, USER=owner.pw_name, LOGNAME=owner.pw_name)
    env.update({"XCE_JOBID": str(spec.jobid), "XCE_ATTEMPT": str(spec.attempt),
                "XCE_HOSTS": " ".join(spec.hosts), "XCE_NTASKS": str(spec.ntasks),
                "XCE_QUEUE": spec.queue, "XCE_USER": spec.user})
    if spec.array_id is not None:
        env.update(XCE_ARRAY_JOBID=str(spec.array_id), XCE_ARRAY_INDEX=str(spec.index))
    env.update(extra)
    return env


def output_paths(spec: JobSpec, jobs_dir: Path) -> tuple[Path, Path, Path | None]:
    """stdout, stderr and stdin (None: /dev/null) of the job, expanded and absolute."""
    def named(text: str) -> Path:
        try:
            # %J of an element is its array's id, as LSF names an array's files: out.%J.%I
            expanded = expand_path(text, spec.array_id or spec.jobid, spec.attempt, spec.index)
        except JobSpecError as exc:
            raise JobError(str(exc)) from None
        return Path(spec.cwd, os.path.expanduser(expanded))
    out = named(spec.stdout) if spec.stdout else jobs_dir / f"{spec.jobid}.out"
    default_err = out if spec.stdout else jobs_dir / f"{spec.jobid}.err"
    err = named(spec.stderr) if spec.stderr else default_err
    return out, err, named(spec.stdin) if spec.stdin else None
