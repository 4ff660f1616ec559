"""Job arrays in the controller state: one record until dispatch, elements with their own
state, the ``%limit``, control of the whole array and of one element, and reloading."""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson
import pytest
from test_ctl_state import (
    T0,
    code,
    consistent,
    new_state,
    rec,
    refused,
    with_hosts,
)
from xce_controller.jobs import Job, JobTable, job_from_row
from xce_controller.state import ClusterState

from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(60)


def submit_array(st: ClusterState, array: str, name: str = "arr") -> int:
    ch = st.submit({"command": "echo $XCE_ARRAY_INDEX", "user": "alice", "name": name,
                    "array": array}, T0)
    return int(ch.result["jobid"])


def one(alloc_host: str = "n1") -> list[dict[str, Any]]:
    return [{"host": alloc_host, "ntasks": 1}]


def finish(st: ClusterState, jobid: int, code_: int = 0) -> None:
    job = st.jobs[jobid]
    st.notify(job.alloc[0].host, {"jobid": jobid, "event": "finish", "exit_status": code_,
                                  "time": T0 + 5}, T0 + 5)


def test_submit_is_one_record_with_runs() -> None:
    st = new_state()
    ch = st.submit({"command": "x", "user": "alice", "name": "arr", "array": "1-1000:2%50"}, T0)
    assert ch.result["array"] == "1-1000:2%50" and ch.result["size"] == 500
    assert len(st.jobs) == 1 and [r[0] for r in ch.rows] == ["jobs"]
    a = st.jobs[ch.result["jobid"]].array
    assert a == {"spec": "1-1000:2%50", "limit": 50, "pending": [[1, 999, 2]], "left": 500,
                 "size": 500, "counts": {}, "held": False}
    assert "array" not in st.jobs[ch.result["jobid"]].spec()  # the record's, not the spec's


def test_bad_array_is_invalid_and_changes_nothing() -> None:
    st = new_state()
    err = refused(st, st.submit, {"command": "x", "user": "a", "array": "5-1"}, T0)
    assert str(err.code) == "INVALID" and "ends before it starts" in err.message
    assert st.next_jobid == 1


def test_dispatch_takes_lowest_indexes_as_element_records() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=4)
    arr = submit_array(st, "1-10:3")  # 1 4 7 10
    ch = st.dispatch(arr, one("n1"), False, [one("n2"), one("n1")])
    els = ch.result["elements"]
    assert [e["index"] for e in els] == [1, 4, 7]
    assert [e["jobid"] for e in els] == [arr + 1, arr + 2, arr + 3]
    for e in els:
        job = st.jobs[e["jobid"]]
        assert job.state == "RUN" and job.array == {"of": arr, "index": e["index"]}
        assert job._spec is st.jobs[arr]._spec  # shared, not copied
        assert job.name == "arr" and job.user == "alice"
    parent = st.jobs[arr]
    assert parent.state == "PEND" and parent.array is not None
    assert parent.array["left"] == 1 and parent.array["counts"] == {"RUN": 3}
    assert parent.array["pending"] == [[10, 10, 1]]
    assert st.hosts["n1"]["used_slots"] == 2 and st.hosts["n2"]["used_slots"] == 1
    parent_rows = [r for r in ch.rows if r[0] == "jobs" and r[1] == arr]
    assert len(parent_rows) == 1  # the array's record is written once per write
    st.dispatch(arr, one("n2"), False)
    assert parent.state == "RUN" and parent.array["left"] == 0
    consistent(st)


def test_limit_is_enforced_and_counts_follow_elements() -> None:
    st = with_hosts(new_state(), "n1", slots=8)
    arr = submit_array(st, "1-5%2")
    st.dispatch(arr, one(), False, [one()])
    err = refused(st, st.dispatch, arr, one(), False)
    assert str(err.code) == "CONFLICT" and "at most 2" in err.message
    first = st.jobs.elements[(arr, 1)]
    finish(st, first)
    assert st.jobs[arr].array["counts"] == {"RUN": 1, "DONE": 1}  # type: ignore[index]
    st.dispatch(arr, one(), False)  # a slot of the limit is free again
    assert st.jobs[arr].array["counts"] == {"RUN": 2, "DONE": 1}  # type: ignore[index]


def test_more_than_pending_and_host_overcommit_refused() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=2)
    arr = submit_array(st, "1-2")
    err = refused(st, st.dispatch, arr, one(), False, [one("n2"), one("n2")])
    assert "2 pending" in err.message
    arr3 = submit_array(st, "1-3")
    err = refused(st, st.dispatch, arr3, one(), False, [one(), one()])  # 3 tasks, 2 slots
    assert str(err.code) == "CONFLICT" and "2 free slots" in err.message
    plain = int(st.submit({"command": "x", "user": "a"}, T0).result["jobid"])
    err = refused(st, st.dispatch, plain, one(), False, [one()])
    assert str(err.code) == "INVALID" and "not an array" in err.message


def test_array_finishes_done_or_exit() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    arr = submit_array(st, "1-2")
    st.dispatch(arr, one(), False, [one()])
    finish(st, st.jobs.elements[(arr, 1)])
    assert st.jobs[arr].state == "RUN"
    finish(st, st.jobs.elements[(arr, 2)], 3)
    parent = st.jobs[arr]
    assert parent.state == "EXIT" and parent.end_time == T0 + 5
    arr2 = submit_array(st, "7")
    st.dispatch(arr2, one(), False)
    finish(st, st.jobs.elements[(arr2, 7)])
    assert st.jobs[arr2].state == "DONE"
    assert arr in st.jobs.due_finished(T0 + 100, 10)  # the cleaner finds finished arrays


def test_kill_one_pending_element_and_one_running() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    arr = submit_array(st, "1-4")
    st.dispatch(arr, one(), False)  # index 1 runs
    ch = st.control(arr, "kill", T0 + 1, index=3)
    killed = ch.result
    assert isinstance(killed, Job) and killed.state == "EXIT" and killed.reason == "killed"
    assert killed.array == {"of": arr, "index": 3}
    parent = st.jobs[arr]
    assert parent.array is not None and parent.array["pending"] == [[2, 2, 1], [4, 4, 1]]
    assert parent.array["counts"] == {"RUN": 1, "EXIT": 1} and parent.array["left"] == 2
    ch = st.control(arr, "kill", T0 + 1, index=1)
    assert [e.data["signal"] for e in ch.events if e.name == "signal"] == ["kill"]
    with pytest.raises(RemoteError) as err:
        st.control(arr, "kill", T0, index=99)
    assert code(err) == "NOT_FOUND"
    with pytest.raises(RemoteError) as err:
        st.control(arr, "resume", T0, index=2)
    assert code(err) == "CONFLICT"


def test_whole_array_stop_resume_kill() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    arr = submit_array(st, "1-100000")
    st.dispatch(arr, one(), False, [one()])
    ch = st.control(arr, "stop", T0)
    parent = st.jobs[arr]
    assert parent.state == "PSUSP" and parent.array is not None and parent.array["held"]
    assert sorted(st.jobs[j].state for j in st.jobs.by_array[arr]) == ["USUSP", "USUSP"]
    assert len([e for e in ch.events if e.name == "signal"]) == 2
    err = refused(st, st.dispatch, arr, one(), False)
    assert "not PEND" in err.message
    st.control(arr, "resume", T0)
    assert parent.state == "PEND" and not parent.array["held"]
    assert sorted(st.jobs[j].state for j in st.jobs.by_array[arr]) == ["RUN", "RUN"]
    st.control(arr, "kill", T0 + 2)
    assert parent.array["left"] == 0 and parent.array["counts"]["EXIT"] == 99998
    assert parent.state == "RUN"  # two elements still run until their workers report
    for j in list(st.jobs.by_array[arr]):
        st.notify("n1", {"jobid": j, "event": "finish", "exit_status": 137,
                         "exit_reason": "killed"}, T0 + 3)
    assert parent.state == "EXIT" and parent.array["counts"] == {"EXIT": 100000}
    err = refused(st, st.control, arr, "kill", T0 + 4)
    assert "none of its elements" in err.message


def test_requeue_element_counts_against_limit() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    arr = submit_array(st, "1-2%1")
    st.dispatch(arr, one(), False)
    e1 = st.jobs.elements[(arr, 1)]
    finish(st, e1, 1)
    st.control(arr, "requeue", T0, index=1)
    assert st.jobs[e1].state == "PEND" and st.jobs[e1].attempt == 1
    st.dispatch(arr, one(), False)  # index 2
    err = refused(st, st.dispatch, e1, one(), False)
    assert "at most 1" in err.message


def test_jobctrl_index_on_plain_job_is_invalid() -> None:
    st = new_state()
    plain = int(st.submit({"command": "x", "user": "a"}, T0).result["jobid"])
    err = refused(st, lambda: st.control(plain, "kill", T0, index=1))
    assert str(err.code) == "INVALID"


def test_records_reload_from_rows() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    arr = submit_array(st, "1-9:2%3")
    st.dispatch(arr, one(), False)
    loaded = [job_from_row(j._spec, j.row()) for j in sorted(st.jobs.values(), key=lambda j: j.jobid)]
    table = JobTable.build(loaded)
    assert table.elements == {(arr, 1): arr + 1}
    assert list(table.by_array[arr]) == [arr + 1]
    assert rec(table[arr]) == rec(st.jobs[arr])
    old = orjson.loads(st.jobs[arr].row())[:-3]  # a row written before arrays, dependencies, tasks
    loaded_old = job_from_row(b"{}", orjson.dumps(old))
    assert loaded_old.array is None and loaded_old.waiting is None


def test_hundred_thousand_pending_are_cheap() -> None:
    """One record, whatever the size (the benchmark measures RSS; this bounds the record)."""
    st = new_state()
    started = time.perf_counter()
    arr = submit_array(st, "1-100000")
    assert time.perf_counter() - started < 5  # a hang guard, not a timing
    job = st.jobs[arr]
    assert len(job.json()) < 1024 and sys.getsizeof(job.array) < 1024
    consistent(st)


