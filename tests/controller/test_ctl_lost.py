"""Lost hosts in the pure state model: running jobs turn UNKWN when their host goes unavail,
return to the state they had when their worker reports them alive (or starts them), end
when it reports their end, and after ``lost_job_timeout`` are marked EXIT or requeued --
from the lost-job buckets, never a scan of every job."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_ctl_state import (  # noqa: F401  (indexes_agree: the autouse index check)
    T0,
    events,
    indexes_agree,
    new_state,
    refused,
    rows_of,
    running,
    submit,
    with_hosts,
)
from xce_controller.jobs import JobTable, job_from_row
from xce_controller.state import ClusterState

pytestmark = pytest.mark.timeout(30)


def lose(st: ClusterState, at: float = T0 + 31) -> Any:
    """n1 stops beating (n2 keeps on); expire at ``at``."""
    st.touch("n2", at)
    return st.expire_hosts(at)


def test_jobs_of_a_lost_host_turn_unkwn_keeping_their_slots() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=4)
    run, stopped, other = running(st), running(st), running(st, "n2")
    st.control(stopped, "stop", T0)
    both = submit(st, 2)  # runs on its first host, n2; n1 is its second
    st.dispatch(both, [{"host": "n2", "ntasks": 1}, {"host": "n1", "ntasks": 1}], False)
    ch = lose(st)
    assert [r[1] for r in rows_of(ch, "jobs")] == [run, stopped]
    assert (st.jobs[run].state, st.jobs[run].lost_from, st.jobs[run].lost_at) == ("UNKWN", "RUN", T0 + 31)
    assert (st.jobs[stopped].state, st.jobs[stopped].lost_from) == ("UNKWN", "USUSP")
    assert st.jobs[other].state == "RUN" and st.jobs[both].state == "RUN"
    assert st.hosts["n1"]["used_slots"] == 3  # UNKWN jobs hold their slots
    assert {e.data.jobid for e in events(ch, "job")} == {run, stopped}
    assert all(e.hosts == frozenset({"n1"}) for e in events(ch, "job"))
    assert list(st.jobs.by_state["UNKWN"]) == [run, stopped]
    assert lose(st, T0 + 40).rows == []  # already unavail: nothing again


def test_an_alive_report_restores_the_state_it_had() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=3)
    run, stopped = running(st), running(st)
    st.control(stopped, "stop", T0)
    lose(st)
    ch = st.notify("n1", {"jobid": run, "event": "alive", "attempt": 0}, T0 + 40)
    job = st.jobs[run]
    assert (job.state, job.lost_at, job.lost_from) == ("RUN", None, None)
    assert rows_of(ch, "jobs") and events(ch, "job")
    st.notify("n1", {"jobid": stopped, "event": "alive"}, T0 + 40)
    assert st.jobs[stopped].state == "USUSP"
    again = st.notify("n1", {"jobid": run, "event": "alive"}, T0 + 41)  # repeated: no change
    assert again.rows == [] and again.events == [] and again.result is job
    # Only its own worker may say so, and only about the current attempt.
    st.heartbeat("n1", T0 + 100)
    other = running(st)
    lose(st, T0 + 200)
    assert refused(st, st.notify, "n2", {"jobid": other, "event": "alive"}, T0).code == "DENIED"
    assert refused(st, st.notify, "n1", {"jobid": other, "event": "alive", "attempt": 3},
                   T0).code == "CONFLICT"
    # A job its worker had not started yet: its start report brings it back too.
    st.notify("n1", {"jobid": other, "event": "start", "pid": 7, "time": T0 + 201}, T0 + 202)
    assert (st.jobs[other].state, st.jobs[other].pid, st.jobs[other].start_time) == ("RUN", 7, T0 + 201)
    # Found: its timer is stale; the two lost again at T0 + 200 are still lost.
    assert sorted(j for j, _ in st.expire_lost(T0 + 10_000).result) == [run, stopped]


def test_an_unkwn_job_that_ended_meanwhile_ends() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    jobid = running(st)
    lose(st)
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0, "time": T0 + 20}, T0 + 60)
    job = st.jobs[jobid]
    assert (job.state, job.end_time, job.lost_at, job.lost_from) == ("DONE", T0 + 20, None, None)
    assert st.hosts["n1"]["used_slots"] == 0


def test_users_may_kill_or_requeue_an_unkwn_job_not_stop_it() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    a, b = running(st), running(st)
    lose(st)
    assert refused(st, st.control, a, "stop", T0).code == "CONFLICT"
    assert refused(st, st.control, a, "resume", T0).code == "CONFLICT"
    ch = st.control(a, "kill", T0 + 40)
    assert events(ch, "signal")[0].data["signal"] == "kill" and st.jobs[a].state == "UNKWN"
    st.control(b, "requeue", T0 + 40)
    assert (st.jobs[b].state, st.jobs[b].attempt, st.jobs[b].lost_at) == ("PEND", 1, None)


@pytest.mark.parametrize("action", ["exit", "requeue"])
def test_the_lost_job_timeout_ends_or_requeues(action: str) -> None:
    st = with_hosts(new_state(lost_job_timeout=100.0, lost_job_action=action), "n1", "n2")
    jobid = running(st)
    lose(st)  # UNKWN at T0 + 31
    assert st.expire_lost(T0 + 131).rows == []  # exactly the timeout: not yet
    ch = st.expire_lost(T0 + 131.5)
    job = st.jobs[jobid]
    assert ch.result == [(jobid, "requeued" if action == "requeue" else "exit")]
    assert st.hosts["n1"]["used_slots"] == 0 and rows_of(ch, "hosts")
    (sig,) = events(ch, "signal")  # a worker that comes back kills what it still runs
    assert sig.data["signal"] == "kill" and sig.hosts == frozenset({"n1"})
    if action == "exit":
        assert (job.state, job.end_time, job.signal) == ("EXIT", T0 + 131.5, None)
        assert job.reason == "host n1 lost: unavail for 100 s"
    else:
        assert (job.state, job.attempt, job.alloc, job.signal) == ("PEND", 1, (), None)
        assert job.reason == "requeued: host n1 lost: unavail for 100 s"
    assert job.lost_at is None and job.lost_from is None
    assert st.expire_lost(T0 + 10_000).rows == []


def test_the_timer_looks_only_at_what_is_due() -> None:
    st = with_hosts(new_state(lost_job_timeout=80.0), "n1", "n2")
    first = running(st)
    second = running(st, "n2")
    lose(st)
    st.touch("n2", T0 + 31)  # n2 falls silent later
    st.expire_hosts(T0 + 62)
    assert st.jobs[second].lost_at == T0 + 62
    assert [j for j, _ in st.expire_lost(T0 + 112).result] == [first]
    assert len(st.lost) == 1  # the second job's entry only
    assert [j for j, _ in st.expire_lost(T0 + 143).result] == [second]
    off = with_hosts(new_state(lost_job_timeout=0.0), "n1", "n2")  # 0: wait forever
    waiting = running(off)
    lose(off)
    assert off.expire_lost(T0 + 1e9).rows == [] and off.jobs[waiting].state == "UNKWN"
    # A reconfiguration turns the timer on: the job that was waiting is due.
    off.reconfigure(replace(off.conf, lost_job_timeout=50.0))
    assert off.expire_lost(T0 + 82).result == [(waiting, "exit")]


def test_a_new_primary_arms_the_timers_of_stored_unkwn_jobs() -> None:
    st = with_hosts(new_state(lost_job_timeout=100.0), "n1", "n2")
    jobid = running(st)
    lose(st)
    job = st.jobs[jobid]
    stored = [job_from_row(job._spec, job.row())]  # as a new primary loads it
    fresh = with_hosts(new_state(lost_job_timeout=100.0), "n1", "n2")
    fresh.take_jobs(JobTable.build(stored))
    assert fresh.jobs[jobid].state == "UNKWN"
    assert [j for j, _ in fresh.expire_lost(T0 + 132).result] == [jobid]


def test_lost_fields_survive_the_store_row() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    jobid = running(st)
    st.control(jobid, "stop", T0)
    lose(st)
    job = st.jobs[jobid]
    back = job_from_row(job._spec, job.row())
    assert (back.state, back.lost_at, back.lost_from) == ("UNKWN", T0 + 31, "USUSP")
