"""Reservations held by running jobs (``xce_scheduler.holds``, and the picker using it): a
job's rusage stays taken off its hosts while it runs, for ``duration`` minutes when given,
decreasing linearly with ``decay=1``; the next job waits for it with a reason that says so."""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job
from test_sched_picker import dispatches, make, reasons
from xce_scheduler import reasons as R
from xce_scheduler.holds import RunningHolds

pytestmark = pytest.mark.timeout(60)


def test_constant_holds_last_while_the_job_runs() -> None:
    h = RunningHolds()
    h.start(1, [("a", {"mem": 1000.0}), ("b", {"mem": 1000.0})], 100.0, {}, {})
    h.start(2, [("a", {"mem": 500.0, "lic": 2.0})], 100.0, {}, {})
    assert h.held(1e9) == {"a": {"mem": 1500.0, "lic": 2.0}, "b": {"mem": 1000.0}}
    h.end(1)
    assert h.held(1e9) == {"a": {"mem": 500.0, "lic": 2.0}}
    h.end(2)
    h.end(2)  # twice: nothing
    assert h.held(0) == {} and len(h) == 0


def test_a_duration_ends_the_hold_and_decay_makes_it_shrink() -> None:
    h = RunningHolds()
    h.start(1, [("a", {"mem": 600.0})], 0.0, {"mem": 10}, {"mem": 0})  # 10 minutes
    h.start(2, [("a", {"lic": 4.0})], 0.0, {"lic": 2}, {"lic": 1})  # 2 minutes, decaying
    assert h.held(0.0) == {"a": {"mem": 600.0, "lic": 4.0}}
    assert h.held(30.0) == {"a": {"mem": 600.0, "lic": 3.0}}
    assert h.held(90.0)["a"]["lic"] == pytest.approx(1.0)
    assert not h.due(119.0) and h.due(120.0)
    assert h.held(120.0) == {"a": {"mem": 600.0}} and 2 not in h
    assert h.held(600.0) == {} and len(h) == 0
    # Started again (a new attempt): the old heap entry is stale and ends nothing.
    h.start(3, [("a", {"mem": 100.0})], 0.0, {"mem": 1}, {})
    h.start(3, [("a", {"mem": 100.0})], 50.0, {"mem": 1}, {})
    assert h.held(70.0) == {"a": {"mem": 100.0}}
    assert h.held(110.0) == {}


def run(rec: dict[str, Any], hname: str, start: float | None = None) -> dict[str, Any]:
    return {**rec, "state": "RUN", "alloc": [{"host": hname, "ntasks": 1}], "start_time": start}


def test_a_running_jobs_rusage_keeps_the_next_one_waiting_until_it_ends() -> None:
    hosts = [host("a", slots=8, resvals={"mem": 10.0})]
    first, second = job(1, resreq="rusage[mem=6]"), job(2, resreq="rusage[mem=6]")
    picker, sent = make(hosts, [first, second])
    picker.cycle()
    assert dispatches(sent) == {1: [{"host": "a", "ntasks": 1}]}
    assert reasons(sent) == {"2": R.RESERVED}
    # The controller runs it: no longer in flight, still held (as it runs).
    sent.clear()
    picker.view.apply("job", run(first, "a"))
    picker.view.apply("host", host("a", slots=8, used=1, resvals={"mem": 10.0}))
    picker.cycle()
    assert dispatches(sent) == {} and len(picker.holds) == 1
    # It ends: the next job goes.
    sent.clear()
    picker.view.apply("job", {**run(first, "a"), "state": "DONE"})
    picker.view.apply("host", host("a", slots=8, used=0, resvals={"mem": 10.0}))
    picker.cycle()
    assert dispatches(sent) == {2: [{"host": "a", "ntasks": 1}]} and len(picker.holds) == 0


def test_jobs_running_before_the_scheduler_started_hold_their_first_alternative() -> None:
    hosts = [host("a", slots=8, resvals={"mem": 10.0}), host("b", slots=8, resvals={"mem": 10.0})]
    old = run(job(1, resreq="rusage[mem=8:duration=1]"), "a", start=1.0)  # long expired
    now = run(job(2, resreq="rusage[mem=8 || mem=5]"), "b")
    picker, sent = make(hosts, [old, now, job(3, resreq="rusage[mem=4]")])
    picker.cycle()
    # b holds 8 of its 10; a's hold ended long ago: job 3 goes to a.
    assert dispatches(sent) == {3: [{"host": "a", "ntasks": 1}]}
    picker.view.apply("job", run(job(3, resreq="rusage[mem=4]"), "a"))
    picker.cycle()
    assert picker.holds.held(1e12) == {"b": {"mem": 8.0}, "a": {"mem": 4.0}}
