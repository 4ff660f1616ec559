"""Queues and shapes: jobs parked in an inactive queue cost nothing per cycle, the order
across queues, and the picker's board (pending jobs by queue and shape)."""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job, load, queue
from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch, ReasonBatch
from xce_scheduler.board import Board
from xce_scheduler.matching import Requirements
from xce_scheduler.picker import Picker
from xce_scheduler.view import SchedulerView

from xcecore.resreq import Evaluator

pytestmark = pytest.mark.timeout(60)

QUEUES = [queue("normal", 30), queue("other", 30), queue("high", 50),
          queue("parked", 10, active=False)]


def make(hosts: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> tuple[Picker, list[Any]]:
    view = SchedulerView()
    load(view, hosts, jobs, QUEUES)
    sent: list[Any] = []
    return Picker(view, Requirements(Evaluator), sent.extend), sent


def reasons(sent: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sent:
        if isinstance(item, ReasonBatch):
            out.update(item.reasons)
    return out


def dispatched(sent: list[Any]) -> list[int]:
    return [d.jobid for d in sent if isinstance(d, Dispatch)]


def force(picker: Picker) -> None:
    picker.view.apply("host", dict(picker.view.replica.get("hosts", "a")))  # a change: full cycle


def test_parked_jobs_get_no_reason_and_are_skipped(mocker: Any) -> None:
    """An inactive queue's jobs are never given a reason by the scheduler (it is the
    queue's, derived where a job is shown), and are not looked at pass after pass."""
    picker, sent = make([host("a", slots=1)], [job(i, queue="parked") for i in range(1, 6)])
    picker.cycle()
    assert reasons(sent) == {} and dispatched(sent) == []
    spy = mocker.spy(picker, "_tail_reason")
    force(picker)
    picker.cycle()
    assert spy.call_count == 0 and picker.status.looked == 0, "an inactive queue is not looked at"
    # A new job in the parked queue: still no reason, still not looked at.
    picker.view.apply("job", job(9, queue="parked"))
    sent.clear()
    picker.cycle()
    assert reasons(sent) == {} and picker.status.looked == 0


def test_a_reactivated_queue_gets_its_reasons_from_the_picker() -> None:
    """Jobs that waited in an inactive queue are looked at when it is activated: those that
    fit nowhere get the picker's reason (unless the controller already has that one)."""
    picker, sent = make([host("a", slots=1, used=1)],
                        [job(1, queue="parked"), job(2, queue="parked")])
    picker.cycle()
    assert reasons(sent) == {}
    picker.view.apply("queue", queue("parked", 10, active=True))
    sent.clear()
    picker.cycle()
    assert reasons(sent) == {"1": R.NO_SLOTS, "2": R.NO_SLOTS}
    picker.view.apply("pend_reasons", {"reasons": reasons(sent)})
    # Inactivated and activated again: the controller still has their reasons, none re-sent.
    picker.view.apply("queue", queue("parked", 10, active=False))
    picker.cycle()
    picker.view.apply("queue", queue("parked", 10, active=True))
    sent.clear()
    picker.cycle()
    assert reasons(sent) == {} and picker.status.looked >= 1


def test_activated_queue_dispatches_its_parked_jobs() -> None:
    picker, sent = make([host("a", slots=2)], [job(1, queue="parked"), job(2, queue="parked")])
    picker.cycle()
    assert dispatched(sent) == []
    picker.view.apply("queue", queue("parked", 10, active=True))
    sent.clear()
    picker.cycle()
    assert dispatched(sent) == [1, 2]


def test_order_across_queues_follows_changes() -> None:
    jobs = [job(1, queue="other", submit_time=5.0), job(2, queue="normal", submit_time=3.0),
            job(3, queue="high", submit_time=9.0), job(4, queue="normal", submit_time=7.0),
            job(5, queue="other", submit_time=1.0)]
    picker, sent = make([host("a", slots=1, used=1)], jobs)
    picker.cycle()
    assert dispatched(sent) == []
    picker.view.apply("job", job(6, queue="normal", submit_time=0.5))
    picker.view.apply("job", {**job(3, queue="high"), "state": "RUN"})
    picker.view.apply("host", host("a", slots=3, used=1))
    sent.clear()
    picker.cycle()
    assert dispatched(sent) == [6, 5]
    picker.view.apply("host", host("a", slots=9, used=3))
    sent.clear()
    picker.cycle()  # queues of equal priority merged by submit time; the higher one first
    assert dispatched(sent) == [2, 1, 4]


def test_board_shapes_follow_queue_moves_and_reasons() -> None:
    view = SchedulerView()
    load(view, [host("a")], [job(1), job(2, queue="parked"), job(3, ntasks=2)], QUEUES)
    board = Board()
    board.drain(view.take())
    assert {n: sorted(s.key for s in shapes.values()) for n, shapes in board.by_queue.items()} == {
        "normal": [("", 1), ("", 2)]}
    assert board.parked == {"parked": {2: view.replica.get("jobs", 2)}}, "in no shape"
    assert board.complete and sorted(board.pending) == [1, 2, 3]
    view.apply("job", job(2, queue="normal"))  # moved to another queue (switch)
    view.apply("pend_reasons", {"reasons": {"1": R.NO_SLOTS}})
    drained = board.drain(view.take())
    assert set(board.by_queue) == {"normal"} and drained.echoed == [(1, R.NO_SLOTS)]
    assert board.parked == {}
    assert board.current_reason(1) == R.NO_SLOTS and board.current_reason(2) is None
    shape = board.shape(1)
    assert shape is board.shape(2) and list(shape.jobs) == [(1.0, 1), (2.0, 2)]
    # The shape has no reason yet: all of its jobs will be looked at; once it has one, only
    # the jobs new to it are (their reason is to be worked out).
    assert shape.fresh == set()
    shape.reason = R.NO_SLOTS
    view.apply("job", job(4))
    board.drain(view.take())
    assert shape.fresh == {4} and board.shape(4) is shape
    view.apply("job", {**job(4), "state": "RUN"})
    view.apply("job", {**job(1), "state": "RUN"})
    view.apply("job", {**job(2), "state": "DONE"})  # out of the scope: removed
    view.apply("job", job(3, ntasks=2, submit_time=0.5))  # same shape, a new place in it
    drained = board.drain(view.take())
    assert sorted(drained.left) == [1, 2, 4] and list(board.by_queue["normal"]) == [("", 2)]
    assert shape.fresh == set(), "a job that left is not fresh any more"
    assert list(board.shape(3).jobs) == [(0.5, 3)] and sorted(board.pending) == [3]
    assert view.replica.get("jobs", 1)["state"] == "RUN" and view.replica.get("jobs", 2) is None


def test_parked_jobs_take_their_shapes_when_the_queue_is_activated() -> None:
    view = SchedulerView()
    load(view, [host("a")], [job(1, queue="parked"), job(2, queue="parked", ntasks=2), job(3)],
         QUEUES)
    board = Board()
    board.drain(view.take())
    assert sorted(board.parked["parked"]) == [1, 2] and "parked" not in board.by_queue
    view.apply("job", {**job(1, queue="parked"), "state": "EXIT"})  # killed while parked
    drained = board.drain(view.take())
    assert drained.left == [1] and sorted(board.parked["parked"]) == [2]
    assert sorted(board.pending) == [2, 3]
    view.apply("queue", queue("parked", 10, active=True))
    board.drain(view.take())
    assert board.parked == {} and board.shape(2) is not None and board.shape(2).ntasks == 2
    view.apply("queue", queue("parked", 10, active=False))  # shaped jobs stay shaped; new park
    view.apply("job", job(4, queue="parked"))
    board.drain(view.take())
    assert sorted(board.parked["parked"]) == [4] and board.shape(2) is not None
    # A sync that no longer has the queue: its jobs are shaped at the sync's end.
    board.drain([("reset", frozenset({"queues"}), None), ("complete", None, None)])
    assert board.parked == {} and board.shape(4) is not None


def test_a_malformed_pending_job_is_not_scheduled_and_changes_nothing_else(caplog: Any) -> None:
    picker, sent = make([host("a", slots=4)], [job(1), {**job(2), "ntasks": "two"},
                                                {**job(3), "submit_time": "later"}, job(4)])
    picker.cycle()
    assert dispatched(sent) == [1, 4] and sorted(picker.board.pending) == [1, 4]
