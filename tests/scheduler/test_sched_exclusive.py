"""Exclusive jobs (``-x``) in the picker: a host an exclusive job runs on or is proposed to
gets no other job, an exclusive job goes only to a host with nothing running or proposed,
and the pend reasons say which of the two keeps a job waiting."""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job
from test_sched_picker import dispatches, make, reasons
from xce_scheduler import reasons as R

pytestmark = pytest.mark.timeout(60)


def xjob(jobid: int, **kw: Any) -> dict[str, Any]:
    return {**job(jobid, **kw), "exclusive": True}


def running(rec: dict[str, Any], hname: str) -> dict[str, Any]:
    return {**rec, "state": "RUN", "alloc": [{"host": hname, "ntasks": rec["ntasks"]}]}


def test_an_exclusive_job_takes_an_empty_host_and_no_other_job_joins_it() -> None:
    picker, sent = make([host("a", slots=4, used=1), host("b", slots=4)],
                        [xjob(1), job(2), job(3)])
    picker.cycle()
    # 1 cannot go to a (something runs there) and takes b whole; 2 and 3 share a.
    assert dispatches(sent) == {1: [{"host": "b", "ntasks": 1}], 2: [{"host": "a", "ntasks": 1}],
                                3: [{"host": "a", "ntasks": 1}]}


def test_a_host_running_an_exclusive_job_gets_nothing_else() -> None:
    picker, sent = make([host("a", slots=4, used=1)], [running(xjob(1), "a"), job(2), xjob(3)])
    picker.cycle()
    assert dispatches(sent) == {}
    assert reasons(sent) == {"2": R.HOSTS_EXCLUSIVE, "3": R.EXCLUSIVE_WAIT}
    # It ends: the host is empty again, and the earlier job goes first.
    sent.clear()
    picker.view.apply("job", {**running(xjob(1), "a"), "state": "DONE"})
    picker.view.apply("host", host("a", slots=4, used=0))
    picker.cycle()
    assert dispatches(sent) == {2: [{"host": "a", "ntasks": 1}]}
    assert "3" not in reasons(sent)  # still waiting for an empty host: its reason stands


def test_an_exclusive_job_in_flight_blocks_its_host_for_the_next_cycle() -> None:
    picker, sent = make([host("a", slots=4)], [xjob(1)])
    picker.cycle()
    assert dispatches(sent) == {1: [{"host": "a", "ntasks": 1}]}
    sent.clear()
    picker.view.apply("job", job(2))  # arrives before the controller answered
    picker.cycle()
    assert dispatches(sent) == {} and reasons(sent) == {"2": R.HOSTS_EXCLUSIVE}


def test_exclusive_and_shared_jobs_of_one_requirement_are_shapes_of_their_own() -> None:
    picker, sent = make([host("a", slots=2, used=1), host("b", slots=2, used=1)],
                        [xjob(1), job(2)])
    picker.cycle()
    assert dispatches(sent) == {2: [{"host": "a", "ntasks": 1}]}  # 1's misfit did not stop 2
    assert reasons(sent) == {"1": R.EXCLUSIVE_WAIT}
