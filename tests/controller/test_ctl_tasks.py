"""A parallel job's tasks in the controller's state (``xce_controller.tasks``), as pure
transitions: the secret's check, the allocation's, blocking, the task reports, the usage they
add, a task host's loss, and the push that carries a launch to the task's host. The same
paths against real processes: ``tests/faultbed/test_parallel_tasks.py``."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from xce_controller import tasks
from xce_controller.settings import ClusterConf
from xce_controller.state import Changes, ClusterState

from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(30)
T0 = 1000.0
SECRET = "ab" * 32
KEY = hashlib.sha256(SECRET.encode()).hexdigest()


def parallel_job(*, key: bool = True) -> tuple[ClusterState, int]:
    st = ClusterState(ClusterConf(queues=({"name": "normal", "priority": 30},), host_timeout=5.0))
    for n in ("n1", "n2", "n3"):
        st.join_worker({"hname": n, "max_slots": 2}, T0)
    jobid = int(st.submit({"command": "true", "user": "alice", "ntasks": 3}, T0).result["jobid"])
    st.dispatch(jobid, [{"host": h, "ntasks": 1} for h in ("n1", "n2", "n3")], False)
    start: dict[str, Any] = {"jobid": jobid, "event": "start", "pid": 10}
    if key:
        start["task_key"] = KEY
    st.notify("n1", start, T0 + 1)
    return st, jobid


def launch(st: ClusterState, jobid: int, hosts: list[str], secret: str = SECRET,
           command: str = "hostname") -> Changes:
    ch = Changes()
    tasks.launch(st, ch, st.job(jobid), hosts, command, secret, T0 + 2)
    return ch


def block(st: ClusterState, jobid: int, blocked: bool) -> None:
    tasks.block(st, Changes(), st.job(jobid), blocked)


def test_launch_checks_secret_and_allocation_and_pushes_to_the_task_hosts() -> None:
    st, jobid = parallel_job()
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2"], "cd" * 32)
    assert err.value.code == "DENIED" and "secret" in err.value.message
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2", "n9", "n8", "n9"])
    assert err.value.code == "INVALID" and "n9, n8 not in" in err.value.message
    assert err.value.data["outside"] == ["n9", "n8"]
    assert st.job(jobid).tasks == {"blocked": False, "list": [], "key": KEY}  # nothing changed
    ch = launch(st, jobid, ["n2", "n3", "n2"])
    assert ch.result == {"jobid": jobid, "tasks": [1, 2, 3]}
    (push,) = [e for e in ch.events if e.name == "job"]
    assert {"n2", "n3"} <= push.hosts
    assert [(t["task"], t["host"], t["state"]) for t in st.job(jobid).tasks["list"]] == \
        [(1, "n2", "PEND"), (2, "n3", "PEND"), (3, "n2", "PEND")]
    assert [r[0] for r in ch.rows] == ["jobs"]
    assert st.job(jobid).tasks["commands"] == ["hostname"]  # once per launch
    assert {t["launch"] for t in st.job(jobid).tasks["list"]} == {0}


def test_a_jobs_tasks_are_bounded() -> None:
    st, jobid = parallel_job()
    big = "x" * 200_000
    launch(st, jobid, ["n2"], command=big)
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2"], command=big)
    assert err.value.code == "INVALID" and "characters in all" in err.value.message
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2"] * 4096)
    assert err.value.code == "INVALID" and "more than 4096 tasks" in err.value.message
    assert len(st.job(jobid).tasks["list"]) == 1


def test_a_job_without_a_task_key_or_not_running_launches_nothing() -> None:
    st, jobid = parallel_job(key=False)
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2"])
    assert err.value.code == "DENIED" and "no task secret" in err.value.message
    st, jobid = parallel_job()
    st.control(jobid, "stop", T0 + 2)
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2"])
    assert err.value.code == "CONFLICT" and "USUSP" in err.value.message


def test_a_launch_onto_an_unavailable_host_is_refused_naming_it() -> None:
    st, jobid = parallel_job()
    st.heartbeat("n1", T0 + 10)
    st.heartbeat("n2", T0 + 10)
    st.expire_hosts(T0 + 10)
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2", "n3"])
    assert err.value.code == "CONFLICT" and err.value.data == {"unavailable": ["n3"]}
    assert launch(st, jobid, ["n2"]).result["tasks"] == [1]


def test_block_refuses_launches_until_unblock() -> None:
    st, jobid = parallel_job()
    block(st, jobid, True)
    with pytest.raises(RemoteError) as err:
        launch(st, jobid, ["n2"])
    assert err.value.code == "CONFLICT" and err.value.data == {"blocked": True}
    block(st, jobid, False)
    assert launch(st, jobid, ["n2"]).result["tasks"] == [1]


def test_task_reports_from_the_right_host_and_usage_added_to_the_job() -> None:
    st, jobid = parallel_job()
    launch(st, jobid, ["n2", "n3"])
    with pytest.raises(RemoteError) as err:  # n3's worker may not report n2's task
        st.notify("n3", {"jobid": jobid, "event": "task_start", "task": 1, "pid": 5}, T0 + 3)
    assert err.value.code == "DENIED"
    st.notify("n2", {"jobid": jobid, "event": "task_start", "task": 1, "pid": 5}, T0 + 3)
    st.notify("n2", {"jobid": jobid, "event": "task_finish", "task": 1, "exit_status": 0,
                     "usage": {"cputime": 1.5, "utime": 1.0, "stime": 0.5, "max_mem": 10.0}},
              T0 + 4)
    st.notify("n3", {"jobid": jobid, "event": "task_fail", "task": 2, "reason": "no cwd"}, T0 + 4)
    recs = st.job(jobid).tasks["list"]
    assert (recs[0]["state"], recs[0]["pid"], recs[0]["exit_status"]) == ("DONE", 5, 0)
    assert (recs[1]["state"], recs[1]["reason"]) == ("EXIT", "could not start: no cwd")
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0,
                     "usage": {"cputime": 2.0, "utime": 2.0, "stime": 0.0, "max_mem": 5.0}},
              T0 + 5)
    job = st.job(jobid)
    assert job.state == "DONE"
    assert job.usage == {"cputime": 3.5, "utime": 3.0, "stime": 0.5, "max_mem": 15.0}


def test_a_task_ending_after_its_job_still_adds_its_usage() -> None:
    st, jobid = parallel_job()
    launch(st, jobid, ["n2"])
    st.notify("n2", {"jobid": jobid, "event": "task_start", "task": 1, "pid": 5}, T0 + 3)
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 1,
                     "usage": {"cputime": 1.0}}, T0 + 4)
    st.notify("n2", {"jobid": jobid, "event": "task_finish", "task": 1, "exit_status": 143,
                     "usage": {"cputime": 0.25}}, T0 + 5)
    job = st.job(jobid)
    assert job.usage["cputime"] == 1.25 and job.tasks["list"][0]["state"] == "EXIT"


def test_the_live_usage_sums_the_first_task_and_every_task() -> None:
    """Issue 22: while a parallel job runs, its usage counts every task, not rank 0's alone
    (as the final figure does); the figure pushed is the sum."""
    st, jobid = parallel_job()
    assert st.set_jusage("n1", jobid, {"cputime": 1.0, "mem": 10.0}).events[0].data["usage"] == \
        {"cputime": 1.0, "mem": 10.0}  # no launched task yet: the first task's is the job's
    launch(st, jobid, ["n2", "n3"])
    for host, n in (("n2", 1), ("n3", 2)):
        st.notify(host, {"jobid": jobid, "event": "task_start", "task": n, "pid": 5}, T0 + 3)
    # a task's sample before the first task's next one (as on a just promoted primary): kept
    # on its record, summed once the first task's sample is known
    assert not st.set_jusage("n2", jobid, {"cputime": 2.0, "mem": 20.0, "nprocs": 1}, 1).events
    ch = st.set_jusage("n1", jobid, {"cputime": 1.5, "mem": 10.0, "nprocs": 2, "pids": [7]})
    want = {"cputime": 3.5, "mem": 30.0, "nprocs": 3, "pids": [7]}
    assert st.job(jobid).usage == ch.events[0].data["usage"] == want
    ch = st.set_jusage("n3", jobid, {"cputime": 0.5, "mem": 5.0, "nprocs": 1}, 2)
    assert ch.events[0].data["usage"]["cputime"] == 4.0 and st.job(jobid).usage["mem"] == 35.0
    with pytest.raises(RemoteError) as err:  # n3 may not report n2's task
        st.set_jusage("n3", jobid, {"cputime": 9.0}, 1)
    assert err.value.code == "DENIED"
    with pytest.raises(RemoteError) as err:
        st.set_jusage("n2", jobid, {"cputime": 9.0}, 7)
    assert err.value.code == "NOT_FOUND"
    # task 1 ends: its final figures replace its sample in the live sum; a late sample of it
    # changes nothing
    st.notify("n2", {"jobid": jobid, "event": "task_finish", "task": 1, "exit_status": 0,
                     "usage": {"cputime": 2.5, "max_mem": 21.0}}, T0 + 4)
    assert st.job(jobid).usage["cputime"] == 4.5
    assert not st.set_jusage("n2", jobid, {"cputime": 9.0}, 1).events
    assert st.job(jobid).usage["cputime"] == 4.5
    # the job ends: its final figures are the first task's and the ended tasks' (task 2 is
    # still running: it adds its own when it ends)
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0,
                     "usage": {"cputime": 2.0, "max_mem": 12.0}}, T0 + 5)
    job = st.job(jobid)
    assert job.usage == {"cputime": 4.5, "max_mem": 33.0}
    assert tasks.FIRST_USAGE not in job.tasks
    assert not st.set_jusage("n1", jobid, {"cputime": 9.0}).events  # overtaken by the end
    assert job.usage == {"cputime": 4.5, "max_mem": 33.0}


def test_a_task_host_lost_kills_the_job_naming_the_host() -> None:
    st, jobid = parallel_job()
    launch(st, jobid, ["n2", "n3"])
    for h, n in (("n2", 1), ("n3", 2)):
        st.notify(h, {"jobid": jobid, "event": "task_start", "task": n, "pid": 5}, T0 + 3)
    for h in ("n1", "n2"):
        st.heartbeat(h, T0 + 10)
    ch = st.expire_hosts(T0 + 10)
    job = st.job(jobid)
    assert job.signal == "kill" and job.state == "RUN"
    assert job.reason == "killed: host n3 of task(s) 2 became unavailable"
    assert any(e.name == "signal" for e in ch.events)
    assert job.tasks["list"][1]["state"] == "EXIT"
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 143,
                     "exit_reason": "killed"}, T0 + 11)
    assert st.job(jobid).state == "EXIT" and "n3" in (st.job(jobid).reason or "")


def test_requeue_forgets_the_tasks_and_the_key() -> None:
    st, jobid = parallel_job()
    launch(st, jobid, ["n2"])
    st.control(jobid, "requeue", T0 + 3)
    assert st.job(jobid).tasks is None
