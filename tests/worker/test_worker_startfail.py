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
from xce_worker.procman import ProcessManager
from xce_worker.spool import Journal

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, wait_for
from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(90)


def needs_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} needs root (a worker that switches users); CI runs as root")


@pytest.fixture
def pm(tmp_path: Path) -> Iterator[ProcessManager]:
    state = tmp_path / "state"
    mgr = ProcessManager("h1", Journal(state / "journal.jsonl"), state, kill_grace=0.5,
                         run_as_user=True)
    yield mgr
    for rj in list(mgr.running.values()):
        os.killpg(rj.pid, 9)


def job(jobid: int, command: str = "true", **kw: Any) -> dict[str, Any]:
    return {"jobid": jobid, "attempt": 0, "command": command, "state": "RUN", "user": "root",
            "alloc": [{"host": "h1", "ntasks": 1}], "cwd": "", "env": {}, **kw}


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
    ({"user": "no-such-user-xce"}, "user 'no-such-user-xce' is not known on h1"),
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


# -- end to end ------------------------------------------------------------------------------


EDGE_MAY_REFUSE = {"NUL command", "NUL cwd", "NUL env", "bad env name", "exec error"}


def host_used(c: SyncClient, hname: str) -> int:
    hosts = c.call("hostinfo", {})["hosts"]
    return int(next(h["used_slots"] for h in hosts if h["name"] == hname))


def test_jobs_that_cannot_start_exit_with_their_reasons_and_free_their_slots(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    needs_root("a worker that runs jobs as their users")
    cl = xce_cluster(1)
    cl.start_role("worker", 'worker.hname="n1"', f'worker.state_dir="{tmp_path / "w1"}"',
                  "worker.slots=2", "worker.run_as_user=true",
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
    }
    _, cfg = load(cl.config_path)
    with SyncClient.open(client_config(cfg, "admin@test"), role="admin") as c:
        wait_for(lambda: any(h["name"] == "n1" and h["available"] for h in c.call("hostinfo", {})["hosts"]),
                 30, what="host n1")
        ids: dict[str, int] = {}
        refused: dict[str, str] = {}
        for name, (args, _) in cases.items():
            try:
                ids[name] = c.call("jobsubmit", {"user": "root", "ntasks": 2, **args})["jobid"]
            except RemoteError as exc:  # the validation edge may refuse these before they land
                refused[name] = exc.code
        assert set(refused) <= EDGE_MAY_REFUSE and set(refused.values()) <= {"INVALID"}, refused
        for jobid in ids.values():  # one at a time, on a host with two slots: each frees them
            c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": "n1", "ntasks": 2}], "force": True})
            wait_for(lambda j=jobid: c.call("jobinfo", {"jobids": [j]})["jobs"][0]["state"] == "EXIT",
                     20, what=f"job {jobid} EXIT")
            assert host_used(c, "n1") == 0
        for name, jobid in ids.items():
            found = c.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
            assert found["state"] == "EXIT" and cases[name][1] in found["reason"], (name, found)
        good = c.call("jobsubmit", {"command": "exit 0", "user": "root", "ntasks": 2})["jobid"]
        c.call("jobdispatch", {"jobid": good, "alloc": [{"host": "n1", "ntasks": 2}], "force": True})
        wait_for(lambda: c.call("jobinfo", {"jobids": [good]})["jobs"][0]["state"] == "DONE", 20,
                 what="a sound job DONE after them")
        assert host_used(c, "n1") == 0
    assert "handling push" not in cl.procs[-1].text()  # each one handled, none escaped
