"""The picker's per-queue caches: jobs parked in an inactive queue cost nothing per cycle,
each queue's order is reused while its jobs do not change, and the view's per-queue index."""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job, queue, state
from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch, ReasonBatch
from xce_scheduler.matching import Requirements
from xce_scheduler.picker import Picker
from xce_scheduler.view import SchedulerView

from xcecore.resreq import Evaluator

pytestmark = pytest.mark.timeout(60)

QUEUES = [queue("normal", 30), queue("other", 30), queue("high", 50),
          queue("parked", 10, active=False)]


def make(hosts: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> tuple[Picker, list[Any]]:
    view = SchedulerView()
    view.apply("state", state(hosts, jobs, QUEUES))
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
    picker.view.apply("host", dict(picker.view.snapshot().hosts["a"]))  # a change: full cycle


def test_parked_jobs_get_their_reason_once_then_are_skipped(mocker: Any) -> None:
    picker, sent = make([host("a", slots=1)], [job(i, queue="parked") for i in range(1, 6)])
    picker.cycle()
    got = reasons(sent)
    assert got == {str(i): R.QUEUE_INACTIVE for i in range(1, 6)}
    picker.view.apply("pend_reasons", {"reasons": got})
    sent.clear()
    picker.cycle()  # the pushed reasons changed the queue's jobs: looked at once more
    assert reasons(sent) == {}
    spy = mocker.spy(picker.reasons, "changes")
    force(picker)
    picker.cycle()
    assert spy.call_args.args[0] == {}, "an unchanged inactive queue is not looked at"
    # A new job in the parked queue: its queue is looked at again, only it gets a reason.
    picker.view.apply("job", job(9, queue="parked"))
    sent.clear()
    picker.cycle()
    assert reasons(sent) == {"9": R.QUEUE_INACTIVE}


def test_lost_reason_batch_is_sent_again_for_a_settled_queue() -> None:
    picker, sent = make([host("a", slots=1)], [job(1, queue="parked")])
    picker.cycle()
    assert reasons(sent) == {"1": R.QUEUE_INACTIVE}
    picker.forget_reasons(["1"])  # set_pend_reason failed
    sent.clear()
    picker.cycle()
    assert reasons(sent) == {"1": R.QUEUE_INACTIVE}


def test_activated_queue_dispatches_its_parked_jobs() -> None:
    picker, sent = make([host("a", slots=2)], [job(1, queue="parked"), job(2, queue="parked")])
    picker.cycle()
    assert dispatched(sent) == []
    picker.view.apply("queue", queue("parked", 10, active=True))
    sent.clear()
    picker.cycle()
    assert dispatched(sent) == [1, 2]


def test_order_across_queues_and_cached_order_follows_changes() -> None:
    jobs = [job(1, queue="other", submit_time=5.0), job(2, queue="normal", submit_time=3.0),
            job(3, queue="high", submit_time=9.0), job(4, queue="normal", submit_time=7.0),
            job(5, queue="other", submit_time=1.0)]
    picker, sent = make([host("a", slots=1, used=1)], jobs)
    picker.cycle()
    snap = picker.view.snapshot()
    assert [j["jobid"] for j in picker._ordered_jobs(snap)] == [3, 5, 2, 1, 4]
    picker.view.apply("job", job(6, queue="normal", submit_time=0.5))
    picker.view.apply("job", {**job(3, queue="high"), "state": "RUN"})
    snap = picker.view.snapshot()
    assert [j["jobid"] for j in picker._ordered_jobs(snap)] == [6, 5, 2, 1, 4]
    picker.view.apply("host", host("a", slots=3, used=1))
    sent.clear()
    picker.cycle()
    assert dispatched(sent) == [6, 5]


def test_view_index_follows_queue_moves_and_reasons() -> None:
    view = SchedulerView()
    view.apply("state", state([host("a")], [job(1), job(2, queue="parked")], QUEUES))
    first = view.snapshot()
    assert {n: [j["jobid"] for j in q.jobs] for n, q in first.by_queue.items()} == {
        "normal": [1], "parked": [2]}
    assert first.pending_ids == frozenset({1, 2})
    view.apply("job", job(2, queue="normal"))  # moved to another queue (switch)
    view.apply("pend_reasons", {"reasons": {"1": R.NO_SLOTS}})
    snap = view.snapshot()
    assert set(snap.by_queue) == {"normal"}
    assert {j["jobid"]: j["pend_reason"] for j in snap.by_queue["normal"].jobs} == {
        1: R.NO_SLOTS, 2: None}
    assert snap.by_queue["normal"].version != first.by_queue["normal"].version
    again = view.snapshot()
    assert again.by_queue["normal"] is snap.by_queue["normal"], "unchanged: reused"
    view.apply("job", {**job(1), "state": "RUN"})
    view.apply("job", {**job(2), "state": "DONE"})
    assert view.snapshot().by_queue == {} and view.snapshot().pending == ()
