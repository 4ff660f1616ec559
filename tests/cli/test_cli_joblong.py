"""``xce jobs -l``'s long form of a job record, as a pure function of the record."""

from __future__ import annotations

import time

import pytest

from xcecore.cli.joblong import long_format

pytestmark = pytest.mark.timeout(30)

T = time.mktime((2026, 12, 1, 10, 0, 0, 0, 0, -1))
BASE = {"jobid": 7, "name": "", "user": "alice", "project": "p1", "queue": "normal",
        "command": "sleep 30", "cwd": "/w", "ntasks": 2, "resreq": "rusage[mem=100]",
        "submit_time": T, "alloc": [], "attempt": 0, "usage": {}}


def test_a_finished_job_says_how_it_ended_what_it_used_and_why() -> None:
    rec = {**BASE, "name": "big", "state": "EXIT", "start_time": T + 5, "end_time": T + 3725,
           "alloc": [{"host": "n1", "ntasks": 2}], "pid": 4242, "exit_status": 137,
           "reason": "memory limit exceeded", "mem_limit": 64 << 20, "run_limit": 5400,
           "exclusive": True, "stdout": "o.%J", "attempt": 1,
           "usage": {"cputime": 12.5, "utime": 12.0, "stime": 0.5, "max_mem": 64.2, "mem": 0.0,
                     "nprocs": 0}}
    lines = long_format(rec).splitlines()
    assert lines[0] == ("Job <7>, Job Name <big>, User <alice>, Project <p1>, Status <EXIT>, "
                        "Queue <normal>, Attempt <1>")
    assert lines[1:5] == ["  Command <sleep 30>", "  Working directory </w>",
                          "  Requested: 2 task(s), requirement <rusage[mem=100]>, exclusive hosts",
                          "  Limits: memory 64MB, run time 1:30:00"]
    assert lines[5] == "  Files: stdout <o.%J>"
    assert lines[6] == "  Tue Dec 01 10:00:00 2026: Submitted"
    assert lines[7] == "  Tue Dec 01 10:00:05 2026: Dispatched to <2*n1>, pid 4242"
    assert lines[8] == "  Tue Dec 01 11:02:05 2026: Exited with exit status 137 after 1:02:00"
    assert lines[9:] == ["  Reason: memory limit exceeded",
                         "  Usage: CPU time 12.50 s (user 12.00, system 0.50), peak memory 64.2 MB"]


def test_pending_running_and_unknown_jobs() -> None:
    pend = long_format({**BASE, "state": "PEND", "pend_reason": "no host fits"})
    assert pend.splitlines()[-1] == "  Pending reason: no host fits" and "Dispatched" not in pend
    run = {**BASE, "state": "RUN", "alloc": [{"host": "n1", "ntasks": 1}, {"host": "n2", "ntasks": 1}],
           "usage": {"cputime": 1.0, "utime": 1.0, "stime": 0.0, "max_mem": 5.0, "mem": 4.0,
                     "nprocs": 3}, "signal": "kill", "reason": "killed by owner alice"}
    text = long_format(run)
    assert "  (start not yet reported): Dispatched to <n1 n2>" in text
    assert "memory now 4.0 MB, 3 process(es)" in text and "Signal pending: kill" in text
    lost = long_format({**run, "state": "UNKWN", "lost_at": T + 60, "lost_from": "USUSP",
                        "start_time": T + 1, "signal": None, "reason": None})
    assert "  Tue Dec 01 10:01:00 2026: Host unavail: status UNKNOWN (was USUSP) until its worker " \
           "re-joins" in lost
    done = long_format({**BASE, "state": "DONE", "start_time": T, "end_time": T + 2,
                        "exit_status": 0, "alloc": [{"host": "n1", "ntasks": 2}]})
    assert done.splitlines()[-1] == "  Tue Dec 01 10:00:02 2026: Done successfully with exit status 0 after 0:00:02"
