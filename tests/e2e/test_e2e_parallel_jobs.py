"""Parallel jobs over two real workers on loopback (issue 22): everything real -- one
controller candidate, two workers (hosts ``p1``, ``p2``), the scheduler, the ``xce`` command,
the tasks' processes and cgroups.

- the scheduler places ``xce submit -n 4 -R "span[ptile=2]"`` over both hosts; rank 0 (on
  the first host) reads ``XCE_HOSTFILE`` (both hosts, two slots each) and launches tasks on
  the other host; the job ends DONE with its tasks listed and their usage in the job's;
- a worker SIGKILLed while a task of a job runs on it, and started again, re-adopts the task
  (listed RUN with the same pid, not failed); the job's end kills it there and it reports
  its end with its usage; no process or group of it is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xcecore.client import SyncClient
from xcecore.log import pid_alive
from xcecore.testing import LocalCluster, Proc, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
PY = sys.executable
ENDED = ("DONE", "EXIT")


def start_worker(cl: LocalCluster, tmp: Path, hname: str, name: str | None = None) -> Proc:
    """A worker of two slots for host ``hname`` (its state in ``tmp/hname``)."""
    return cl.start_role("worker", f'worker.hname="{hname}"', f'worker.state_dir="{tmp / hname}"',
                         "worker.slots=2", "worker.ncpus=2", "worker.hello_interval=0.2",
                         "worker.kill_grace=1.0", "worker.monitor_interval=0.2",
                         name=name or hname)


def job(c: SyncClient, jobid: int) -> dict[str, Any]:
    rec: dict[str, Any] = c.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
    return rec


def tasks_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return list((rec.get("tasks") or {}).get("list", ()))


def ended(c: SyncClient, jobid: int) -> dict[str, Any] | None:
    rec = job(c, jobid)
    if rec["state"] in ENDED and all(t["state"] in ENDED for t in tasks_of(rec)):
        return rec
    return None


def two_hosts(c: SyncClient) -> bool:
    return sum(h["available"] for h in c.call("hostinfo", {})["hosts"]) == 2


def job_env(cl: LocalCluster) -> dict[str, str]:
    """What a job needs to run ``xce task launch``: the cluster's config, this Python."""
    return {"XCE_CONFIG": str(cl.config_path), "PATH": os.environ["PATH"]}


def groups_left(tmp: Path, hname: str, key: str) -> list[Path]:
    """The cgroup directories named for ``key`` the worker of ``hname`` made, if any."""
    bases = (tmp / hname / "cgroups").read_text().split()
    return [p for b in bases for p in Path(b).glob(f"*{key}*")]


RANK0 = r'''
import json, os, subprocess, sys
with open(os.environ["XCE_HOSTFILE"]) as fh:
    slots = fh.read().split()
me = os.environ["XCE_HOSTS"].split()[0]
others = [h for h in slots if h != me]
launch = subprocess.run([sys.executable, "-m", "xcecore", "task", "launch", *others, "--",
                         "sh", "-c", 'echo "task $XCE_TASKID on $XCE_TASK_HOST"'],
                        capture_output=True, text=True)
print(json.dumps({"slots": slots, "first": me, "rc": launch.returncode,
                  "out": sorted(launch.stdout.split("\n")), "err": launch.stderr}), flush=True)
sys.exit(launch.returncode)
'''


def test_the_scheduler_places_a_span_ptile_job_over_two_hosts_and_its_tasks_run_there(
        xce_cluster: Callable[..., LocalCluster], xce_client: Callable[..., SyncClient],
        tmp_path: Path) -> None:
    cl = xce_cluster(1)
    for h in ("p1", "p2"):
        start_worker(cl, tmp_path, h)
    cl.start_role("scheduler")
    c = xce_client(cl, "cli")
    wait_for(lambda: two_hosts(c), 30, what="two workers joined")
    rank0, out = tmp_path / "rank0.py", tmp_path / "span.out"
    rank0.write_text(RANK0)
    got = subprocess.run([PY, "-m", "xcecore", "--config", str(cl.config_path), "submit",
                          "--json", "-n", "4", "-R", "span[ptile=2]", "-o", str(out), "--",
                          PY, str(rank0)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **job_env(cl)}, check=False)
    assert got.returncode == 0, got.stderr
    jobid = int(json.loads(got.stdout)["jobid"])
    rec = wait_for(lambda: ended(c, jobid), 90, what="the span[ptile=2] job's end")
    text = out.read_text()
    assert rec["state"] == "DONE", (rec, text)
    # placed by the scheduler: two slots on each host
    assert sorted((a["host"], a["ntasks"]) for a in rec["alloc"]) == [("p1", 2), ("p2", 2)], rec
    result = json.loads(next(line for line in text.splitlines() if line.startswith("{")))
    first = result["first"]
    other = "p2" if first == "p1" else "p1"
    assert first == rec["alloc"][0]["host"]
    assert result["slots"] == [first, first, other, other], result  # XCE_HOSTFILE: a line a slot
    assert result["rc"] == 0, result
    listed = tasks_of(rec)
    assert [(t["task"], t["host"], t["state"], t["exit_status"]) for t in listed] == \
        [(1, other, "DONE", 0), (2, other, "DONE", 0)], listed
    assert all(t["pid"] and "cputime" in t["usage"] for t in listed), listed  # accounted
    assert "cputime" in rec["usage"]
    assert f"task 1 on {other}" in text and f"task 2 on {other}" in text, text


def test_a_restarted_worker_re_adopts_its_running_task_and_kills_it_with_the_job(
        xce_cluster: Callable[..., LocalCluster], xce_client: Callable[..., SyncClient],
        tmp_path: Path) -> None:
    cl = xce_cluster(1)
    start_worker(cl, tmp_path, "p1")
    p2 = start_worker(cl, tmp_path, "p2")
    c = xce_client(cl, "cli")
    wait_for(lambda: two_hosts(c), 30, what="two workers joined")
    release, out = tmp_path / "release", tmp_path / "restart.out"
    cmd = (f"{PY} -m xcecore task launch p2 -- sleep 300 & "
           f"while [ ! -e {release} ]; do sleep 0.05; done; exit 0")
    jobid: int = c.call("jobsubmit", {"command": cmd, "ntasks": 2, "stdout": str(out),
                                      "env": job_env(cl)})["jobid"]
    c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": "p1", "ntasks": 1},
                                                     {"host": "p2", "ntasks": 1}], "force": True})
    (task,) = wait_for(lambda: [t for t in tasks_of(job(c, jobid)) if t["state"] == "RUN"],
                       60, what="the task running on p2")
    pid = task["pid"]
    key = f"{jobid}.0.t{task['task']}"

    p2.kill()  # SIGKILL: the task runs on, in its own group
    assert pid_alive(pid)
    again = start_worker(cl, tmp_path, "p2", name="p2-again")
    wait_for(lambda: "active job(s) allocated here" in again.text(), 30,
             what="the restarted worker's sync")
    log = again.text()
    assert f"re-adopted task {task['task']} of job {jobid} (pid {pid}" in log, log
    wait_for(lambda: two_hosts(c), 30, what="p2 available again")
    (now,) = tasks_of(job(c, jobid))
    assert (now["state"], now["pid"]) == ("RUN", pid), now  # listed, not failed
    assert pid_alive(pid) and groups_left(tmp_path, "p2", key)

    release.touch()  # rank 0 ends: the job ends, and its task on p2 is killed with it
    rec = wait_for(lambda: ended(c, jobid), 60, what="the job and its task ended")
    assert rec["state"] == "DONE", rec
    (done,) = tasks_of(rec)
    assert done["state"] == "EXIT" and done["exit_status"] > 128, done
    assert not done.get("reason"), done  # killed with its job, not failed by the restart
    assert "cputime" in done["usage"], done  # accounted from its re-adopted group
    wait_for(lambda: not pid_alive(pid), 10, what="the task's process gone")
    assert f"task {task['task']} of job {jobid} finished with exit status" in again.text()
    wait_for(lambda: not groups_left(tmp_path, "p2", key), 10, what="the task's group removed")
    assert not list((tmp_path / "p2" / "jobs").glob(f"{key}.*"))  # its files too


BURN = ("import time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.8: pass\n"
        "time.sleep(300)\n")


def test_a_running_parallel_jobs_usage_counts_every_task(
        xce_cluster: Callable[..., LocalCluster], xce_client: Callable[..., SyncClient],
        tmp_path: Path) -> None:
    """Issue 22: while the job runs, its usage is its first task's plus its tasks' (the
    workers' periodic samples), not rank 0's alone; at its end, every task's final figures."""
    cl = xce_cluster(1)
    for h in ("p1", "p2"):
        start_worker(cl, tmp_path, h)
    c = xce_client(cl, "cli")
    wait_for(lambda: two_hosts(c), 30, what="two workers joined")
    burn, release = tmp_path / "burn.py", tmp_path / "release"
    burn.write_text(BURN)
    cmd = (f"{PY} -m xcecore task launch p2 -- {PY} {burn} & "
           f"while [ ! -e {release} ]; do sleep 0.05; done; exit 0")
    jobid: int = c.call("jobsubmit", {"command": cmd, "ntasks": 2, "stdout": str(tmp_path / "out"),
                                      "env": job_env(cl)})["jobid"]
    c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": "p1", "ntasks": 1},
                                                     {"host": "p2", "ntasks": 1}], "force": True})

    def burnt() -> dict[str, Any] | None:
        rec = job(c, jobid)
        ts = tasks_of(rec)
        if rec["state"] == "RUN" and ts and ts[0]["state"] == "RUN" and \
                (ts[0].get("usage") or {}).get("cputime", 0) >= 0.8:
            return rec
        return None

    rec = wait_for(burnt, 60, what="the task's CPU burn sampled while the job runs")
    first, (t,) = rec["tasks"]["first_usage"], tasks_of(rec)
    live = rec["usage"]
    assert live["cputime"] == pytest.approx(first["cputime"] + t["usage"]["cputime"], abs=1e-3), rec
    assert live["cputime"] >= 0.8 and live["nprocs"] == first["nprocs"] + t["usage"]["nprocs"], rec
    assert live["mem"] == pytest.approx(first["mem"] + t["usage"]["mem"], abs=1e-2), rec

    release.touch()
    rec = wait_for(lambda: ended(c, jobid), 60, what="the job and its task ended")
    (t,) = tasks_of(rec)
    assert rec["state"] == "DONE" and t["usage"]["cputime"] >= 0.8, rec
    assert rec["usage"]["cputime"] >= t["usage"]["cputime"] and "first_usage" not in rec["tasks"], rec
