"""The scheduler's view: the replica of what it schedules, the journal the picker drains,
and the wake-ups on changes that may let a job run."""

from __future__ import annotations

import pytest
from sched_records import host, job, load, queue, sync
from xce_scheduler.view import SUBSCRIPTION, SchedulerView, free_slots

pytestmark = pytest.mark.timeout(30)


def test_the_scheduler_subscribes_to_what_it_schedules() -> None:
    assert SUBSCRIPTION.to_wire() == {"cluster": "all", "queues": "all", "hosts": "all",
                                      "jobs": "unfinished", "resvals": "all",
                                      "pend_reasons": "all"}


def test_a_sync_is_journaled_between_its_markers() -> None:
    view = SchedulerView()
    assert not view.complete
    load(view, [host("a")], [job(1), job(2, state="RUN"), job(3, state="DONE")])
    taken = view.take()
    assert taken[0][0] == "reset" and taken[0][1] == SUBSCRIPTION.kinds
    assert taken[-1] == ("complete", None, None) and view.complete
    assert [(k, key) for k, key, _ in taken[1:-1]] == [
        ("cluster", "cluster"), ("queues", "priority"), ("queues", "normal"), ("hosts", "a"),
        ("jobs", 1), ("jobs", 2)]  # job 3 is finished: not in the scheduler's scope
    assert view.take() == [] and view.pending_entries() == 0
    view.apply("sync_begin", sync([], [], mode="delta")[0][1])
    assert not view.complete and view.syncs_begun == 2
    assert view.take() == [("reset", frozenset({"resvals", "pend_reasons"}), None)]


def test_wake_only_on_changes_that_may_let_a_job_run() -> None:
    view = SchedulerView()
    load(view, [host("a", used=4)], [job(1)])
    view.wake.clear()
    view.apply("job", job(5))
    assert view.wake.is_set(), "a new pending job wakes the picker"
    view.wake.clear()
    view.apply("job", job(5, state="RUN"))
    assert not view.wake.is_set()
    view.apply("job", job(5, state="DONE"))
    assert view.wake.is_set(), "a job that stopped running freed slots"
    for event, data, wakes in [
            ("host", host("a", used=2), True), ("host", host("a", used=3), False),
            ("host", host("a", used=3, state="closed"), False), ("host", host("a", used=3), True),
            ("resvals", {"host": "a", "values": {"r1m": 0.5}}, False),
            ("pend_reasons", {"reasons": {"1": "x"}}, False),
            ("queue", queue("normal", 30, active=False), False),
            ("queue", queue("normal", 30, active=True), True)]:
        view.wake.clear()
        view.apply(event, data)
        assert view.wake.is_set() is wakes, (event, data)


def test_pushes_without_records_are_left_to_the_role() -> None:
    view = SchedulerView()
    assert view.apply("shutdown", {"server": "x"}) is False
    assert view.apply("whatever", 1) is False
    assert view.apply("job", {"no": "jobid"}) is True and view.take() == []


def test_free_slots() -> None:
    assert free_slots(host("a", slots=4, used=1)) == 3
    assert free_slots(host("a", slots=1, used=3)) == 0
    assert free_slots({"max_slots": "x"}) == 0
