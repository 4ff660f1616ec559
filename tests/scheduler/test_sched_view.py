"""The scheduler's view: state replaces it, deltas update it, wake-ups on useful changes."""

from __future__ import annotations

import pytest
from sched_records import host, job, queue, state
from xce_scheduler.view import SchedulerView, free_slots

pytestmark = pytest.mark.timeout(30)


def test_state_replaces_everything() -> None:
    view = SchedulerView()
    view.apply("state", state([host("a"), host("b")], [job(1), job(2, state="RUN")]))
    view.apply("state", state([host("c")], [job(3)]))
    snap = view.snapshot()
    assert set(snap.hosts) == {"c"}
    assert [j["jobid"] for j in snap.pending] == [3]
    assert snap.epoch == 2


def test_job_deltas_and_wake() -> None:
    view = SchedulerView()
    view.apply("state", state([host("a")], []))
    view.wake.clear()
    view.apply("job", job(5))
    assert view.wake.is_set(), "a new pending job wakes the picker"
    view.wake.clear()
    view.apply("job", job(5, state="RUN"))
    assert not view.wake.is_set()
    assert view.snapshot().pending == ()
    view.apply("job", job(5, state="DONE"))
    assert view.wake.is_set(), "a finished job frees slots"


def test_host_queue_resvals_and_reasons() -> None:
    view = SchedulerView()
    view.apply("state", state([host("a", used=4)], [job(1)]))
    view.wake.clear()
    view.apply("host", host("a", used=2))
    assert view.wake.is_set()
    before = view.snapshot().hosts["a"]
    view.apply("resvals", {"host": "a", "values": {"r1m": 0.5}})
    after = view.snapshot().hosts["a"]
    assert after["resvals"] == {"r1m": 0.5} and before["resvals"] == {}, "copy on write"
    view.apply("pend_reasons", {"reasons": {"1": "x"}})
    assert view.pend_reason(1) == "x"
    view.wake.clear()
    view.apply("queue", queue("normal", 30, active=False))
    view.apply("queue", queue("normal", 30, active=True))
    assert view.wake.is_set()


def test_malformed_push_is_ignored() -> None:
    view = SchedulerView()
    view.apply("job", {"no": "jobid"})
    view.apply("whatever", 1)
    assert view.snapshot().pending == ()


def test_free_slots() -> None:
    assert free_slots(host("a", slots=4, used=1)) == 3
    assert free_slots(host("a", slots=1, used=3)) == 0
    assert free_slots({"max_slots": "x"}) == 0


def test_job_removed_drops_purged_jobs() -> None:
    view = SchedulerView()
    view.apply("state", state([host("a")], [job(1), job(2, state="DONE")]))
    view.wake.clear()
    view.apply("job_removed", {"jobids": [2]})  # the usual case: a finished job
    assert [j["jobid"] for j in view.snapshot().pending] == [1] and not view.wake.is_set()
    view.apply("job_removed", {"jobids": [1]})  # a pending copy goes too, if one is left
    snap = view.snapshot()
    assert snap.pending == () and snap.pending_ids == frozenset() and not snap.by_queue
    view.apply("job_removed", {})  # malformed: logged and ignored
