"""The pure core: job versions in, keyed events and finished-attempt rows out (no I/O)."""

from __future__ import annotations

from typing import Any

from xce_accounting.record import ATTEMPT_COLUMNS, View, observe
from xce_accounting.timeline import Tracker

NOW = 1_800_000_000.0


def job(**kw: Any) -> dict[str, Any]:
    base = {"jobid": 7, "user": "alice", "queue": "normal", "project": "default", "ntasks": 2,
            "state": "PEND", "attempt": 0, "alloc": [], "submit_time": NOW - 50,
            "start_time": None, "end_time": None, "pend_reason": None, "usage": {}}
    base.update(kw)
    return base


RUN = {"state": "RUN", "alloc": [{"host": "n1", "ntasks": 2}], "start_time": NOW - 40, "pid": 9}


def kinds(out: Any) -> list[str]:
    return [e.kind for e in out.events]


def test_a_life_seen_live_gives_its_timeline_and_one_attempt_row() -> None:
    o1 = observe(None, job(), NOW, synced=False)
    assert kinds(o1) == ["submitted"] and o1.events[0].time == NOW - 50
    o2 = observe(o1.view, job(pend_reason="no free slots"), NOW, synced=False)
    assert kinds(o2) == ["pending"] and o2.events[0].detail == {"reason": "no free slots"}
    o3 = observe(o2.view, job(**RUN), NOW, synced=False)
    assert kinds(o3) == ["dispatched", "started"]
    o4 = observe(o3.view, job(**{**RUN, "state": "USUSP"}), NOW, synced=False)
    o5 = observe(o4.view, job(**RUN), NOW, synced=False)
    assert kinds(o4) == ["stopped"] and o4.events[0].detail["by"] == "user" and kinds(o5) == ["resumed"]
    end = job(**{**RUN, "state": "EXIT", "end_time": NOW - 10, "exit_status": 3,
                 "reason": "exit status 3", "usage": {"utime": 4.0, "stime": 1.0, "mem": 20}})
    o6 = observe(o5.view, end, NOW, synced=False)
    assert kinds(o6) == ["finished"] and len(o6.attempts) == 1
    row = dict(zip(ATTEMPT_COLUMNS, o6.attempts[0].values, strict=True))
    assert (row["state"], row["exit_status"], row["reason"], row["hosts"]) == ("EXIT", 3, "exit status 3", ",n1,")
    assert (row["cpu_time"], row["max_mem"], row["wait_time"], row["wall_time"]) == (5.0, 20.0, 10.0, 30.0)
    assert [e.seq for o in (o1, o2, o3, o4, o5, o6) for e in o.events] == list(range(1, 8))
    again = observe(o6.view, end, NOW + 5, synced=True)  # a re-delivery in a sync
    assert not again.events and not again.attempts


def test_a_host_that_stops_reporting_is_unknown_not_a_suspension() -> None:
    v = observe(observe(None, job(), NOW, synced=False).view, job(**RUN), NOW, synced=False).view
    lost = observe(v, job(**{**RUN, "state": "UNKWN"}), NOW + 1, synced=False)
    assert kinds(lost) == ["unknown"] and lost.events[0].detail == {"state": "UNKWN", "hosts": ["n1"]}
    back = observe(lost.view, job(**RUN), NOW + 2, synced=False)
    assert kinds(back) == ["reported"]
    stopped = observe(back.view, job(**{**RUN, "state": "SSUSP"}), NOW + 3, synced=False)
    assert kinds(stopped) == ["stopped"] and stopped.events[0].detail["by"] == "system"
    assert not lost.attempts and not back.attempts


def test_a_requeued_run_is_its_own_attempt_row() -> None:
    v = observe(observe(None, job(), NOW, synced=False).view, job(**RUN), NOW, synced=False).view
    assert v is not None
    out = observe(v, job(attempt=1), NOW + 1, synced=False)
    assert kinds(out) == ["requeued"] and out.view is not None and out.view.attempt == 1
    row = dict(zip(ATTEMPT_COLUMNS, out.attempts[0].values, strict=True))
    assert (row["attempt"], row["state"], row["hosts"], row["start_time"]) == (0, "REQUEUED", ",n1,", NOW - 40)


def test_gaps_where_changes_were_not_seen_one_by_one() -> None:
    fresh = observe(None, job(), NOW, synced=True)
    assert kinds(fresh) == ["submitted"]  # a pending job in a sync: nothing could be missed
    late = observe(None, job(**{**RUN, "state": "DONE", "end_time": NOW, "exit_status": 0}), NOW, synced=True)
    assert kinds(late) == ["gap", "submitted", "dispatched", "started", "finished"]
    assert len(late.attempts) == 1
    v = observe(None, job(), NOW, synced=False).view
    moved = observe(v, job(**RUN), NOW, synced=True)
    assert kinds(moved) == ["gap", "dispatched", "started"]
    same = observe(v, job(), NOW, synced=True)
    assert not same.events


def test_tracker_records_cluster_events_once_and_missed_jobs() -> None:
    tr = Tracker()
    state = {"server": "a:1", "jobs": [job(jobid=3)], "members": [{"identity": "worker@n1", "role": "worker"}],
             "hosts": [{"name": "n1", "state": "ok"}]}
    b1 = tr.on_sync(state, NOW, lambda ids: {})
    kinds1 = sorted(c.kind for c in b1.cluster)
    assert kinds1 == ["gap", "host", "member"]  # jobs 1-2 were never seen
    gap = next(c for c in b1.cluster if c.kind == "gap")
    assert gap.detail["jobids"] == ["1-2"] and gap.detail["count"] == 2
    b2 = tr.on_sync({**state, "server": "b:2"}, NOW, lambda ids: {})
    assert [(c.kind, c.detail) for c in b2.cluster] == [("promotion", {"old": "a:1", "new": "b:2"})]
    b3 = Tracker(b1.marks | b2.marks).on_sync({**state, "server": "b:2"}, NOW, lambda ids: {3: tr.views[3]})
    assert not b3.cluster and not b3.events  # a restarted role with the stored marks: nothing new
    gone = tr.on_removed([3], NOW)
    assert [e.kind for e in gone.events] == ["gap"]  # removed before it ended
    left = tr.on_member({"identity": "worker@n1", "role": "worker", "joined": False}, NOW)
    assert [c.detail["joined"] for c in left.cluster] == [False]


def test_view_round_trips_through_json() -> None:
    v = View(2, "RUN", "why", ("a", "b"), 12.5, 9)
    assert View.from_json(v.to_json()) == v


def test_time_arguments_of_xce_acct() -> None:
    import pytest
    from xce_accounting.commands import parse_time

    from xcecore.cli.session import CommandError

    assert parse_time("30d", now=NOW) == NOW - 30 * 86400
    assert parse_time("12h", now=NOW) == NOW - 12 * 3600
    assert parse_time("1.5w", now=NOW) == NOW - 1.5 * 604800
    assert parse_time("2026-11-30T08:00:00+00:00") == 1796025600.0
    assert parse_time("1796025600") == 1796025600.0
    with pytest.raises(CommandError, match="give a span ago"):
        parse_time("last tuesday")
