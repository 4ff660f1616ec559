"""Parallel jobs across hosts on the fault test bed: a job allocated to three simulated hosts
(network namespaces, a worker each) starts its first task on the first host; from inside the
job ``xce task launch`` starts tasks on the others through their workers. Everything is real:
the controller, the workers, the tasks' processes and cgroups, TCP between the tasks.

- the tasks talk to rank 0 over TCP and report their host names; the job gets a host file;
  the tasks are listed with the job (``jobinfo``, ``xce jobs -l``);
- launches are refused outside the allocation, without the job's secret (the owner from
  outside the job), and for another user (a front end naming one) even with the secret;
- rank 0's end ends the job and kills the other tasks on their hosts;
- ``xce task block`` makes a launch wait (and fail after its ``--wait``), ``unblock`` lets it;
- a task's host powered off fails the job, the reason naming the host.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from xcecore.client import SyncClient
from xcecore.log import pid_alive  # the workers reap their tasks: no zombie stays
from xcecore.testing.cluster import LocalCluster, wait_for
from xcecore.testing.faultbed import FaultBed
from xcecore.wire import RemoteError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
HOSTS = ("n1", "n2", "n3")
PY = sys.executable

RANK0 = r'''
import json, os, socket, subprocess, sys
addr = os.environ["RANK0_ADDR"]
srv = socket.create_server((addr, 0))
srv.settimeout(60)
port = srv.getsockname()[1]
others = os.environ["XCE_HOSTS"].split()[1:]
launch = subprocess.Popen([sys.executable, "-m", "xcecore", "task", "launch", *others, "--",
                           sys.executable, os.environ["TASK_SCRIPT"], addr, str(port)])
got = []
for _ in others:
    conn, _ = srv.accept()
    with conn, conn.makefile("rw") as fh:
        got.append(fh.readline().strip())
        fh.write("ok\n")
rc = launch.wait()
with open(os.environ["XCE_HOSTFILE"]) as fh:
    hostfile = fh.read()
print(json.dumps({"heard": sorted(got), "launch_rc": rc, "hostfile": hostfile}), flush=True)
'''

TASK = r'''
import os, socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s, \
        s.makefile("rw") as fh:
    fh.write(f"{os.environ['XCE_TASK_HOST']} task {os.environ['XCE_TASKID']}\n")
    fh.flush()
    assert fh.readline().strip() == "ok"
with open("/proc/self/cgroup") as fh:
    group = ";".join(fh.read().split())
print("task on", os.environ["XCE_TASK_HOST"], "done in", group, flush=True)
'''


@contextmanager
def parallel_bed(bed: FaultBed, tmp: Path, extra: str = "") -> Iterator[tuple[LocalCluster, SyncClient]]:
    """A controller on ``ctl`` and a worker on each of n1..n3; an admin client on ``ctl``."""
    ctl = bed.add_host("ctl")
    for name in HOSTS:
        bed.add_host(name)
    cluster = bed.cluster(ctl, 1, extra_config=extra)
    cluster.start()
    for name in HOSTS:
        h = bed.host(name)
        bed.start_role(cluster, name, "worker", f'worker.hname="{name}"',
                       f'worker.state_dir="{h.state_dir}"', "worker.hello_interval=0.2",
                       "worker.kill_grace=1.0", "worker.monitor_interval=0.2")
    with bed.client(cluster, ctl, "cli", name="admin") as c:
        wait_for(lambda: sum(h["available"] for h in c.call("hostinfo", {})["hosts"]) == 3,
                 30, what="three workers joined")
        yield cluster, c


def run_parallel(c: SyncClient, cluster: LocalCluster, command: str, out: Path,
                 env: dict[str, str] | None = None) -> int:
    """Submit ``command`` with 3 tasks and force it onto n1, n2, n3 (one slot each)."""
    job_env = {"XCE_CONFIG": str(cluster.config_path), "PATH": os.environ["PATH"], **(env or {})}
    jobid: int = c.call("jobsubmit", {"command": command, "ntasks": 3, "stdout": str(out),
                                      "env": job_env})["jobid"]
    c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": h, "ntasks": 1} for h in HOSTS],
                           "force": True})
    return jobid


def job(c: SyncClient, jobid: int) -> dict[str, Any]:
    rec: dict[str, Any] = c.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
    return rec


def tasks_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return list((rec.get("tasks") or {}).get("list", ()))


def running_tasks(c: SyncClient, jobid: int, n: int) -> list[dict[str, Any]]:
    recs = tasks_of(job(c, jobid))
    return recs if len(recs) == n and all(r["state"] == "RUN" for r in recs) else []


def ended(c: SyncClient, jobid: int) -> dict[str, Any] | None:
    rec = job(c, jobid)
    return rec if rec["state"] in ("DONE", "EXIT") else None


def secret_of(pid: int) -> str:
    """The job's task secret, as its own processes see it (read as root, for the test)."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"XCE_TASK_SECRET="))


def test_tasks_on_three_hosts_talk_over_tcp_refusals_block_and_rank0_end(
        xce_faultbed: FaultBed, tmp_path: Path) -> None:
    bed = xce_faultbed
    rank0, task = tmp_path / "rank0.py", tmp_path / "task.py"
    rank0.write_text(RANK0)
    task.write_text(TASK)
    with parallel_bed(bed, tmp_path) as (cluster, c):
        # -- three hosts, TCP between the tasks, host names reported --------------------------
        out = tmp_path / "tcp.out"
        jobid = run_parallel(c, cluster, f"{PY} {rank0}", out,
                             {"RANK0_ADDR": bed.host("n1").addr, "TASK_SCRIPT": str(task)})
        rec = wait_for(lambda: ended(c, jobid), 60, what="the TCP job's end")
        text = out.read_text()
        assert rec["state"] == "DONE", (rec, text)
        result = next(__import__("json").loads(line) for line in text.splitlines()
                      if line.startswith("{"))
        assert result == {"heard": ["n2 task 1", "n3 task 2"], "launch_rc": 0,
                          "hostfile": "n1\nn2\nn3\n"}, text
        for n, host in ((1, "n2"), (2, "n3")):  # each in a cgroup of the job on its host
            assert f"task on {host} done in " in text
            groups = text.split(f"task on {host} done in ")[1].split("\n")[0].split(";")
            assert any(g.endswith(f"/job-{jobid}.0.t{n}") for g in groups), text
        listed = tasks_of(rec)
        assert [(t["task"], t["host"], t["state"], t["exit_status"]) for t in listed] == \
            [(1, "n2", "DONE", 0), (2, "n3", "DONE", 0)]
        assert all(t["pid"] and t["start_time"] and t["end_time"] for t in listed)
        assert "cputime" in rec["usage"]  # the tasks' usage added to rank 0's
        long = bed.run("ctl", [PY, "-m", "xcecore", "--config", str(cluster.config_path),
                               "jobs", "-l", str(jobid)])
        assert long.returncode == 0, long.stderr
        assert "Tasks: 2 launched" in long.stdout and "task 1 on <n2>: DONE" in long.stdout, \
            long.stdout
        assert "task 2 on <n3>: DONE" in long.stdout and "exit status 0" in long.stdout

        # -- refusals; rank 0's end kills the other tasks -------------------------------------
        release = tmp_path / "release"
        out2 = tmp_path / "kill.out"
        cmd = (f"{PY} -m xcecore task launch n2 n3 -- sleep 300 & "
               f"while [ ! -e {release} ]; do sleep 0.05; done; exit 3")
        jobid = run_parallel(c, cluster, cmd, out2)
        recs = wait_for(lambda: running_tasks(c, jobid, 2), 60, what="two sleeping tasks")
        secret = secret_of(job(c, jobid)["pid"])
        base = {"jobid": jobid, "command": "true", "secret": secret}
        with pytest.raises(RemoteError) as err:
            c.call("task_launch", {**base, "hosts": ["n2", "ctl"]})
        assert err.value.code == "INVALID" and "ctl" in err.value.message
        assert "n2" not in err.value.message.split("allocation")[0]
        with pytest.raises(RemoteError) as err:  # the owner, from outside the job
            c.call("task_launch", {**base, "hosts": ["n2"], "secret": "0" * 64})
        assert err.value.code == "DENIED" and "secret" in err.value.message
        with bed.client(cluster, "ctl", "apiserver", name="front") as front, \
                pytest.raises(RemoteError) as err:  # another user, even holding the secret
            front.call("task_launch", {**base, "hosts": ["n2"], "user": "mallory"})
        assert err.value.code == "DENIED" and "mallory" in err.value.message
        assert len(tasks_of(job(c, jobid))) == 2  # nothing was launched by the refused calls
        pids = [t["pid"] for t in recs]
        release.touch()
        rec = wait_for(lambda: ended(c, jobid), 60, what="the job's end after rank 0 exits")
        assert rec["state"] == "EXIT" and rec["exit_status"] == 3, rec
        done = wait_for(lambda: [t for t in tasks_of(job(c, jobid)) if t["state"] == "EXIT"]
                        if all(t["state"] == "EXIT" for t in tasks_of(job(c, jobid))) else None,
                        30, what="the tasks killed after rank 0's end")
        assert all(t["exit_status"] and t["exit_status"] > 128 for t in done), done
        wait_for(lambda: not any(pid_alive(p) for p in pids), 10, what="the task processes gone")

        # -- block / unblock --------------------------------------------------------------------
        go = tmp_path / "go"
        out3 = tmp_path / "block.out"
        cmd = (f"while [ ! -e {go} ]; do sleep 0.05; done; "
               f"{PY} -m xcecore task launch -w 1 n2 -- true; echo first=$?; "
               f"{PY} -m xcecore task launch -w 60 n3 -- echo launched-after-unblock; "
               "echo second=$?")
        jobid = run_parallel(c, cluster, cmd, out3)
        wait_for(lambda: job(c, jobid)["state"] == "RUN" and job(c, jobid)["pid"], 30,
                 what="the blocking job running")
        assert c.call("task_block", {"jobid": jobid, "action": "block"})["tasks"]["blocked"]
        go.touch()
        wait_for(lambda: "first=1" in out3.read_text(), 30, what="the first launch giving up")
        wait_for(lambda: out3.read_text().count("are blocked; waiting") == 2, 30,
                 what="the second launch waiting")
        text = out3.read_text()
        assert "stayed blocked for 1 s" in text and "nothing launched" in text, text
        assert tasks_of(job(c, jobid)) == []
        c.call("task_block", {"jobid": jobid, "action": "unblock"})
        rec = wait_for(lambda: ended(c, jobid), 60, what="the job after the unblock")
        text = out3.read_text()
        assert rec["state"] == "DONE" and "second=0" in text and "launched-after-unblock" in text, \
            text
        assert [t["host"] for t in tasks_of(rec)] == ["n3"]


def test_a_task_host_powered_off_fails_the_job_naming_the_host(xce_faultbed: FaultBed,
                                                               tmp_path: Path) -> None:
    bed = xce_faultbed
    extra = "[controller]\nhost_timeout = 1.0\n"
    with parallel_bed(bed, tmp_path, extra) as (cluster, c):
        out = tmp_path / "power.out"
        cmd = f"{PY} -m xcecore task launch n2 n3 -- sleep 300; echo launch=$?"
        jobid = run_parallel(c, cluster, cmd, out)
        recs = wait_for(lambda: running_tasks(c, jobid, 2), 60, what="two sleeping tasks")
        n2_pid = next(t["pid"] for t in recs if t["host"] == "n2")
        bed.power_off("n3")
        rec = wait_for(lambda: ended(c, jobid), 60, what="the job's end after n3 went off")
        assert rec["state"] == "EXIT", rec
        assert "n3" in rec["reason"] and "unavailable" in rec["reason"], rec["reason"]
        lost = next(t for t in tasks_of(rec) if t["host"] == "n3")
        assert lost["state"] == "EXIT" and "n3" in lost["reason"]
        wait_for(lambda: not pid_alive(n2_pid), 30, what="n2's task killed with the job")
