"""Parallel jobs' tasks (issue #22): task launch latency and a 3-host job's start.

Real processes on the fault test bed (needs root: network namespaces): one controller
candidate on host ``ctl`` (SQLite, durable commits), a real worker on each of ``n1``, ``n2``,
``n3``, each task a real process in a cgroup of its job. Times are wall-clock on this one
machine (every simulated host shares its clock).

1. ``launch``: a job runs on n1, n2, n3; the bench, presenting the job's secret as the job's
   owner (what ``xce task launch`` sends), calls ``task_launch`` for one task on n2 whose
   command writes ``date +%s.%N``: call -> the task's command running (ms), ``--launches``
   times. Then ``xce task launch n2 -- true`` run from inside the job's host with the job's
   environment: the command's whole wall time (its interpreter, the launch, the task, its
   end report, the command's poll of the job's record), ``--cli`` times.
2. ``job_start``: ``jobsubmit`` of a 3-task job and a forced ``jobdispatch`` onto n1, n2, n3;
   rank 0 writes its start time and runs ``xce task launch n2 n3 -- <write the time>``:
   submit -> rank 0 running, and submit -> every task running (ms), ``--jobs`` times.

    sudo python benchmarks/bench_tasks.py                          # full run
    sudo python benchmarks/bench_tasks.py --launches 10 --cli 3 --jobs 3   # short
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import log, meta, stats, write_result

PART = "tasks"
HOSTS = ("n1", "n2", "n3")
PY = sys.executable


def _wait(cond: Any, timeout: float, what: str) -> Any:
    from xcecore.testing.cluster import wait_for

    return wait_for(cond, timeout, interval=0.002, what=what)


def _times(path: Path) -> list[float]:
    try:
        return [float(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _secret(pid: int) -> str:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"XCE_TASK_SECRET="))


def _job(c: Any, jobid: int) -> dict[str, Any]:
    rec: dict[str, Any] = c.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
    return rec


def run(root: Path, launches: int, cli_runs: int, jobs: int) -> dict[str, Any]:
    from xcecore.testing.faultbed import FaultBed

    with FaultBed(root / "bed") as bed:
        ctl = bed.add_host("ctl")
        for name in HOSTS:
            bed.add_host(name)
        cluster = bed.cluster(ctl, 1)
        cluster.start()
        for name in HOSTS:
            h = bed.host(name)
            bed.start_role(cluster, name, "worker", f'worker.hname="{name}"',
                           f'worker.state_dir="{h.state_dir}"', "worker.kill_grace=1.0")
        with bed.client(cluster, ctl, "cli", name="bench") as c:
            _wait(lambda: sum(h["available"] for h in c.call("hostinfo", {})["hosts"]) == 3,
                  60, "three workers")
            env = {"XCE_CONFIG": str(cluster.config_path), "PATH": os.environ["PATH"]}
            alloc = [{"host": h, "ntasks": 1} for h in HOSTS]

            # 1. launch latency: task_launch -> the task's command running
            release = root / "release"
            jobid = c.call("jobsubmit", {"command": f"while [ ! -e {release} ]; do sleep 0.1; "
                                         "done", "ntasks": 3, "env": env})["jobid"]
            c.call("jobdispatch", {"jobid": jobid, "alloc": alloc, "force": True})
            pid = _wait(lambda: _job(c, jobid).get("pid"), 30, "the job's start")
            secret = _secret(pid)
            launch_ms = []
            for i in range(launches):
                mark = root / f"launch{i}"
                t0 = time.time()
                c.call("task_launch", {"jobid": jobid, "hosts": ["n2"], "secret": secret,
                                       "command": f"date +%s.%N > {mark}"})
                started = _wait(lambda m=mark: _times(m), 30, "the task's start")[0]  # type: ignore[misc]
                launch_ms.append((started - t0) * 1e3)
            log(PART, f"task_launch -> running: {stats(launch_ms)}")
            cli_ms = []
            job_env = {**env, "XCE_JOBID": str(jobid), "XCE_TASK_SECRET": secret}
            for _ in range(cli_runs):
                t0 = time.perf_counter()
                done = subprocess.run(bed.command("n1", ["env", *[f"{k}={v}" for k, v in
                                                               job_env.items()],
                                                        PY, "-m", "xcecore", "task", "launch",
                                                        "n2", "--", "true"]),
                                      capture_output=True, text=True, timeout=60)
                if done.returncode != 0:
                    raise RuntimeError(f"xce task launch failed: {done.stderr}")
                cli_ms.append((time.perf_counter() - t0) * 1e3)
            log(PART, f"xce task launch n2 -- true: {stats(cli_ms)}")
            release.touch()
            _wait(lambda: _job(c, jobid)["state"] in ("DONE", "EXIT"), 30, "the job's end")

            # 2. a 3-host job's start
            rank0_ms, all_ms = [], []
            for i in range(jobs):
                r0, tf = root / f"r0-{i}", root / f"t-{i}"
                cmd = (f"date +%s.%N > {r0}; {PY} -m xcecore task launch n2 n3 -- "
                       f"sh -c 'date +%s.%N >> {tf}'")
                t0 = time.time()
                jid = c.call("jobsubmit", {"command": cmd, "ntasks": 3, "env": env})["jobid"]
                c.call("jobdispatch", {"jobid": jid, "alloc": alloc, "force": True})
                first = _wait(lambda p=r0: _times(p), 60, "rank 0's start")[0]  # type: ignore[misc]
                both = _wait(lambda p=tf: (lambda t: t if len(t) == 2 else None)(_times(p)),  # type: ignore[misc]
                             60, "both tasks' start")
                rank0_ms.append((first - t0) * 1e3)
                all_ms.append((max(both) - t0) * 1e3)
                _wait(lambda j=jid: _job(c, j)["state"] in ("DONE", "EXIT"), 60, "the job's end")  # type: ignore[misc]
            log(PART, f"3-host job: rank 0 {stats(rank0_ms)}; all tasks {stats(all_ms)}")
    return {"launch_ms": stats(launch_ms), "cli_launch_ms": stats(cli_ms),
            "job_rank0_ms": stats(rank0_ms), "job_all_tasks_ms": stats(all_ms)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--cli", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=20)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="xce-bench-tasks-") as tmp:
        results = run(Path(tmp), args.launches, args.cli, args.jobs)
    write_result(PART, {**meta(), "loadavg_1min_at_start": round(load0, 2),
                        "loadavg_1min_at_end": round(os.getloadavg()[0], 2), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
