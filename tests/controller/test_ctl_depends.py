"""Job dependencies in the controller state: compiled at submission (names resolved to ids),
re-evaluated only when a job they name changes, the reason says which part holds them up,
never-satisfiable ones say so (or end EXIT with kill_unsatisfiable), chains and arrays."""

from __future__ import annotations

from typing import Any

import pytest
from test_ctl_arrays import finish, one, submit_array
from test_ctl_state import T0, consistent, new_state, refused, with_hosts
from xce_controller.jobs import JobTable, job_from_row
from xce_controller.state import ClusterState

pytestmark = pytest.mark.timeout(60)


def sub(st: ClusterState, depend: str | None = None, name: str = "", user: str = "alice") -> int:
    args: dict[str, Any] = {"command": "true", "user": user, "name": name}
    if depend is not None:
        args["depend"] = depend
    return int(st.submit(args, T0).result["jobid"])


def run(st: ClusterState, jobid: int, host: str = "n1") -> None:
    st.dispatch(jobid, one(host), False)


def test_waits_until_done_and_only_named_jobs_reevaluate() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    a = sub(st, name="prep")
    b = sub(st, 'done("prep")')
    job_b = st.jobs[b]
    assert job_b.spec()["depend"] == f"done({a})"  # the name resolved to the id, stored so
    assert job_b.waiting == f"dependency not satisfied: done({a})"
    err = refused(st, st.dispatch, b, one(), False)
    assert "waits: dependency not satisfied" in err.message
    assert st.deps.watchers == {a: {b}}
    other = sub(st)
    run(st, other)
    assert job_b.waiting is not None  # an unrelated job changed: nothing looked at b
    run(st, a)
    ch = st.notify("n1", {"jobid": a, "event": "finish", "exit_status": 0}, T0 + 2)
    assert job_b.waiting is None and len(st.deps) == 0 and not st.deps.watchers
    assert any(r[1] == b for r in ch.rows if r[0] == "jobs")  # written and pushed in a's write
    run(st, b)
    consistent(st)


def test_never_satisfiable_says_so_or_is_killed() -> None:
    for kill in (False, True):
        st = with_hosts(new_state(kill_unsatisfiable=kill), "n1", slots=4)
        a = sub(st)
        b = sub(st, f"done({a}) || started({a})")
        c = sub(st, f"afterok:{b}")  # a chain: c on b on a
        run(st, a)
        assert st.jobs[b].waiting is None  # started(a) holds
        run(st, b)
        finish(st, b, 1)
        job_c = st.jobs[c]
        if kill:
            assert job_c.state == "EXIT" and job_c.reason == f"dependency never satisfied: done({b})"
        else:
            assert job_c.state == "PEND" and job_c.waiting == f"dependency never satisfied: done({b})"
        assert len(st.deps) == 0


def test_exit_codes_not_and_parentheses() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    a, b = sub(st), sub(st)
    c = sub(st, f"exit({a}, >2) && (ended({b}) || !started({b}))")
    assert st.jobs[c].waiting == f"dependency not satisfied: exit({a}, >2)"
    run(st, a)
    finish(st, a, 3)
    assert st.jobs[c].waiting is None  # b has not started: !started(b) holds
    d = sub(st, f"exit({a}, ==1)")
    assert st.jobs[d].waiting == f"dependency never satisfied: exit({a}, ==1)"


def test_arrays_and_elements() -> None:
    st = with_hosts(new_state(), "n1", slots=8)
    arr = submit_array(st, "1-3")
    on_two = sub(st, f"ended({arr}[2])")
    on_all = sub(st, f"done({arr})")
    st.dispatch(arr, one(), False, [one(), one()])
    e1, e2, e3 = (st.jobs.elements[(arr, i)] for i in (1, 2, 3))
    finish(st, e2)
    assert st.jobs[on_two].waiting is None
    assert st.jobs[on_all].waiting == f"dependency not satisfied: done({arr})"
    finish(st, e1)
    finish(st, e3)
    assert st.jobs[arr].state == "DONE" and st.jobs[on_all].waiting is None
    late = sub(st, f"done({arr}[3])")
    assert st.jobs[late].waiting is None  # already holds at submission


def test_bad_dependencies_are_invalid_and_change_nothing() -> None:
    st = new_state()
    arr = submit_array(st, "1-3")
    sub(st, name="mine", user="bob")
    for depend, why in [("done(99)", "no such job: 99"), ("done(x", "expected"),
                        (f"done({arr}[7])", "has no index 7"), ('done("mine")', "no job named"),
                        (f"done({arr + 1}[1])", "is not an array")]:
        err = refused(st, st.submit, {"command": "true", "user": "alice", "depend": depend}, T0)
        assert str(err.code) == "INVALID" and why in err.message, (depend, err.message)


def test_waiting_jobs_are_watched_again_after_a_load() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    a = sub(st)
    b = sub(st, f"done({a})")
    rows = [job_from_row(j._spec, j.row()) for j in sorted(st.jobs.values(), key=lambda j: j.jobid)]
    again = with_hosts(new_state(), "n1", slots=4)
    again.take_jobs(JobTable.build(rows))
    assert again.deps.watchers == {a: {b}}
    run(again, a)
    finish(again, a)
    assert again.jobs[b].waiting is None


def test_an_unsatisfiable_array_ends_with_its_pending_indexes() -> None:
    st = with_hosts(new_state(kill_unsatisfiable=True), "n1", slots=4)
    a = sub(st)
    arr = int(st.submit({"command": "true", "user": "alice", "array": "1-50", "depend": f"exit({a})"},
                        T0).result["jobid"])
    assert st.jobs.waiting == {arr}
    run(st, a)
    finish(st, a)
    parent = st.jobs[arr]
    assert parent.state == "EXIT" and parent.array is not None
    assert parent.array["left"] == 0 and parent.array["counts"] == {"EXIT": 50}
    assert st.jobs.waiting == set()
