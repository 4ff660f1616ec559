"""The worker's side of parallel jobs (``xce_worker.tasks``) with real processes and real
cgroups: a job record listing a task for this host starts it once, in a group of its own
under the job's key, with the job's environment and ``XCE_TASKID``; its reports; the job's
end kills it; a task the controller shows RUN that this worker does not run is reported
failed; and rank 0 gets ``XCE_HOSTFILE`` and ``XCE_TASK_SECRET`` (whose SHA-256 its start
report carries); a restarted worker reports the tasks that ended while it was down
(re-adoption of running ones: ``tests/e2e/test_e2e_parallel_jobs.py``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jobkit import have_cgroup, is_dead, job, manager, need_root, notes, text_of
from xce_worker.tasks import TaskRunner

from xcecore.testing import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _root() -> None:
    need_root()
    if not have_cgroup(1, "freezer"):
        pytest.fail("these tests need the cgroup v1 freezer hierarchy mounted (as CI has)")


@contextmanager
def runner_on(tmp_path: Path, hname: str = "h1") -> Iterator[TaskRunner]:
    """A task runner on a real process manager (cgroup1); its tasks are killed at the end,
    also when the test fails, before the manager checks that no group is left."""
    with manager(tmp_path, "cgroup1", hname=hname) as pm:
        runner = TaskRunner(pm)
        try:
            yield runner
        finally:
            runner.shutdown(keep=False, timeout=10)


def parallel(jobid: int, tasks: list[tuple[dict[str, Any], str]], out: Path,
             state: str = "RUN") -> dict[str, Any]:
    """A job record of 3 tasks over h0 (2) and h1 (1), listing ``tasks`` (record, command)."""
    return job(jobid, "true", "h1", state=state, ntasks=3, stdout=str(out),
               alloc=[{"host": "h0", "ntasks": 2}, {"host": "h1", "ntasks": 1}],
               tasks={"blocked": False, "list": [{**t, "launch": i} for i, (t, _) in enumerate(tasks)],
                      "commands": [c for _, c in tasks]})


def task(n: int, command: str, host: str = "h1", state: str = "PEND") -> tuple[dict[str, Any], str]:
    return {"task": n, "host": host, "state": state}, command


def test_a_task_starts_once_in_its_group_and_the_jobs_end_kills_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with runner_on(tmp_path) as runner:
        pm = runner.pm
        cmd = ("echo task=$XCE_TASKID host=$XCE_TASK_HOST job=$XCE_JOBID; "
               "grep freezer /proc/self/cgroup; exec sleep 60")
        rec = parallel(7, [task(1, cmd), task(2, "echo not mine", host="h0")], out)
        runner.job(rec)
        runner.job(rec)  # the same record again (another change of the job): not twice
        wait_for(lambda: "freezer" in text_of(out), 20,
                 what="the task's output")
        text = text_of(out)
        assert "task=1 host=h1 job=7" in text and "not mine" not in text, text
        assert text.strip().endswith("/job-7.0.t1"), text  # its own group, under the job's key
        assert list(runner.running) == [(7, 0, 1)]
        rt = runner.running[(7, 0, 1)]
        starts = [n for n in notes(pm, 7) if n["event"] == "task_start"]
        assert len(starts) == 1 and starts[0]["task"] == 1 and starts[0]["pid"] == rt.pid
        runner.stop_or_resume(7, True)  # the job stopped: so is its task (the freezer)
        assert rt.stopped and _freezer(rt) == "FROZEN"
        runner.stop_or_resume(7, False)
        assert not rt.stopped and _freezer(rt) == "THAWED"
        runner.job({**rec, "state": "DONE"})  # the job ended: its task here is killed
        end = wait_for(lambda: next((n for n in notes(pm, 7) if n["event"] == "task_finish"),
                                    None), 20, what="the task's end report")
        assert end["exit_status"] > 128 and "cputime" in end["usage"], end
        assert is_dead(rt.pid) and not runner.running


def test_a_running_tasks_usage_is_posted_with_its_task_number(tmp_path: Path) -> None:
    """Issue 22: the jobs monitor's sample of a task (``TaskRunner.sample``) posts
    ``update_jusage`` with the task, under its own key (newest kept per task)."""
    with runner_on(tmp_path) as runner:
        pm = runner.pm
        rec = parallel(9, [task(1, "exec sleep 60")], tmp_path / "out")
        runner.job(rec)
        wait_for(lambda: any(n["event"] == "task_start" for n in notes(pm, 9)), 20,
                 what="the task started")
        runner.sample()
        (key, op, args), = [p for p in pm.posts if p[0].startswith("jusage:9.")]  # type: ignore[attr-defined]
        assert (key, op) == ("jusage:9.0.t1", "update_jusage")
        assert args["jobid"] == 9 and args["task"] == 1, args
        assert args["usage"]["nprocs"] >= 1 and "cputime" in args["usage"], args
        runner.job({**rec, "state": "DONE"})
        wait_for(lambda: not runner.running, 20, what="the task killed with its job")
        pm.posts.clear()  # type: ignore[attr-defined]
        runner.sample()  # nothing runs: nothing posted
        assert not pm.posts  # type: ignore[attr-defined]


def test_a_corrupted_task_record_is_an_error_naming_the_file_and_the_others_go_on(
        tmp_path: Path) -> None:
    """A record whose ``ct`` (or ``status``) has the wrong type is logged as an error
    naming its file and removed; the worker re-adopts or reports the other records."""
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="ERROR", format="{message}")
    try:
        with runner_on(tmp_path) as runner:
            pm = runner.pm
            gone = subprocess.Popen(["true"])
            gone.wait()
            bad = {"21.0.t1.json": {"ct": "yesterday"}, "21.0.t2.json": {"ct": True},
                   "21.0.t3.json": {"status": ["x"]}}
            for name, field in bad.items():
                n = int(name.split(".t")[1].split(".")[0])
                (pm.jobs_dir / name).write_text(json.dumps(
                    {"jobid": 21, "attempt": 0, "task": n, "pid": gone.pid, "ct": 1.0,
                     "status": None, **field}))
            (pm.jobs_dir / "22.0.t1.status").write_text("4\n")
            (pm.jobs_dir / "22.0.t1.json").write_text(json.dumps(
                {"jobid": 22, "attempt": 0, "task": 1, "pid": gone.pid, "ct": 1,
                 "status": str(pm.jobs_dir / "22.0.t1.status")}))
            assert runner.adopt() == set()
            (end,) = notes(pm, 22)  # the good record: its end reported
            assert end["event"] == "task_finish" and end["exit_status"] == 4, end
            assert not notes(pm, 21) and not list(pm.jobs_dir.glob("2[12].0.t*"))
    finally:
        logger.remove(sink)
    text = "\n".join(lines)
    assert f"{pm.jobs_dir / '21.0.t1.json'} is unreadable ('ct' (the process start time) " \
        "is 'yesterday', not a number)" in text, text
    assert "'ct' (the process start time) is True, not a number" in text, text
    assert "21.0.t3.json is unreadable ('status' is ['x'], not a path)" in text, text


def test_a_task_shown_running_that_this_worker_does_not_run_is_reported_failed(
        tmp_path: Path) -> None:
    with runner_on(tmp_path) as runner:
        pm = runner.pm
        runner.job(parallel(8, [task(1, "sleep 60", state="RUN")], tmp_path / "out"))
        (fail,) = [n for n in notes(pm, 8) if n["event"] == "task_fail"]
        assert fail["task"] == 1 and "restarted" in fail["reason"]
        assert not runner.running


def test_a_task_that_cannot_start_is_reported_with_the_reason(tmp_path: Path) -> None:
    with runner_on(tmp_path) as runner:
        pm = runner.pm
        rec = {**parallel(9, [task(1, "true")], tmp_path / "out"), "cwd": str(tmp_path / "nope")}
        runner.job(rec)
        (fail,) = [n for n in notes(pm, 9) if n["event"] == "task_fail"]
        assert "does not exist on h1" in fail["reason"]


def test_rank0_gets_a_host_file_and_a_task_secret_whose_hash_it_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with manager(tmp_path, "cgroup1", hname="h0") as pm:
        rec = parallel(10, [], out)
        rec["command"] = 'cat "$XCE_HOSTFILE"; echo "secret=$XCE_TASK_SECRET"'
        assert pm.start(rec)
        wait_for(lambda: any(n["event"] == "finish" for n in notes(pm, 10)), 20,
                 what="rank 0's end")
        lines = text_of(out).splitlines()
        assert lines[:3] == ["h0", "h0", "h1"], lines
        secret = lines[3].removeprefix("secret=")
        assert len(secret) == 64
        (start,) = [n for n in notes(pm, 10) if n["event"] == "start"]
        assert start["task_key"] == hashlib.sha256(secret.encode()).hexdigest()
        assert not (pm.jobs_dir / "10.0.hosts").exists()  # removed with the job
        # a job of one task on one host has a host file but no secret
        assert pm.start(job(11, 'cat "$XCE_HOSTFILE"; echo "secret=${XCE_TASK_SECRET:-none}"',
                            "h0", stdout=str(tmp_path / "one")))
        wait_for(lambda: "secret=" in text_of(tmp_path / "one"), 20, what="job 11's output")
        assert text_of(tmp_path / "one").splitlines() == ["h0", "secret=none"]
        (start,) = [n for n in notes(pm, 11) if n["event"] == "start"]
        assert "task_key" not in start



def _freezer(rt: Any) -> str:
    """The task's cgroup1 freezer state."""
    return (rt.group.dirs["freezer"] / "freezer.state").read_text().strip()  # type: ignore[no-any-return]


def test_adoption_reports_a_task_that_ended_while_the_worker_was_down(tmp_path: Path) -> None:
    """A task record whose process is gone: its end is reported with the status its wrapper
    recorded (or failed when none), its files removed; an unreadable record is removed."""
    with runner_on(tmp_path) as runner:
        pm = runner.pm
        gone = subprocess.Popen(["true"])
        gone.wait()  # a pid that no longer runs
        for n, status in ((1, "5\n"), (2, "")):
            (pm.jobs_dir / f"12.0.t{n}.status").write_text(status)
            (pm.jobs_dir / f"12.0.t{n}.json").write_text(json.dumps(
                {"jobid": 12, "attempt": 0, "task": n, "pid": gone.pid, "ct": 1.0,
                 "status": str(pm.jobs_dir / f"12.0.t{n}.status")}))
        (pm.jobs_dir / "13.0.t1.json").write_text('{"jobid": "x"}')
        assert runner.adopt() == set() and not runner.running
        ends = {n["task"]: n for n in notes(pm, 12)}
        assert ends[1]["event"] == "task_finish" and ends[1]["exit_status"] == 5, ends
        assert ends[2]["event"] == "task_fail" and "exit status is unknown" in ends[2]["reason"]
        assert not list(pm.jobs_dir.glob("1[23].0.t*"))
        # the controller still shows them RUN: not reported again as failed by a restart
        runner.job(parallel(12, [task(1, "true", state="RUN"), task(2, "true", state="RUN")],
                            tmp_path / "out"))
        assert len(notes(pm, 12)) == 2
