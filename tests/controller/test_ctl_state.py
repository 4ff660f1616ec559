"""The controller's state transitions as pure functions: every branch, every refusal, every row.

No I/O: a :class:`ClusterState` in memory, transitions called directly, their ``Changes``
(rows to commit, events to push, result) checked. A refused transition must leave the state
as it was, and after every test the job table's indexes agree with its jobs.
``benchmarks/bench_mutation_state.py`` measures how many mutants of ``state.py`` these tests
kill.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from ctl_testlib import synced_view
from xce_controller.jobs import Job, JobTable, make_alloc
from xce_controller.settings import ClusterConf
from xce_controller.state import Changes, ClusterState, queue_record
from xce_controller.subscribe import EVERYTHING, Subscription, default_for

from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(30)

QUEUES = ({"name": "normal", "priority": 30}, {"name": "night", "priority": 20, "open": True},
          {"name": "high", "priority": 43, "description": "first"})
T0 = 1000.0


MADE: list[ClusterState] = []


def new_state(**conf: Any) -> ClusterState:
    st = ClusterState(ClusterConf(queues=QUEUES, host_timeout=30.0, **conf))
    MADE.append(st)
    return st


@pytest.fixture(autouse=True)
def indexes_agree() -> Any:
    """After each test, every state it made has indexes that agree with its jobs."""
    MADE.clear()
    yield
    for st in MADE:
        consistent(st)


def code(exc: pytest.ExceptionInfo[RemoteError]) -> str:
    return str(exc.value.code)


def rec(job: Job) -> dict[str, Any]:
    """A job's record as members see it."""
    out: dict[str, Any] = orjson.loads(job.json())
    return out


def setj(st: ClusterState, jobid: int, **fields: Any) -> None:
    """Change a job's fields as a transition would (its indexes follow)."""
    job = st.jobs[jobid]
    keys = st.jobs.keys(job)
    for k, v in fields.items():
        setattr(job, k, v)
    st.jobs.reindex(job, keys)


def snapshot(st: ClusterState) -> Any:
    """Everything a transition may change, comparable."""
    tbl = st.jobs
    return (orjson.dumps([rec(j) for j in tbl.values()]), orjson.dumps(st.hosts),
            orjson.dumps(st.queues), orjson.dumps(st.members), repr(sorted(tbl.active_on.items())),
            {s: list(ids) for s, ids in tbl.by_state.items()}, list(tbl.reasons), st.next_jobid)


def refused(st: ClusterState, fn: Any, *args: Any) -> RemoteError:
    """Call a transition that must refuse, and check that it changed nothing."""
    before = snapshot(st)
    with pytest.raises(RemoteError) as err:
        fn(*args)
    assert snapshot(st) == before, "a refused transition changed the state"
    return err.value


def consistent(st: ClusterState) -> None:
    """The table's indexes say what its jobs say (rebuilt from scratch, they are the same)."""
    tbl = st.jobs
    again = JobTable.build(sorted(tbl.values(), key=lambda j: j.jobid))
    assert list(tbl.all) == list(again.all)
    for name in ("by_state", "by_user", "by_queue", "by_name", "by_host"):
        mine = {k: list(v) for k, v in getattr(tbl, name).items() if v}
        assert mine == {k: list(v) for k, v in getattr(again, name).items() if v}, name
    assert tbl.active_on == again.active_on and list(tbl.reasons) == list(again.reasons)
    assert tbl.counts == again.counts


def rows_of(ch: Changes, table: str) -> list[Any]:
    return [r for r in ch.rows if r[0] == table]


def events(ch: Changes, name: str) -> list[Any]:
    return [e for e in ch.events if e.name == name]


def with_hosts(st: ClusterState, *names: str, slots: int = 2) -> ClusterState:
    for n in names:
        st.join_worker({"hname": n, "max_slots": slots}, T0)
    return st


def submit(st: ClusterState, ntasks: int = 1, queue: str | None = None, user: str = "alice") -> int:
    args: dict[str, Any] = {"command": "true", "user": user, "ntasks": ntasks}
    if queue:
        args["queue"] = queue
    return int(st.submit(args, T0).result["jobid"])


def running(st: ClusterState, host: str = "n1", ntasks: int = 1) -> int:
    jobid = submit(st, ntasks)
    st.dispatch(jobid, [{"host": host, "ntasks": ntasks}], False)
    return jobid


# -- records and views ---------------------------------------------------------------------


def test_queue_record_defaults_and_status() -> None:
    q = queue_record({"name": "q"})
    assert q == {"name": "q", "priority": 30, "description": "", "open": True, "active": True,
                 "rev": 0, "status": "Open:Active"}
    q = queue_record({"name": "q", "priority": "7", "open": False, "active": False, "description": 5})
    assert (q["priority"], q["description"], q["status"]) == (7, "5", "Closed:Inact")
    assert queue_record({"name": "q", "open": False})["status"] == "Closed:Active"
    assert queue_record({"name": "q", "active": False})["status"] == "Open:Inact"


def test_views_queues_conf_and_lookups() -> None:
    st = new_state(name="c1", admins=frozenset({"root"}), default_queue="night",
                   host_groups={"g": ["n1"]}, user_groups={"u": ["a"]},
                   resources=[{"name": "gpu", "type": "bool"}])
    assert [q["name"] for q in st.sorted_queues()] == ["high", "normal", "night"]
    st.queues["aaa"] = queue_record({"name": "aaa", "priority": 30})
    assert [q["name"] for q in st.sorted_queues()] == ["high", "aaa", "normal", "night"]
    conf = st.clusterconf()
    assert conf == {"name": "c1", "resources": [{"name": "gpu", "type": "bool"}], "admins": ["root"],
                    "default_queue": "night", "host_timeout": 30.0, "host_groups": {"g": ["n1"]},
                    "user_groups": {"u": ["a"]}, "queues": ["high", "aaa", "normal", "night"]}
    for fn, arg, what in ((st.job, 9, "job"), (st.host, "x", "host"), (st.queue, "x", "queue")):
        with pytest.raises(RemoteError) as err:
            fn(arg)
        assert code(err) == "NOT_FOUND" and err.value.data == {"what": what, "name": arg}


def test_the_snapshot_sync_for_members_and_for_a_worker() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    on_n1, on_n2 = running(st, "n1"), running(st, "n2")
    pending = submit(st)
    st.add_member("scheduler@x", "scheduler", T0)
    everything = Subscription(tuple(EVERYTHING.items()))
    full = synced_view(st, everything)
    assert full.get("cluster", "cluster") == {**st.clusterconf(), "rev": 0}
    assert list(full.records("hosts")) == ["n1", "n2"]
    assert list(full.records("jobs")) == [on_n1, on_n2, pending]
    first = full.get("jobs", on_n1)
    assert first is not None and first["command"] == "true"
    assert first["alloc"] == [{"host": "n1", "ntasks": 1}]
    assert list(full.records("members")) == ["scheduler@x"]
    assert list(full.records("queues").values()) == st.sorted_queues()
    mine = synced_view(st, default_for("worker", "n1"))
    assert list(mine.records("hosts")) == ["n1"]
    assert list(mine.records("jobs")) == [on_n1] and "members" not in mine.kinds
    st.notify("n1", {"jobid": on_n1, "event": "finish", "exit_status": 0}, T0)
    assert synced_view(st, default_for("worker", "n1")).count("jobs") == 0
    assert synced_view(st, default_for("worker", "ghost")).count("hosts") == 0


# -- members and hosts ---------------------------------------------------------------------


def test_members_join_leave_and_are_seen() -> None:
    st = new_state()
    ch = st.add_member("probe@h", "probe", T0, {"colour": "blue"}, {})
    assert st.members["probe@h"] == {"identity": "probe@h", "role": "probe", "joined_at": T0,
                                     "last_seen": T0, "pushes": "none", "subscribe": {},
                                     "attrs": {"colour": "blue"}}
    assert st.roles == {"probe": 1} and st.members_from("", 10) == (["probe@h"], None)
    (ev,) = ch.events
    assert (ev.name, ev.data) == ("member", {"identity": "probe@h", "role": "probe", "joined": True})
    assert not ch.rows
    st.add_member("worker@n1", "worker", T0, None, {"jobs": "host"})
    assert "attrs" not in st.members["worker@n1"] and st.members["worker@n1"]["pushes"] == "all"
    assert st.members_from("", 1) == (["probe@h"], "worker@n1")
    assert st.members_from("q", 5) == (["worker@n1"], None)
    st.add_member("worker@n1", "worker", T0 + 1, None, {})  # a re-join: counted once
    assert st.roles == {"probe": 1, "worker": 1} and len(st.member_ids) == 2
    st.member_seen("probe@h", T0 + 5)
    assert st.members["probe@h"]["last_seen"] == T0 + 5
    st.member_seen("nobody@h", T0 + 5)  # unknown: ignored
    assert "nobody@h" not in st.members
    ch = st.remove_member("probe@h")
    assert "probe@h" not in st.members
    assert ch.events[0].name == "member"
    assert ch.events[0].data == {"identity": "probe@h", "role": "probe", "joined": False}
    assert st.remove_member("probe@h").events == []
    assert st.roles == {"worker": 1} and st.member_ids == ["worker@n1"]


def test_join_worker_creates_then_refreshes_its_host() -> None:
    st = new_state()
    ch = st.join_worker({"hname": "n1", "ncpus": 4}, T0)
    host = st.hosts["n1"]
    assert host == {"name": "n1", "available": True, "closed": False, "comment": "", "max_slots": 4,
                    "used_slots": 0, "attrs": {"hname": "n1", "ncpus": 4}, "resvals": {},
                    "joined_at": T0, "rev": 0, "state": "ok"}
    assert rows_of(ch, "hosts") == [("hosts", "n1", host)] and st.last_seen["n1"] == T0
    (ev,) = ch.events
    assert ev.name == "host" and ev.hosts == frozenset({"n1"}) and ev.data is host
    host["available"], host["used_slots"] = False, 1
    st.join_worker({"hname": "n1", "max_slots": 8}, T0 + 1)
    assert host["attrs"] == {"hname": "n1", "max_slots": 8}
    assert (host["available"], host["max_slots"], host["used_slots"], host["joined_at"]) == (True, 8, 1, T0 + 1)
    assert host["state"] == "ok" and st.last_seen["n1"] == T0 + 1
    assert st.join_worker({"hname": "n2"}, T0).result is None and st.hosts["n2"]["max_slots"] == 1
    st.join_worker({"hname": "n3", "ncpus": "4"}, T0)  # not an int: the default 1 slot
    assert st.hosts["n3"]["max_slots"] == 1
    for bad in (0, -1, True, "2", 2.0):
        err = refused(st, st.join_worker, {"hname": "n4", "max_slots": bad}, T0)
        assert err.code == "INVALID" and "n4" not in st.hosts
        assert err.message == "join: attrs 'max_slots'/'ncpus' must be int >= 1"


def test_heartbeat_brings_an_unavailable_host_back() -> None:
    st = with_hosts(new_state(), "n1")
    assert st.heartbeat("n1", T0 + 1).rows == [] and st.last_seen["n1"] == T0 + 1
    st.hosts["n1"]["available"] = False
    st.hosts["n1"]["state"] = "unavail"
    ch = st.heartbeat("n1", T0 + 2)
    assert st.hosts["n1"]["available"] and st.hosts["n1"]["state"] == "ok"
    assert rows_of(ch, "hosts") == [("hosts", "n1", st.hosts["n1"])] and events(ch, "host")
    assert st.heartbeat("ghost", T0).rows == [] and st.last_seen["ghost"] == T0


def test_expire_hosts_after_the_timeout_only() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    st.touch("n2", T0 + 10)
    assert st.expire_hosts(T0 + 30).rows == []  # exactly host_timeout: not yet
    ch = st.expire_hosts(T0 + 30.5)
    assert [r[1] for r in rows_of(ch, "hosts")] == ["n1"]
    assert st.hosts["n1"]["available"] is False and st.hosts["n1"]["state"] == "unavail"
    assert st.hosts["n2"]["available"]
    assert st.expire_hosts(T0 + 31).rows == []  # already unavail: no second row
    st.hosts["n3"] = {**st.hosts["n2"], "name": "n3"}  # never seen (never filed): not expired
    assert [r[1] for r in st.expire_hosts(T0 + 100).rows] == ["n2"]
    assert st.expire_hosts(T0 + 100).rows == []
    # Only the hosts filed in buckets up to the limit's are looked at, and a host that beat
    # since is filed again, never expired from its old entry.
    st.heartbeat("n1", T0 + 200)
    st.heartbeat("n2", T0 + 200)
    st.heartbeat("n2", T0 + 240)
    assert [r[1] for r in st.expire_hosts(T0 + 231).rows] == ["n1"]
    assert st.expire_hosts(T0 + 260).rows == []
    assert [r[1] for r in st.expire_hosts(T0 + 271).rows] == ["n2"]
    assert st.expire_hosts(T0 + 10_000).rows == []


def test_expiry_looks_only_at_due_hosts() -> None:
    st = with_hosts(new_state(), *(f"n{i}" for i in range(100)))
    for i in range(99):
        st.heartbeat(f"n{i}", T0 + 25)  # all but n99 beat again
    assert len(st.seen) == 199  # stale entries of n0..n98, bounded by their bucket changes
    assert [r[1] for r in st.expire_hosts(T0 + 31).rows] == ["n99"]
    assert len(st.seen) == 99  # looked at (and dropped) what was due, kept the rest


def test_a_storm_of_expiries_is_taken_in_bounded_steps() -> None:
    # Thousands of hosts due at once (a join storm delayed their heartbeats): each call looks
    # at most ``most`` of them and says whether more may be due; the controller's expiry loop
    # takes one step per loop pass.
    st = with_hosts(new_state(), *(f"n{i}" for i in range(250)))
    steps = []
    while True:
        ch = st.expire_hosts(T0 + 31, most=100)
        steps.append(len(rows_of(ch, "hosts")))
        if not st.expiry_more:
            break
    assert steps == [100, 100, 50] and not any(h["available"] for h in st.hosts.values())


def test_closing_a_host_and_resource_values() -> None:
    st = with_hosts(new_state(), "n1")
    ch = st.host_control("n1", "close", "disk")
    assert st.hosts["n1"]["closed"] and st.hosts["n1"]["comment"] == "disk"
    assert st.hosts["n1"]["state"] == "closed" and ch.result is st.hosts["n1"] and rows_of(ch, "hosts")
    st.host_control("n1", "open", "")
    assert not st.hosts["n1"]["closed"] and st.hosts["n1"]["state"] == "ok"
    assert refused(st, st.host_control, "x", "close", "").code == "NOT_FOUND"
    ch = st.set_resvals("n1", {"r1m": 0.5})
    assert st.hosts["n1"]["resvals"] == {"r1m": 0.5} and ch.rows == [] and ch.result == {"host": "n1"}
    assert ch.events[0].data == {"host": "n1", "values": {"r1m": 0.5}} and ch.events[0].name == "resvals"
    assert refused(st, st.set_resvals, "x", {}).code == "NOT_FOUND"


# -- jobs: submit, control -------------------------------------------------------------------


def test_submit_takes_the_default_queue_and_counts_ids() -> None:
    st = new_state()
    ch = st.submit({"command": "sleep 1", "user": "bob"}, T0)
    job = st.jobs[1]
    assert ch.result == {"jobid": 1, "queue": "normal", "state": "PEND"}
    assert rows_of(ch, "jobs") == [("jobs", 1, job)] and events(ch, "job")[0].data is job
    assert rec(job) == {"jobid": 1, "name": "", "user": "bob", "project": "default", "queue": "normal",
                        "command": "sleep 1", "cwd": "", "env": {}, "resreq": "", "ntasks": 1,
                        "state": "PEND", "submit_time": T0, "start_time": None, "end_time": None,
                        "alloc": [], "pid": None, "exit_status": None, "pend_reason": None,
                        "reason": None, "signal": None, "attempt": 0, "forced": False, "usage": {},
                        "rev": 0, "lost_at": None, "lost_from": None, "array": None, "waiting": None,
                        "tasks": None}
    full = {"command": "x", "user": "eve", "name": "n", "project": "p", "cwd": "/w", "env": {"A": "1"},
            "resreq": "select[mem>1]", "ntasks": 3, "output": "/o"}  # a field the record does not know
    new = st.jobs[st.submit(full, T0).result["jobid"]]
    assert {k: rec(new)[k] for k in full} == full and new.spec()["output"] == "/o"
    assert st.jobs.by_name["n"] and list(st.jobs.by_user["eve"]) == [new.jobid]
    st.jobs.remove(new.jobid)
    st.next_jobid -= 1
    assert st.submit({"command": "x", "user": "bob", "queue": "night"}, T0).result["jobid"] == 2
    assert st.jobs[2].queue == "night" and st.next_jobid == 3
    assert refused(st, st.submit, {"command": "x", "user": "u", "queue": "nope"}, T0).code == "NOT_FOUND"
    st.queues["night"]["open"] = False
    err = refused(st, st.submit, {"command": "x", "user": "u", "queue": "night"}, T0)
    assert err.code == "CONFLICT" and "closed" in err.message


def test_control_of_pending_jobs() -> None:
    st = new_state()
    jobid = submit(st)
    ch = st.control(jobid, "stop", T0)
    assert st.jobs[jobid].state == "PSUSP" and rows_of(ch, "jobs") == [("jobs", jobid, st.jobs[jobid])]
    assert ch.result is st.jobs[jobid] and events(ch, "job") and not events(ch, "signal")
    assert refused(st, st.control, jobid, "stop", T0).code == "CONFLICT"
    ch = st.control(jobid, "resume", T0)
    assert st.jobs[jobid].state == "PEND" and rows_of(ch, "jobs")
    assert refused(st, st.control, jobid, "resume", T0).code == "CONFLICT"
    for action in ("checkpoint", "requeue", "nonsense"):
        assert refused(st, st.control, jobid, action, T0).code == "CONFLICT"
    assert refused(st, st.control, jobid, "requeue", T0).message == f"job {jobid} is PEND: cannot requeue it"
    setj(st, jobid, pend_reason="no slots")
    ch = st.control(jobid, "kill", T0 + 1)
    job = st.jobs[jobid]
    assert (job.state, job.end_time, job.reason, job.pend_reason) == ("EXIT", T0 + 1, "killed", None)
    assert rows_of(ch, "jobs") and not events(ch, "signal")
    held = submit(st)
    st.control(held, "stop", T0)
    st.control(held, "kill", T0)
    assert st.jobs[held].state == "EXIT"
    err = refused(st, st.control, 99, "kill", T0)
    assert (err.code, err.message) == ("NOT_FOUND", "no such job: 99")


def test_control_of_running_jobs_signals_their_hosts() -> None:
    st = with_hosts(new_state(), "n1")
    jobid = running(st)
    ch = st.control(jobid, "stop", T0)
    (sig,) = events(ch, "signal")
    assert sig.data == {"jobid": jobid, "signal": "stop", "hosts": ["n1"], "attempt": 0}
    assert sig.hosts == frozenset({"n1"}) and st.jobs[jobid].state == "USUSP"
    assert rows_of(ch, "jobs") and st.jobs[jobid].signal == "stop"
    assert refused(st, st.control, jobid, "checkpoint", T0).code == "CONFLICT"  # only RUN
    ch = st.control(jobid, "resume", T0)
    assert st.jobs[jobid].state == "RUN" and events(ch, "signal")[0].data["signal"] == "resume"
    ch = st.control(jobid, "checkpoint", T0)
    assert events(ch, "signal")[0].data["signal"] == "checkpoint" and st.jobs[jobid].state == "RUN"
    assert rows_of(ch, "jobs")
    setj(st, jobid, state="SSUSP")
    st.control(jobid, "stop", T0)
    assert st.jobs[jobid].state == "USUSP"
    setj(st, jobid, state="SSUSP")
    st.control(jobid, "resume", T0)
    assert st.jobs[jobid].state == "RUN"
    assert refused(st, st.control, jobid, "resume", T0).code == "CONFLICT"  # RUN: nothing to resume
    ch = st.control(jobid, "kill", T0)
    assert events(ch, "signal")[0].data["signal"] == "kill" and st.jobs[jobid].state == "RUN"
    assert rows_of(ch, "jobs")


RESET = {"state": "PEND", "alloc": (), "pid": None, "start_time": None, "end_time": None,
         "exit_status": None, "reason": None, "signal": None, "forced": False, "attempt": 0}


def test_requeue_of_a_running_job_frees_its_slots_and_counts_the_attempt() -> None:
    st = with_hosts(new_state(), "n1")
    jobid = running(st, ntasks=2)
    assert st.hosts["n1"]["used_slots"] == 2 and st.jobs.active_on["n1"] == {jobid}
    setj(st, jobid, pid=7, start_time=T0, signal="stop", forced=True, reason="r", exit_status=1,
         end_time=T0)
    ch = st.control(jobid, "requeue", T0)
    job = st.jobs[jobid]
    assert {k: getattr(job, k) for k in RESET} == {**RESET, "attempt": 1}
    assert st.hosts["n1"]["used_slots"] == 0 and "n1" not in st.jobs.active_on
    assert events(ch, "signal")[0].data == {"jobid": jobid, "signal": "kill", "hosts": ["n1"], "attempt": 0}
    assert rows_of(ch, "hosts") and rows_of(ch, "jobs")
    (host_ev,) = events(ch, "host")
    assert host_ev.data is st.hosts["n1"]
    (job_ev,) = events(ch, "job")
    assert job_ev.hosts == frozenset({"n1"})  # the old host hears that the job left it
    done = running(st)
    st.notify("n1", {"jobid": done, "event": "finish", "exit_status": 3}, T0)
    setj(st, done, pid=7, start_time=T0, signal="stop", forced=True)
    ch = st.control(done, "requeue", T0)
    assert {k: getattr(st.jobs[done], k) for k in RESET} == {**RESET, "attempt": 1}
    assert not events(ch, "signal") and rows_of(ch, "jobs")


# -- jobs: dispatch, reports -----------------------------------------------------------------


def test_dispatch_checks_everything_first() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=2)
    jobid = submit(st, ntasks=2)
    alloc = [{"host": "n1", "ntasks": 1}, {"host": "n2", "ntasks": 1}]
    err = refused(st, st.dispatch, jobid, [{"host": "n1", "ntasks": 1}], False)
    assert (err.code, err.message) == ("INVALID", f"jobdispatch: alloc gives 1 tasks, job {jobid} needs 2")
    assert refused(st, st.dispatch, jobid, [{"host": "n1", "ntasks": 3}], False).code == "INVALID"
    err = refused(st, st.dispatch, jobid, [{"host": "nx", "ntasks": 2}], True)
    assert err.message == f"host nx is unknown: cannot dispatch job {jobid} to it"
    st.hosts["n2"]["available"] = False
    err = refused(st, st.dispatch, jobid, alloc, True)  # force does not reach an unavail host
    assert err.code == "CONFLICT" and "unavail" in err.message
    st.hosts["n2"]["available"] = True
    st.hosts["n2"]["closed"] = True
    assert "closed" in refused(st, st.dispatch, jobid, alloc, False).message
    st.hosts["n2"]["closed"] = False
    st.hosts["n2"]["used_slots"] = 2
    assert "free slots" in refused(st, st.dispatch, jobid, alloc, False).message
    st.hosts["n2"]["used_slots"] = 1
    st.queues["normal"]["active"] = False
    assert "inactive" in refused(st, st.dispatch, jobid, alloc, False).message
    st.queues["normal"]["active"] = True
    setj(st, jobid, pend_reason="waiting")
    setj(st, jobid, signal="kill")  # left from before a requeue: a new run starts clean
    ch = st.dispatch(jobid, [{"host": "n1", "ntasks": 1, "x": 1}, {"host": "n2", "ntasks": 1}], False)
    job = st.jobs[jobid]
    assert orjson.loads(orjson.dumps(ch.result)) == {"jobid": jobid, "state": "RUN", "alloc": alloc}
    assert rec(job)["alloc"] == alloc
    assert (job.state, job.pend_reason, job.forced, job.signal) == ("RUN", None, False, None)
    assert st.hosts["n1"]["used_slots"] == 1 and st.hosts["n2"]["used_slots"] == 2
    assert st.jobs.active_on["n1"] == {jobid} == st.jobs.active_on["n2"]
    assert sorted(r[1] for r in rows_of(ch, "hosts")) == ["n1", "n2"] and rows_of(ch, "jobs")
    err = refused(st, st.dispatch, jobid, alloc, False)  # not PEND any more
    assert err.message == f"job {jobid} is RUN, not PEND: cannot dispatch it"


def test_force_dispatch_overrides_closed_hosts_and_full_slots() -> None:
    st = with_hosts(new_state(), "n1", slots=1)
    running(st)
    st.host_control("n1", "close", "")
    jobid = submit(st)
    st.dispatch(jobid, [{"host": "n1", "ntasks": 1}], True)
    assert st.jobs[jobid].forced and st.hosts["n1"]["used_slots"] == 2
    other = submit(st, queue="night")
    del st.queues["night"]  # a job whose queue is gone from config still dispatches
    st.dispatch(other, [{"host": "n1", "ntasks": 1}], True)
    assert st.jobs[other].state == "RUN"


def test_a_reported_time_is_kept_within_what_the_controller_knows() -> None:
    """A worker's clock hours off gives no job a start in the future or an end before its
    start; a time within the bounds (a report delivered late) is kept."""
    st = with_hosts(new_state(), "n1")
    ahead = running(st)
    st.notify("n1", {"jobid": ahead, "event": "start", "pid": 1, "time": T0 + 3600}, T0 + 5)
    assert st.jobs[ahead].start_time == T0 + 5  # not in the future
    st.notify("n1", {"jobid": ahead, "event": "finish", "exit_status": 0, "time": T0 - 3600}, T0 + 9)
    assert st.jobs[ahead].end_time == T0 + 5  # not before its start
    late = running(st)
    st.notify("n1", {"jobid": late, "event": "start", "pid": 2, "time": T0 - 99}, T0 + 10)
    assert st.jobs[late].start_time == st.jobs[late].submit_time == T0  # not before its submission
    st.notify("n1", {"jobid": late, "event": "finish", "exit_status": 0, "time": T0 + 20}, T0 + 60)
    assert st.jobs[late].end_time == T0 + 20  # within the bounds: the moment it happened


def test_reports_of_the_worker_move_the_job() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    jobid = running(st)
    err = refused(st, st.notify, "n2", {"jobid": jobid, "event": "start", "pid": 1}, T0)
    assert (err.code, err.message) == ("DENIED", f"job {jobid} does not run on host n2")
    ch = st.notify("n1", {"jobid": jobid, "event": "start", "pid": 42}, T0 + 1)
    assert (st.jobs[jobid].pid, st.jobs[jobid].start_time) == (42, T0 + 1)
    assert rows_of(ch, "jobs") and ch.result is st.jobs[jobid]
    st.notify("n1", {"jobid": jobid, "event": "stop"}, T0)
    assert st.jobs[jobid].state == "SSUSP"
    st.notify("n1", {"jobid": jobid, "event": "stop"}, T0)  # already stopped: stays
    assert st.jobs[jobid].state == "SSUSP"
    st.notify("n1", {"jobid": jobid, "event": "resume"}, T0)
    assert st.jobs[jobid].state == "RUN"
    err = refused(st, st.notify, "n1", {"jobid": jobid, "event": "resume"}, T0)
    assert err.message == f"job {jobid} is RUN: cannot record 'resume'"
    setj(st, jobid, state="USUSP")
    st.notify("n1", {"jobid": jobid, "event": "stop"}, T0)
    assert st.jobs[jobid].state == "USUSP"
    st.notify("n1", {"jobid": jobid, "event": "resume"}, T0)
    assert st.jobs[jobid].state == "RUN"
    setj(st, jobid, signal="stop")
    ch = st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0}, T0 + 2)
    job = st.jobs[jobid]
    assert job.signal is None
    assert (job.state, job.exit_status, job.end_time, job.reason) == ("DONE", 0, T0 + 2, None)
    assert st.hosts["n1"]["used_slots"] == 0 and rows_of(ch, "hosts") and rows_of(ch, "jobs")
    # A repeated finish (a report sent again after a crash) is answered, and changes nothing.
    again = st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0}, T0 + 3)
    assert again.rows == [] and again.events == [] and again.result is job and job.end_time == T0 + 2
    assert refused(st, st.notify, "n1", {"jobid": jobid, "event": "start", "pid": 1}, T0).code == "CONFLICT"
    failing = running(st)
    st.notify("n1", {"jobid": failing, "event": "finish", "exit_status": 2}, T0)
    assert st.jobs[failing].state == "EXIT" and st.jobs[failing].reason == "exit status 2"


def test_a_fail_report_ends_the_job_and_frees_its_slots() -> None:
    st = with_hosts(new_state(), "n1")
    jobid = running(st, ntasks=2)
    setj(st, jobid, signal="kill")
    ch = st.notify("n1", {"jobid": jobid, "event": "fail", "reason": "cannot exec"}, T0 + 1)
    job = st.jobs[jobid]
    assert (job.state, job.reason) == ("EXIT", "failed: cannot exec")
    assert (job.end_time, job.signal) == (T0 + 1, None)
    assert job.exit_status is None
    assert st.hosts["n1"]["used_slots"] == 0 and "n1" not in st.jobs.active_on  # no leaked slot
    assert rows_of(ch, "hosts") == [("hosts", "n1", st.hosts["n1"])] and rows_of(ch, "jobs")
    other = running(st)
    st.notify("n1", {"jobid": other, "event": "fail", "exit_status": 127}, T0)
    assert st.jobs[other].reason == "failed: failed" and st.jobs[other].exit_status == 127
    again = st.notify("n1", {"jobid": other, "event": "fail"}, T0)
    assert again.rows == [] and st.jobs[other].state == "EXIT"


def test_a_report_of_a_stale_attempt_never_touches_the_requeued_job() -> None:
    """finish/fail of attempt 0 arriving after a requeue and a new dispatch (attempt 1) on the
    same host must be refused, or the new run would be marked ended and its slots freed."""
    st = with_hosts(new_state(), "n1")
    jobid = running(st)
    st.control(jobid, "requeue", T0)
    st.dispatch(jobid, [{"host": "n1", "ntasks": 1}], False)
    assert st.jobs[jobid].attempt == 1
    for event in ("finish", "fail", "start", "stop"):
        args = {"jobid": jobid, "event": event, "attempt": 0, "exit_status": 0, "pid": 1}
        err = refused(st, st.notify, "n1", args, T0)
        assert err.code == "CONFLICT" and "attempt 0" in err.message
    assert st.jobs[jobid].state == "RUN" and st.hosts["n1"]["used_slots"] == 1
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0, "attempt": 1}, T0)
    assert st.jobs[jobid].state == "DONE"


def test_a_finish_for_a_job_that_is_not_active_is_refused() -> None:
    st = with_hosts(new_state(), "n1")
    jobid = running(st)
    st.control(jobid, "requeue", T0)
    setj(st, jobid, alloc=make_alloc([("n1", 1)]))  # as if the report named its host
    for event in ("finish", "fail", "start", "stop", "resume"):
        args = {"jobid": jobid, "event": event, "exit_status": 0, "pid": 1}
        assert refused(st, st.notify, "n1", args, T0).code == "CONFLICT"
    assert st.jobs[jobid].state == "PEND"


def test_usage_reports() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    jobid = running(st)
    ch = st.set_jusage("n1", jobid, {"mem": 5})
    assert st.jobs[jobid].usage == {"mem": 5} and ch.rows == [] and ch.result == {"jobid": jobid}
    assert ch.events[0].data == {"jobid": jobid, "usage": {"mem": 5}} and ch.events[0].name == "jusage"
    err = refused(st, st.set_jusage, "n2", jobid, {"mem": 6})
    assert (err.code, err.message) == ("DENIED", f"job {jobid} does not run on host n2")
    assert refused(st, st.set_jusage, "n1", 99, {}).code == "NOT_FOUND"


# -- reasons, queues, cleaning, loading -----------------------------------------------------


def test_pend_reasons_only_for_pending_jobs_and_only_when_changed() -> None:
    st = with_hosts(new_state(), "n1")
    a, b, run = submit(st), submit(st), running(st)
    st.control(b, "stop", T0)
    ch = st.set_reasons({a: "no slots", b: "held", run: "x", 99: "y"})
    assert ch.result == 2 and ch.rows == []
    assert ch.events[0].data == {"reasons": {str(a): "no slots", str(b): "held"}}
    assert ch.events[0].name == "pend_reasons"
    assert st.jobs[run].pend_reason is None
    ch = st.set_reasons({a: "no slots"})
    assert ch.result == 0 and ch.events == []
    assert st.set_reasons({a: None}).result == 1 and st.jobs[a].pend_reason is None


def test_queue_control_every_action() -> None:
    st = new_state()
    for action, key, value, status in (("close", "open", False, "Closed:Active"),
                                       ("inactivate", "active", False, "Closed:Inact"),
                                       ("open", "open", True, "Open:Inact"),
                                       ("activate", "active", True, "Open:Active")):
        ch = st.queue_control("normal", action)
        q = st.queues["normal"]
        assert q[key] is value and q["status"] == status and ch.result is q
        assert ch.rows == [("queues", "normal", q)] and ch.events[0].data is q
        assert ch.events[0].name == "queue"
    assert refused(st, st.queue_control, "nope", "open").code == "NOT_FOUND"


def test_clean_finished_removes_old_finished_jobs_durably() -> None:
    st = with_hosts(new_state(), "n1")
    old, recent, pend = running(st), running(st), submit(st)
    st.notify("n1", {"jobid": old, "event": "finish", "exit_status": 0}, T0)
    st.notify("n1", {"jobid": recent, "event": "finish", "exit_status": 0}, T0 + 50)
    assert st.clean_finished(T0 + 60, 60, 10).result == []
    ch = st.clean_finished(T0 + 60.5, 60, 10)
    assert ch.result == [old] and old not in st.jobs and recent in st.jobs and pend in st.jobs
    assert old not in st.jobs.by_state["DONE"] and old not in st.jobs.all
    assert ch.rows == [("jobs", old, None), ("meta", "next_jobid", st.next_jobid)]
    assert ch.events[0].name == "job_removed" and ch.events[0].data == {"jobids": [old]}
    st.notify("n1", {"jobid": running(st), "event": "finish", "exit_status": 0}, T0)
    ch = st.clean_finished(T0 + 1000, 60, 1)
    assert len(ch.result) == 1  # the limit holds
    setj(st, pend, end_time=0.0)  # not finished: never cleaned, whatever its end time
    assert pend not in st.clean_finished(T0 + 1e6, 60, 100).result


def _stored(job: Job) -> Job:
    from xce_controller.jobs import job_from_row

    return job_from_row(job._spec, job.row())


def test_load_takes_over_the_durable_state() -> None:
    st = with_hosts(new_state(), "n1", "n2")
    active = running(st, "n1", 1)
    second = running(st, "n1", 1)
    done = running(st, "n2")
    st.notify("n2", {"jobid": done, "event": "finish", "exit_status": 0}, T0)
    stored_q = dict(st.queues["normal"], open=False, active=True)
    stored_night = dict(st.queues["night"], open=True, active=False)
    hosts = orjson.loads(orjson.dumps(st.hosts))
    for h in hosts.values():
        h["used_slots"] = 99  # recomputed from the jobs, never trusted
    fresh = new_state()
    fresh.take_head(hosts, {"normal": stored_q, "night": stored_night,
                            "gone": queue_record({"name": "gone", "priority": 1})}, 40, T0 + 5)
    fresh.take_jobs(JobTable.build([_stored(j) for j in st.jobs.values()]))
    assert [rec(j) for j in fresh.jobs.values()] == [rec(j) for j in st.jobs.values()]
    assert fresh.next_jobid == 40
    assert fresh.hosts["n1"]["used_slots"] == 2 and fresh.hosts["n2"]["used_slots"] == 0
    assert fresh.jobs.active_on == {"n1": {active, second}}
    assert fresh.last_seen == {"n1": T0 + 5, "n2": T0 + 5} and fresh.host_names == ["n1", "n2"]
    q = fresh.queues["normal"]
    assert (q["open"], q["active"], q["status"], q["priority"]) == (False, True, "Closed:Active", 30)
    night = fresh.queues["night"]
    assert (night["open"], night["active"], night["status"]) == (True, False, "Open:Inact")
    assert fresh.queues["gone"]["priority"] == 1 and fresh.queues["high"]["open"]
    again = new_state()
    again.take_head({}, {}, 1, T0)
    again.take_jobs(JobTable.build([_stored(j) for j in st.jobs.values()]))
    assert again.next_jobid == max(st.jobs) + 1
    # Jobs submitted while the table loaded are kept, and win over the table's.
    late = new_state()
    late.take_head({}, {}, 1, T0)
    own = late.submit({"command": "late", "user": "u"}, T0).result["jobid"]
    late.take_jobs(JobTable.build([_stored(j) for j in st.jobs.values() if j.jobid != own]))
    assert late.jobs[own].spec()["command"] == "late" and len(late.jobs) == len(st.jobs) + 1 - 1
    empty = new_state()
    empty.take_head({}, {}, 1, T0)
    empty.take_jobs(JobTable())
    assert empty.next_jobid == 1 and len(empty.jobs) == 0


def test_follow_applies_committed_changes_and_removals() -> None:
    """A hot standby's catch-up: newer versions replace records, removals remove them, a
    record removed and made again stays, slots are counted again."""
    st = with_hosts(new_state(), "n1")
    a, b = running(st, "n1"), submit(st)
    copy = new_state()
    copy.take_head(orjson.loads(orjson.dumps(st.hosts)), {}, st.next_jobid, T0)
    copy.take_jobs(JobTable.build([_stored(j) for j in st.jobs.values()]))
    st.notify("n1", {"jobid": a, "event": "finish", "exit_status": 0}, T0 + 1)
    c = submit(st)
    st.clean_finished(T0 + 10_000, 60, 10)
    st.join_worker({"hname": "n2", "ncpus": 2}, T0)
    st.queue_control("night", "close")
    copy.follow([_stored(st.jobs[c])], orjson.loads(orjson.dumps(st.hosts)),
                {"night": dict(st.queues["night"])},
                [("jobs", a, 5), ("hosts", "n2", 3), ("queues", "gone", 4)], st.next_jobid, T0)
    assert sorted(copy.jobs) == [b, c] and copy.next_jobid == st.next_jobid
    assert copy.hosts["n1"]["used_slots"] == 0 and "n2" in copy.hosts  # removed, then made again
    assert copy.queues["night"]["open"] is False and copy.host_names == ["n1", "n2"]


def test_freeing_slots_of_a_host_missing_from_the_index() -> None:
    st = with_hosts(new_state(), "n1")
    jobid = running(st)
    st.notify("n1", {"jobid": jobid, "event": "finish", "exit_status": 0}, T0)
    assert st.hosts["n1"]["used_slots"] == 0 and "n1" not in st.jobs.active_on
    st.jobs.remove(jobid)
    assert "n1" not in st.jobs.by_host  # an empty index entry does not linger


# -- exclusive (-x) hosts hold for every dispatch, forced ones too -----------------------------


def submit_x(st: ClusterState, ntasks: int = 1, **more: Any) -> int:
    args: dict[str, Any] = {"command": "true", "user": "alice", "ntasks": ntasks,
                            "exclusive": True, **more}
    return int(st.submit(args, T0).result["jobid"])


@pytest.mark.parametrize("force", [False, True])
def test_an_exclusive_job_never_shares_a_host(force: bool) -> None:
    st = with_hosts(new_state(), "n1", "n2", "n3", slots=4)
    plain = running(st, "n1")
    x = submit_x(st)
    err = refused(st, st.dispatch, x, [{"host": "n1", "ntasks": 1}], force)
    assert err.code == "CONFLICT" and f"host n1 runs job {plain}: exclusive job {x}" in err.message
    st.dispatch(x, [{"host": "n2", "ntasks": 1}], force)
    other = submit(st)
    err = refused(st, st.dispatch, other, [{"host": "n2", "ntasks": 1}], force)
    assert f"host n2 is held by exclusive job {x} (-x): cannot dispatch job {other}" in err.message
    x2 = submit_x(st)
    err = refused(st, st.dispatch, x2, [{"host": "n2", "ntasks": 1}], force)
    assert f"host n2 runs job {x}: exclusive job {x2}" in err.message
    st.dispatch(other, [{"host": "n3", "ntasks": 1}], force)  # another host: fine
    # Once the exclusive job ends, its host takes others again.
    st.control(x, "kill", T0, "owner alice")
    st.notify("n2", {"jobid": x, "event": "finish", "exit_status": 143, "exit_reason": "killed"}, T0)
    st.dispatch(x2, [{"host": "n2", "ntasks": 1}], force)


def test_the_exclusive_index_follows_the_jobs_and_a_reload() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=4)
    x = submit_x(st)
    st.dispatch(x, [{"host": "n1", "ntasks": 1}], False)
    plain = running(st, "n2")
    assert st.jobs.exclusive_on == {"n1": {x}}
    fresh = new_state()
    fresh.take_head(orjson.loads(orjson.dumps(st.hosts)), {}, 40, T0)
    fresh.take_jobs(JobTable.build([_stored(j) for j in st.jobs.values()]))
    assert fresh.jobs.exclusive_on == {"n1": {x}} and fresh.jobs.active_on == {"n1": {x}, "n2": {plain}}
    other = submit(fresh)
    err = refused(fresh, fresh.dispatch, other, [{"host": "n1", "ntasks": 1}], False)
    assert f"host n1 is held by exclusive job {x} (-x)" in err.message
    fresh.control(x, "requeue", T0, "owner alice")  # no longer active: the hold goes
    assert fresh.jobs.exclusive_on == {}
    fresh.dispatch(other, [{"host": "n1", "ntasks": 1}], False)


def test_an_exclusive_array_puts_its_elements_on_hosts_of_their_own() -> None:
    st = with_hosts(new_state(), "n1", "n2", slots=4)
    arr = submit_x(st, array="1-3")
    one = [{"host": "n1", "ntasks": 1}]
    err = refused(st, st.dispatch, arr, one, False, [one])
    assert "two of its elements cannot share host n1" in err.message
    st.dispatch(arr, one, False)
    err = refused(st, st.dispatch, arr, one, True)
    assert "host n1 runs job" in err.message and f"exclusive job {arr}" in err.message
    st.dispatch(arr, [{"host": "n2", "ntasks": 1}], True)


def test_a_word_exclusive_elsewhere_in_the_submission_changes_nothing() -> None:
    st = with_hosts(new_state(), "n1", slots=4)
    running(st, "n1")
    j = int(st.submit({"command": 'echo "exclusive":true', "user": "alice", "name": "exclusive",
                       "exclusive": False}, T0).result["jobid"])
    st.dispatch(j, [{"host": "n1", "ntasks": 1}], False)  # not exclusive: shares n1


def test_the_default_heartbeat_keeps_host_failure_detection_within_host_timeout() -> None:
    # The default cadence must leave many beats per default host_timeout (a late beat or two
    # never marks a live host unavail), and a silent host is unavail exactly once its last
    # beat is host_timeout old, whatever the cadence (docs/operator.md, "Tuning failover").
    from xce_controller.settings import HOST_TIMEOUT

    from xcecore.client.settings import CLIENT_KEYS

    beat = CLIENT_KEYS["heartbeat_interval"][1]
    assert beat > 0 and HOST_TIMEOUT / beat >= 10
    st = new_state()
    assert st.conf.host_timeout == HOST_TIMEOUT
    st.join_worker({"hname": "h1", "ncpus": 4}, T0)
    t = T0
    while t + beat < T0 + 3 * HOST_TIMEOUT:  # beating at the default cadence: never unavail
        t += beat
        st.heartbeat("h1", t)
        assert not st.expire_hosts(t).rows and st.hosts["h1"]["available"]
    last = t
    assert not st.expire_hosts(last + HOST_TIMEOUT - 0.01).rows
    ch = st.expire_hosts(last + HOST_TIMEOUT + 0.01)
    assert [r[1] for r in ch.rows if r[0] == "hosts"] == ["h1"]
    assert st.hosts["h1"]["state"] == "unavail"
