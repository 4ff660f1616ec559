"""Lost hosts against a real controller and real workers: a worker SIGKILLed with a job
running leaves the job UNKWN; restarted, it re-adopts the job from its journal and the job
is RUN again, then ends normally. Left lost past ``lost_job_timeout``, the job is marked
EXIT with the reason (or requeued), and a worker that comes back kills what it still runs."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from test_worker_cluster import admin, host_up, job_state, run_job, start_worker, wait_log

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]


def lost_cluster(make: Callable[..., LocalCluster], timeout: float, action: str) -> LocalCluster:
    return make(1, extra_config=f'[controller]\nhost_timeout = 1.0\nlost_job_timeout = {timeout}\n'
                                f'lost_job_action = "{action}"\n')


def until_released(release: Path, pidfile: Path) -> str:
    """A job that runs until ``release`` exists (at most a minute), its shell's pid written."""
    return (f"echo $$ > {pidfile}; for i in $(seq 1200); do [ -e {release} ] && exit 0; "
            "sleep 0.05; done; exit 9")


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_killed_worker_leaves_its_job_unkwn_and_its_restart_makes_it_run_again(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = lost_cluster(xce_cluster, 60, "exit")
    state, release, pidfile = tmp_path / "u1", tmp_path / "release", tmp_path / "pid"
    w = start_worker(cl, "u1", state, "u1-first")
    try:
        with admin(cl) as c:
            wait_for(lambda: host_up(c, "u1"), 20, what="host u1")
            jobid = run_job(c, "u1", until_released(release, pidfile))
            wait_log(w, f"reported job {jobid} start")
            started = job_state(c, jobid)["start_time"]
            w.kill(signal.SIGKILL)
            lost = wait_for(lambda: (j := job_state(c, jobid))["state"] == "UNKWN" and j, 20,
                            what=f"job {jobid} UNKWN")
            assert lost["lost_from"] == "RUN" and lost["alloc"] == [{"host": "u1", "ntasks": 1}]
            assert not pid_gone(int(pidfile.read_text()))  # the job itself still runs
            w2 = start_worker(cl, "u1", state, "u1-second")
            wait_log(w2, f"re-adopted job {jobid}")
            back = wait_for(lambda: (j := job_state(c, jobid))["state"] == "RUN" and j, 20,
                            what=f"job {jobid} RUN again")
            assert back["lost_at"] is None and back["start_time"] == started
            wait_log(w2, f"job {jobid} (attempt 0) is UNKWN at the controller and runs here")
            release.touch()
            done = wait_for(lambda: (j := job_state(c, jobid))["state"] in ("DONE", "EXIT") and j,
                            30, what=f"job {jobid} ended")
            assert (done["state"], done["exit_status"], done["attempt"]) == ("DONE", 0, 0)
    finally:
        release.touch()


@pytest.mark.parametrize("action", ["exit", "requeue"])
def test_a_job_lost_past_the_timeout_ends_or_is_requeued_and_a_returning_worker_kills_it(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path, action: str) -> None:
    cl = lost_cluster(xce_cluster, 2, action)
    state, release, pidfile = tmp_path / "u2", tmp_path / "release", tmp_path / "pid"
    w = start_worker(cl, "u2", state, "u2-first")
    try:
        with admin(cl) as c:
            wait_for(lambda: host_up(c, "u2"), 20, what="host u2")
            jobid = run_job(c, "u2", until_released(release, pidfile))
            wait_log(w, f"reported job {jobid} start")
            w.kill(signal.SIGKILL)
            wait_for(lambda: job_state(c, jobid)["state"] == "UNKWN", 20, what="job UNKWN")
            want = "EXIT" if action == "exit" else "PEND"
            rec = wait_for(lambda: (j := job_state(c, jobid))["state"] == want and j, 20,
                           what=f"job {jobid} {want} after the lost-job timeout")
            if action == "exit":
                assert rec["reason"] == "host u2 lost: unavail for 2 s"
                assert rec["end_time"] is not None
            else:
                assert rec["attempt"] == 1 and rec["alloc"] == []
                assert rec["reason"] == "requeued: host u2 lost: unavail for 2 s"
            hosts = c.call("hostinfo", {})["hosts"]
            assert next(h for h in hosts if h["name"] == "u2")["used_slots"] == 0
            pid = int(pidfile.read_text())
            assert not pid_gone(pid)
            w2 = start_worker(cl, "u2", state, "u2-second")
            wait_log(w2, "no longer lists it")
            wait_for(lambda: pid_gone(pid), 20, what="the lost job's process killed")
            assert job_state(c, jobid)["state"] == want  # its late end changes nothing
    finally:
        release.touch()


def test_a_worker_whose_state_dir_was_lost_does_not_run_its_started_job_again(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    """Restarted with an empty state directory, a worker sees its host's RUN job that it has no
    record of: it fails the job with the reason instead of starting it a second time."""
    cl = lost_cluster(xce_cluster, 60, "exit")
    release, pidfile = tmp_path / "release", tmp_path / "pid"
    w = start_worker(cl, "u3", tmp_path / "u3", "u3-first")
    try:
        with admin(cl) as c:
            wait_for(lambda: host_up(c, "u3"), 20, what="host u3")
            jobid = run_job(c, "u3", until_released(release, pidfile))
            wait_log(w, f"reported job {jobid} start")
            first_pid = pidfile.read_text()
            w.kill(signal.SIGKILL)
            wait_for(lambda: job_state(c, jobid)["state"] == "UNKWN", 20, what="job UNKWN")
            w2 = start_worker(cl, "u3", tmp_path / "u3-wiped", "u3-second")
            rec = wait_for(lambda: (j := job_state(c, jobid))["state"] == "EXIT" and j, 20,
                           what=f"job {jobid} failed by the worker without its record")
            assert rec["reason"].startswith("failed: lost on u3: it started there (pid "), rec
            assert "has no record of it" in rec["reason"] and rec["attempt"] == 0
            assert pidfile.read_text() == first_pid, "the job was started a second time"
            assert f"started job {jobid} " not in w2.text()
            hosts = c.call("hostinfo", {})["hosts"]
            assert next(h for h in hosts if h["name"] == "u3")["used_slots"] == 0
    finally:
        release.touch()
