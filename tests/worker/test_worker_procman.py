"""The process manager with real processes: exit codes, signals to the whole process group,
bad input (bad cwd, command not found, signals for ended or unknown jobs), usage, output
files, and re-adoption by a restarted worker."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import psutil
import pytest
from xce_worker.procman import ProcessManager, shell_status
from xce_worker.spool import Journal

from xcecore.testing import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pm(tmp_path: Path) -> Iterator[ProcessManager]:
    posts: list[tuple[str, str, dict[str, Any]]] = []
    mgr = ProcessManager("h1", Journal(tmp_path / "state" / "journal.jsonl"), tmp_path / "state",
                         kill_grace=0.5, post=lambda k, op, a: posts.append((k, op, a)))
    mgr.posts = posts  # type: ignore[attr-defined]
    yield mgr
    for rj in list(mgr.running.values()):  # kill whatever a failed test left, by group
        try:
            os.killpg(rj.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def job(jobid: int, command: str, **kw: Any) -> dict[str, Any]:
    return {"jobid": jobid, "attempt": 0, "command": command, "state": "RUN",
            "alloc": [{"host": "h1", "ntasks": 1}], "cwd": "", "env": {}, **kw}


def notes(pm: ProcessManager, jobid: int) -> list[dict[str, Any]]:
    return [n.args for n in pm.journal.pending() if n.args["jobid"] == jobid]


def ended(pm: ProcessManager, jobid: int, timeout: float = 10) -> dict[str, Any]:
    def end() -> dict[str, Any] | None:
        return next((a for a in notes(pm, jobid) if a["event"] in ("finish", "fail")), None)
    result: dict[str, Any] = wait_for(end, timeout, what=f"end of job {jobid}")
    return result


def test_shell_status() -> None:
    assert shell_status(0) == 0 and shell_status(3) == 3 and shell_status(-9) == 137


def test_exit_codes_and_reports_in_order(pm: ProcessManager) -> None:
    assert pm.start(job(1, "exit 0"))
    assert pm.start(job(2, "echo out; echo err >&2; exit 3"))
    report = ended(pm, 1)
    assert {k: report[k] for k in ("jobid", "event", "exit_status", "attempt", "exit_reason")} \
        == {"jobid": 1, "event": "finish", "exit_status": 0, "attempt": 0, "exit_reason": "done"}
    assert abs(report["time"] - time.time()) < 30 and "cputime" in report["usage"]
    assert ended(pm, 2)["exit_reason"] == "exit_code"
    assert ended(pm, 2)["exit_status"] == 3
    events = [a["event"] for a in notes(pm, 2)]
    assert events == ["start", "finish"]
    assert isinstance(notes(pm, 2)[0]["pid"], int)
    assert (pm.jobs_dir / "2.out").read_text() == "out\n"
    assert (pm.jobs_dir / "2.err").read_text() == "err\n"


def test_never_started_twice(pm: ProcessManager) -> None:
    assert pm.start(job(1, "exit 0"))
    ended(pm, 1)
    assert not pm.start(job(1, "exit 0"))
    assert pm.start(job(1, "exit 0", attempt=1))  # a requeued attempt is a new run


def test_cwd_env_and_named_output(pm: ProcessManager, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    pm.start(job(7, 'pwd; echo "$GREETING $XCE_JOBID $XCE_HOSTS"', cwd=str(work),
                 env={"GREETING": "hi"}, stdout="job-%J.%I.txt"))
    ended(pm, 7)
    assert (work / "job-7.0.txt").read_text() == f"{work}\nhi 7 h1\n"


def test_bad_cwd_is_a_clear_failure(pm: ProcessManager, tmp_path: Path) -> None:
    assert not pm.start(job(3, "true", cwd=str(tmp_path / "nope")))
    report = ended(pm, 3)
    assert report["event"] == "fail" and "does not exist" in report["reason"]
    assert not pm.running


def test_command_not_found_is_a_clear_failure(pm: ProcessManager) -> None:
    pm.start(job(4, "no-such-command-xyz --flag"))
    report = ended(pm, 4)
    assert report["event"] == "fail" and report["exit_status"] == 127
    assert "not found" in report["reason"]


def test_unwritable_output_cannot_start(pm: ProcessManager, tmp_path: Path) -> None:
    pm.start(job(5, "true", stdout=str(tmp_path / "no" / "dir" / "out")))
    report = ended(pm, 5)
    assert report["event"] == "fail" and "cannot start" in report["reason"]


def test_bad_dispatch_records(pm: ProcessManager) -> None:
    assert not pm.start({"jobid": "seven"})  # no valid id: logged only
    assert not pm.start(job(6, ""))
    assert "no command" in ended(pm, 6)["reason"]
    assert not pm.start(job(8, "true", env={"A": 1}))
    assert "env" in ended(pm, 8)["reason"]


def test_kill_reaches_the_whole_group(pm: ProcessManager) -> None:
    pm.start(job(10, "sleep 60 & sleep 60; wait"))
    rj = pm.running[10]
    members = wait_for(lambda: [p for p in psutil.Process(rj.pid).children(recursive=True)
                                if p.name() == "sleep"], 5, what="both sleeps")
    pm.signal(10, 0, "kill")
    assert ended(pm, 10)["exit_status"] == 128 + signal.SIGTERM
    for p in members:
        wait_for(lambda p=p: not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, 5,
                 what=f"pid {p.pid} gone")


def test_kill_escalates_to_sigkill(pm: ProcessManager) -> None:
    pm.start(job(11, "trap '' TERM; sleep 60"))
    time.sleep(0.3)  # let the shell install its trap
    pm.signal(11, 0, "kill")
    pm.signal(11, 0, "kill")  # a repeated kill does not restart the grace
    assert ended(pm, 11)["exit_status"] == 128 + signal.SIGKILL


def test_stop_and_resume(pm: ProcessManager) -> None:
    pm.start(job(12, "sleep 60"))
    rj = pm.running[12]
    sleeper = wait_for(lambda: [p for p in psutil.Process(rj.pid).children(recursive=True)
                                if p.name() == "sleep"], 5, what="sleep")[0]
    pm.signal(12, 0, "stop")
    wait_for(lambda: sleeper.status() == psutil.STATUS_STOPPED, 5, what="stopped")
    pm.signal(12, 0, "resume")
    wait_for(lambda: sleeper.status() != psutil.STATUS_STOPPED, 5, what="resumed")
    pm.signal(12, 0, "stop")
    wait_for(lambda: sleeper.status() == psutil.STATUS_STOPPED, 5, what="stopped again")
    pm.signal(12, 0, "kill")  # a stopped job is killed too (SIGCONT follows SIGTERM)
    assert ended(pm, 12)["exit_status"] == 128 + signal.SIGTERM


def test_signals_for_ended_or_unknown_jobs(pm: ProcessManager) -> None:
    pm.start(job(13, "exit 0"))
    ended(pm, 13)
    before = len(pm.journal.pending())
    pm.signal(13, 0, "kill")  # already ended: its finish is the report; nothing new
    pm.signal(13, 0, "stop")
    pm.signal(99, None, "resume")
    pm.signal(13, 0, "teleport")
    assert len(pm.journal.pending()) == before
    pm.signal(14, 0, "kill")  # never started here: reported, and never started later
    assert "killed before it started" in ended(pm, 14)["reason"]
    assert not pm.start(job(14, "exit 0"))


def test_usage_reported(pm: ProcessManager) -> None:
    pm.start(job(15, "sleep 60"))
    wait_for(lambda: len(psutil.Process(pm.running[15].pid).children()) > 0, 5, what="child")
    pm.sample_jobs()
    key, op, args = pm.posts[-1]  # type: ignore[attr-defined]
    assert (key, op) == ("jusage:15", "update_jusage")
    usage = args["usage"]
    assert usage["mem"] > 0 and usage["max_mem"] >= usage["mem"] and len(usage["pids"]) >= 2
    assert usage["nprocs"] == len(usage["pids"]) and usage["swap"] >= 0  # VmSwap, summed
    pm.signal(15, 0, "kill")
    ended(pm, 15)


def test_restarted_manager_readopts_and_reports(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = ProcessManager("h1", Journal(state / "journal.jsonl"), state, kill_grace=0.5)
    first.start(job(20, "sleep 0.8; exit 4"))
    first.start(job(21, "exit 5"))
    first.start(job(22, "sleep 60"))
    ended(first, 21)
    pid22 = first.running[22].pid
    try:
        # A "restart": a new manager on the same journal. The old one's waiter threads live
        # on in this process (a real restart has none): they report into a dead end.
        journal, first.journal = first.journal, Mock()
        journal.close()
        second = ProcessManager("h1", Journal(state / "journal.jsonl"), state, kill_grace=0.5)
        second.adopt()
        assert set(second.running) == {20, 22}
        assert ended(second, 20)["exit_status"] == 4  # from the wrapper's status file
        second.signal(22, 0, "kill")
        assert ended(second, 22)["exit_status"] == 128 + signal.SIGTERM
        finishes = [a for a in (n.args for n in second.journal.pending())
                    if a["jobid"] == 21 and a["event"] == "finish"]
        assert len(finishes) == 1  # the spooled report survives, once
    finally:
        try:
            os.killpg(pid22, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_shutdown_kills_when_configured(pm: ProcessManager) -> None:
    pm.start(job(30, "sleep 60"))
    pm.shutdown(keep_jobs=True)
    assert 30 in pm.running
    pm.shutdown(keep_jobs=False)
    assert not pm.running
    assert ended(pm, 30)["exit_status"] == 128 + signal.SIGTERM


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root worker")
def test_run_as_the_submitting_user() -> None:
    import pwd
    import shutil
    import tempfile

    nobody = pwd.getpwnam("nobody")
    # The job opens its files as its user, so they must be where that user can reach (pytest's
    # own temp tree is root's alone).
    top = Path(tempfile.mkdtemp(prefix="xce-run-as-", dir="/tmp"))
    top.chmod(0o755)
    try:
        _run_as_nobody(top, nobody)
    finally:
        shutil.rmtree(top)


def _run_as_nobody(tmp_path: Path, nobody: Any) -> None:
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    state = tmp_path / "state"
    mgr = ProcessManager("h1", Journal(state / "journal.jsonl"), state, kill_grace=0.5, run_as_user=True)
    assert mgr.start(job(1, "id -un; echo $HOME", user="nobody", cwd=str(work),
                         stdout="out.txt", stderr="err.txt"))
    assert ended(mgr, 1)["exit_status"] == 0
    assert (work / "out.txt").read_text().split() == ["nobody", nobody.pw_dir]
    assert (work / "out.txt").stat().st_uid == nobody.pw_uid
    # The job's files are opened as its user: a file only root may write is not appended to.
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    assert mgr.start(job(3, "echo pwned", user="nobody", cwd=str(work), stdout=str(secret)))
    report = ended(mgr, 3)
    assert report["event"] == "fail" and "cannot be opened by its user" in report["reason"]
    assert secret.read_text() == "root's\n" and secret.stat().st_uid == 0
    # Without -o the output goes to the worker's spool, handed over to the user.
    assert mgr.start(job(4, "id -un", user="nobody", cwd=str(work)))
    assert ended(mgr, 4)["exit_status"] == 0
    assert (state / "jobs" / "4.out").read_text().strip() == "nobody"
    # A user this host does not know fails the job with the reason, never runs it as root.
    assert not mgr.start(job(2, "true", user="no-such-user-xce", cwd=str(work)))
    report = ended(mgr, 2)
    assert report["event"] == "fail" and "not known on h1" in report["reason"]


def test_without_run_as_user_jobs_run_as_the_worker(pm: ProcessManager, tmp_path: Path) -> None:
    import getpass

    out = tmp_path / "who.txt"
    assert pm.start(job(1, f"id -un > {out}", user="somebody-else", cwd=str(tmp_path)))
    assert ended(pm, 1)["exit_status"] == 0
    assert out.read_text().strip() == getpass.getuser()


def test_job_usage_reports_swap_as_swap_not_the_virtual_size(pm: ProcessManager) -> None:
    """``swap`` is what the kernel swapped out (VmSwap), not the virtual memory size."""
    from xce_worker.containment.cgroupfs import proc_memory

    pm.start(job(40, "sleep 60"))
    rj = pm.running[40]
    wait_for(lambda: len(rj.group.pids()) >= 2, 5, what="the job's processes")
    usage = rj.group.usage()
    swapped = sum(proc_memory(p)[1] for p in usage.pids)
    assert usage.swap == swapped  # the members' VmSwap, summed
    vsize = sum(psutil.Process(p).memory_info().vms for p in usage.pids)
    assert usage.swap is not None and usage.swap < vsize  # far less than the address space
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmSwap:"))
    assert proc_memory(os.getpid())[1] == int(line.split()[1]) * 1024
    assert proc_memory(2**22 + 12345) == (0, 0)  # no such process
    pm.signal(40, 0, "kill")
    ended(pm, 40)
