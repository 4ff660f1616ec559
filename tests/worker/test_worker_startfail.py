"""A job that cannot start ends with a reason: whatever fails between the claim of an attempt
and its process running, the attempt is reported ``fail`` with why, and no job stays RUN
without a process. The process manager with real processes, then a real cluster (controller
and worker processes) where such jobs EXIT with their reasons and give their slots back."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jobkit import ended, group_dirs, manager, need_root
from xce_worker.containment.binding import DevicePool
from xce_worker.procman import ProcessManager
from xce_worker.spool import Journal

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, wait_for
from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(90)
CONTAINED = ["cgroup1", "cgroup2", "fallback"]


def needs_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} needs root (a worker that switches users); CI runs as root")


@pytest.fixture
def pm(tmp_path: Path) -> Iterator[ProcessManager]:
    state = tmp_path / "state"
    mgr = ProcessManager("h1", Journal(state / "journal.jsonl"), state, kill_grace=0.5,
                         run_as_user=True, allow_root_jobs=True)
    yield mgr
    for rj in list(mgr.running.values()):
        os.killpg(rj.pid, 9)


def job(jobid: int, command: str = "true", **kw: Any) -> dict[str, Any]:
    return {"jobid": jobid, "attempt": 0, "command": command, "state": "RUN", "user": "root",
            "uid": 0, "alloc": [{"host": "h1", "ntasks": 1}], "cwd": "", "env": {}, **kw}


def report(pm: ProcessManager, jobid: int) -> dict[str, Any]:
    """The one report of ``jobid``, which must be its end."""
    notes = [n.args for n in pm.journal.pending() if n.args["jobid"] == jobid]
    assert len(notes) == 1, notes
    return notes[0]


@pytest.mark.parametrize(("record", "reason"), [
    ({"command": "echo a\0b"}, "the command holds a NUL byte"),
    ({"cwd": "/tmp\0x"}, "cwd holds a NUL byte"),
    ({"env": {"A": "x\0y"}}, "env A holds a NUL byte"),
    ({"env": {"A\0": "x"}}, "is not a variable name"),
    ({"env": {"A=B": "x"}}, "is not a variable name"),
    ({"env": {"": "x"}}, "is not a variable name"),
    ({"env": {"XCE_STDOUT": "out\0put"}}, "holds a NUL byte"),
    ({"cwd": "/nonexistent/xce"}, "does not exist on h1"),
    ({"user": "no-such-user-xce", "uid": None}, "user 'no-such-user-xce' is not known on h1"),
    ({"uid": 2**31 - 7}, f"uid {2**31 - 7} (root) is not known on h1"),
    ({"uid": "0"}, "uid '0' is not a user id"),
    ({"ntasks": "many"}, "cannot start on h1: ValueError"),
])
def test_a_job_that_cannot_start_is_reported_with_its_reason(
        pm: ProcessManager, record: dict[str, Any], reason: str) -> None:
    needs_root("running jobs as their user")
    assert not pm.start(job(1, **{"command": "true", **record}))
    r = report(pm, 1)
    assert r["event"] == "fail" and reason in r["reason"], r
    assert not pm.running
    assert not pm.start(job(1))  # the attempt is claimed and ended: never started later


def test_an_exec_error_is_a_failure_with_its_reason(pm: ProcessManager, tmp_path: Path) -> None:
    needs_root("running jobs as their user")
    # One argument longer than the kernel takes (MAX_ARG_STRLEN, 128 KiB): execve fails.
    assert not pm.start(job(2, "true #" + "x" * 200_000, cwd=str(tmp_path)))
    r = report(pm, 2)
    assert r["event"] == "fail" and "Argument list too long" in r["reason"], r
    assert not pm.running


def test_a_job_that_cannot_be_recorded_is_killed_and_reported(
        pm: ProcessManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started: list[int] = []
    real = psutil.Process

    def record_run(*args: Any, **kw: Any) -> None:
        started.append(args[2])  # the pid, running now
        assert real(args[2]).is_running()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pm.journal, "record_run", record_run)
    assert not pm.start(job(3, "sleep 60", cwd=str(tmp_path)))
    r = report(pm, 3)
    assert r["event"] == "fail" and "No space left on device" in r["reason"] and "killed it" in r["reason"]
    assert not pm.running
    with pytest.raises(psutil.NoSuchProcess):
        real(started[0]).status()  # killed and reaped: it does not run on unrecorded


# -- contained starts: the group, its limits, the gate ----------------------------------------


def job_processes(jobid: int) -> list[psutil.Process]:
    """This test process's children that are job ``jobid``'s wrapper (``xce-job-<id>``)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if f"xce-job-{jobid}" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def left_nothing(pm: ProcessManager, jobid: int) -> None:
    """Nothing of a job that failed to start is left: no process, group, cores or timers."""
    assert not pm.running and not job_processes(jobid)
    assert not group_dirs(pm.containment)
    assert not pm.cores.held() and not pm.gpus.held()
    assert not (pm.jobs_dir / f"{jobid}.0.json").exists()


@pytest.mark.parametrize("kind", CONTAINED)
def test_a_core_gone_offline_fails_the_start_and_frees_everything(tmp_path: Path, kind: str) -> None:
    """A core the worker would bind the job to went offline: the kernel refuses it (cgroup1:
    writing ``cpuset.cpus`` while making the group; cgroup2 here and the fallback: the CPU
    affinity of the gated wrapper). The job fails with the reason; the next one runs."""
    need_root()
    with manager(tmp_path, kind, sample=None) as pm:
        real = pm.cores
        pm.cores = DevicePool([4095])  # no such CPU on this machine
        assert not pm.start(job(1, "touch ran", cwd=str(tmp_path)))
        r = report(pm, 1)
        assert r["event"] == "fail" and r["exit_reason"] == "no_start", r
        assert r["reason"].startswith("cannot contain the job on h1: "), r
        # A cpuset refuses the CPU (ERANGE: cgroup1 here, cgroup2 where it has the cpuset
        # controller), else sched_setaffinity does (EINVAL: this machine's cgroup2, fallback).
        assert ("cpuset.cpus: Numerical result out of range" in r["reason"]
                or "Invalid argument" in r["reason"]), r
        if kind == "cgroup1":
            assert "cpuset.cpus" in r["reason"], r
        assert not (tmp_path / "ran").exists()  # the command never ran
        pm.cores = real
        left_nothing(pm, 1)
        assert pm.start(job(2, "touch ran", cwd=str(tmp_path)))
        assert ended(pm, 2)["event"] == "finish" and (tmp_path / "ran").exists()


@pytest.mark.parametrize("kind", CONTAINED)
def test_a_wrapper_killed_at_the_gate_fails_the_start(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gated wrapper is SIGKILLed (by an operator, the OOM killer) after it was put in its
    group and before the worker opens the gate: the gate's write gets EPIPE, the job fails
    with the reason, nothing of it ran."""
    need_root()
    with manager(tmp_path, kind, sample=None) as pm:
        create = pm.containment.create

        def create_then_kill(key: str, limits: Any) -> Any:
            group = create(key, limits)
            attach = group.attach

            def attach_and_die(pid: int) -> None:
                attach(pid)
                os.kill(pid, 9)
                wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
                         what="the wrapper dead")

            group.attach = attach_and_die  # type: ignore[method-assign]
            return group

        monkeypatch.setattr(pm.containment, "create", create_then_kill)
        assert not pm.start(job(3, "touch ran", cwd=str(tmp_path)))
        r = report(pm, 3)
        assert r["event"] == "fail" and "wrapper ended before it was let run" in r["reason"], r
        assert not (tmp_path / "ran").exists()
        left_nothing(pm, 3)


@pytest.mark.parametrize("kind", CONTAINED)
def test_a_defect_in_a_containment_fails_the_start(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A containment plugin whose ``attach`` raises something unexpected: the job fails with
    the error's name and words, the gated wrapper is reaped, its group removed."""
    need_root()
    with manager(tmp_path, kind, sample=None) as pm:
        create = pm.containment.create

        def create_broken(key: str, limits: Any) -> Any:
            group = create(key, limits)

            def attach(pid: int) -> None:
                raise RuntimeError("the plugin's own bug")

            group.attach = attach  # type: ignore[method-assign]
            return group

        monkeypatch.setattr(pm.containment, "create", create_broken)
        assert not pm.start(job(4, "touch ran", cwd=str(tmp_path)))
        r = report(pm, 4)
        assert r["event"] == "fail" and r["reason"] == (
            "cannot start on h1: RuntimeError: the plugin's own bug"), r
        assert not (tmp_path / "ran").exists()
        left_nothing(pm, 4)


@pytest.mark.parametrize("kind", CONTAINED)
def test_a_contained_job_that_cannot_be_recorded_is_killed_with_its_group(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job runs, in its group, but its re-adoption record cannot be written (a full
    disk): it is killed with everything it forked, its group removed, its cores freed."""
    need_root()
    with manager(tmp_path, kind, sample=None) as pm:
        def write_info(*args: Any, **kw: Any) -> None:
            wait_for(lambda: (tmp_path / "forked").exists(), 10, what="the job running")
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(pm, "_write_info", write_info)
        assert not pm.start(job(5, "sleep 300 & touch forked; wait", cwd=str(tmp_path)))
        r = report(pm, 5)
        assert r["event"] == "fail" and "No space left on device" in r["reason"], r
        assert "killed it" in r["reason"]
        wait_for(lambda: not any("sleep 300" in " ".join(p.cmdline())
                                 for p in psutil.Process().children(recursive=True)
                                 if p.status() != psutil.STATUS_ZOMBIE), 10,
                 what="the forked sleep killed too")
        left_nothing(pm, 5)


# -- end to end ------------------------------------------------------------------------------


EDGE_MAY_REFUSE = {"NUL command", "NUL cwd", "NUL env", "bad env name", "exec error"}
EDGE_REFUSES = {"bad output pattern", "zero memory limit"}


def host_used(c: SyncClient, hname: str) -> int:
    hosts = c.call("hostinfo", {})["hosts"]
    return int(next(h["used_slots"] for h in hosts if h["name"] == hname))


def test_jobs_that_cannot_start_exit_with_their_reasons_and_free_their_slots(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    needs_root("a worker that runs jobs as their users")
    import shutil
    import tempfile

    # A file only root may write, where nobody can reach it (pytest's temp tree is root's).
    top = Path(tempfile.mkdtemp(prefix="xce-startfail-", dir="/tmp"))
    try:
        top.chmod(0o755)
        secret = top / "root-only"
        secret.write_text("root's\n")
        secret.chmod(0o600)
        _cannot_start_end_to_end(xce_cluster, tmp_path, secret)
        assert secret.read_text() == "root's\n"  # the job's user could not append to it
    finally:
        shutil.rmtree(top)


def _cannot_start_end_to_end(xce_cluster: Callable[..., LocalCluster], tmp_path: Path,
                             secret: Path) -> None:
    cl = xce_cluster(1)
    cl.start_role("worker", 'worker.hname="n1"', f'worker.state_dir="{tmp_path / "w1"}"',
                  "worker.slots=2", "worker.run_as_user=true", "worker.allow_root_jobs=true",
                  "worker.monitor_interval=0.2", name="w1")
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "no cwd": ({"command": "true", "cwd": "/nonexistent/xce"}, "does not exist on n1"),
        "unknown user": ({"command": "true", "user": "no-such-user-xce"}, "is not known on n1"),
        "exec error": ({"command": "true #" + "x" * 200_000}, "Argument list too long"),
        "not found": ({"command": "no-such-command-xce"}, "command not found"),
        "NUL command": ({"command": "echo a\0b"}, "NUL byte"),
        "NUL cwd": ({"command": "true", "cwd": "/tmp\0x"}, "NUL byte"),
        "NUL env": ({"command": "true", "env": {"A": "x\0"}}, "NUL byte"),
        "bad env name": ({"command": "true", "env": {"A=B": "x"}}, "not a variable name"),
        "output not the user's": ({"command": "echo pwned", "user": "nobody", "cwd": "/tmp",
                                   "stdout": str(secret)}, "cannot be opened by its user"),
        "no input file": ({"command": "cat", "stdin": "/nonexistent/xce-in"},
                          "input file '/nonexistent/xce-in' does not exist"),
        "bad output pattern": ({"command": "true", "stdout": "out.%x"}, ""),
        "zero memory limit": ({"command": "true", "mem_limit": 0}, ""),
    }
    _, cfg = load(cl.config_path)
    # Root submits directly (its jobs may run as root here: allow_root_jobs); a job for a
    # user this host does not know comes through a front end, the only one that names users.
    with SyncClient.open(client_config(cfg, "cli@test"), role="cli") as c, \
            SyncClient.open(client_config(cfg, "apiserver@test"), role="apiserver") as front:
        wait_for(lambda: any(h["name"] == "n1" and h["available"] for h in c.call("hostinfo", {})["hosts"]),
                 30, what="host n1")
        ids: dict[str, int] = {}
        refused: dict[str, str] = {}
        for name, (args, _) in cases.items():
            try:
                via = front if "user" in args else c
                ids[name] = via.call("jobsubmit", {"ntasks": 2, **args})["jobid"]
            except RemoteError as exc:  # the validation edge may refuse these before they land
                refused[name] = exc.code
        assert EDGE_REFUSES <= set(refused) <= EDGE_MAY_REFUSE | EDGE_REFUSES, refused
        assert set(refused.values()) <= {"INVALID"}, refused
        for jobid in ids.values():  # one at a time, on a host with two slots: each frees them
            c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": "n1", "ntasks": 2}], "force": True})
            wait_for(lambda j=jobid: c.call("jobinfo", {"jobids": [j]})["jobs"][0]["state"] == "EXIT",
                     20, what=f"job {jobid} EXIT")
            assert host_used(c, "n1") == 0
        for name, jobid in ids.items():
            found = c.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
            assert found["state"] == "EXIT" and cases[name][1] in found["reason"], (name, found)
        good = c.call("jobsubmit", {"command": "exit 0", "ntasks": 2})["jobid"]
        c.call("jobdispatch", {"jobid": good, "alloc": [{"host": "n1", "ntasks": 2}], "force": True})
        wait_for(lambda: c.call("jobinfo", {"jobids": [good]})["jobs"][0]["state"] == "DONE", 20,
                 what="a sound job DONE after them")
        assert host_used(c, "n1") == 0
    assert "handling push" not in cl.procs[-1].text()  # each one handled, none escaped
