"""What a picker cycle costs follows what changed: counted in jobs looked at, not timed.

Parked jobs (an inactive queue) are never looked at nor given a reason; a shape whose first job does not fit is
left alone for the rest of the cycle; reasons go in bounded batches and are worked out again
after every sync; nothing that says "fits nowhere" is sent from a partial view.
"""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job, load, queue, sync
from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch, ReasonBatch
from xce_scheduler.matching import Requirements
from xce_scheduler.picker import REASON_BATCH, Picker
from xce_scheduler.view import SchedulerView

from xcecore.resreq import Evaluator

pytestmark = pytest.mark.timeout(120)

QUEUES = [queue("normal", 30), queue("parked", 10, active=False)]


def make(hosts: list[dict[str, Any]], jobs: list[dict[str, Any]], **kw: Any) -> tuple[Picker, list[Any]]:
    view = SchedulerView()
    load(view, hosts, jobs, QUEUES)
    sent: list[Any] = []
    return Picker(view, Requirements(Evaluator), sent.extend, **kw), sent


def dispatched(sent: list[Any]) -> list[int]:
    return [d.jobid for d in sent if isinstance(d, Dispatch)]


def reasons(sent: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sent:
        if isinstance(item, ReasonBatch):
            out.update(item.reasons)
    return out


def echo(picker: Picker, sent: list[Any]) -> None:
    """The controller pushes back the reasons it was sent."""
    got = reasons(sent)
    if got:
        picker.view.apply("pend_reasons", {"reasons": got})
    sent.clear()


def test_parked_jobs_are_looked_at_once_and_then_cost_nothing() -> None:
    n = 30_000
    picker, sent = make([host("a", slots=4)], [job(i, queue="parked") for i in range(1, n + 1)])
    picker.cycle()
    assert reasons(sent) == {}, "an inactive queue's reason is the queue's, never sent per job"
    assert picker.status.looked == 0
    picker.cycle()
    assert len(picker.reasons) == 0, "answered requests are not remembered"
    for i in range(5):  # each pass after one push looks at no parked job
        picker.view.apply("host", host("a", slots=4, used=i % 2))
        picker.view.apply("job", job(n + 1 + i))  # and one new job in an active queue
        picker.cycle()
        assert picker.status.looked == 1 and dispatched(sent) == [n + 1 + i]
        assert reasons(sent) == {}
        sent.clear()
        picker.view.apply("job", job(n + 1 + i, state="RUN"))


def test_reasons_go_in_bounded_batches() -> None:
    n = 3 * REASON_BATCH + 7
    picker, sent = make([host("a", slots=4)],
                        [job(i, resreq="select[ncpus>999]") for i in range(1, n + 1)])
    picker.cycle()
    batches = [s for s in sent if isinstance(s, ReasonBatch)]
    assert len(batches) == 4 and all(len(b.reasons) <= REASON_BATCH for b in batches)
    assert len(reasons(sent)) == n and set(reasons(sent).values()) == {R.NO_HOST}


def test_a_shape_that_does_not_fit_is_left_alone_for_the_rest_of_the_cycle() -> None:
    jobs = [job(i) for i in range(1, 20_001)] + [job(20_001, ntasks=2), job(20_002, resreq="select[ncpus>99]")]
    picker, sent = make([host("a", slots=3), host("b", slots=2)], jobs)
    assert picker.cycle() == 5
    # 5 placed, the sixth single-task job did not fit: its shape stops there. The two-task
    # job fails on its own (fewer slots only), the other requirement fits no host.
    assert picker.status.looked == 8
    got = reasons(sent)
    assert len(got) == 20_002 - 5 and got["20002"] == R.NO_HOST and got["6"] == R.NO_SLOTS
    echo(picker, sent)
    for n in range(1, 6):
        picker.view.apply("job", job(n, state="RUN"))
    picker.view.apply("host", host("a", slots=3, used=3))
    picker.view.apply("host", host("b", slots=2, used=2))
    assert picker.cycle() == 0 and picker.status.looked == 3
    # Slots free up one at a time: each cycle looks at a handful of jobs, never the 20,000.
    running = {"a": [1, 2, 3], "b": [4, 5]}
    slots = {"a": 3, "b": 2}
    for n in range(6, 16):
        name = "a" if n % 2 else "b"
        done = running[name].pop(0)
        picker.view.apply("job", job(done, state="DONE"))
        picker.view.apply("host", host(name, slots=slots[name], used=slots[name] - 1))
        picker.cycle()
        assert dispatched(sent) == [n] and picker.status.looked == 4
        assert reasons(sent) == {}, "the shape's reason did not change: nothing to resend"
        sent.clear()
        picker.view.apply("job", job(n, state="RUN"))
        picker.view.apply("host", host(name, slots=slots[name], used=slots[name]))
        running[name].append(n)


def test_the_cost_of_a_dispatch_does_not_grow_with_the_pending_count() -> None:
    looked = []
    for n in (1_000, 50_000):
        picker, _sent = make([host(f"h{i}", slots=8) for i in range(50)],
                             [job(i, resreq=("", "select[ncpus>=8]", "span[hosts=1]")[i % 3],
                                  ntasks=1 + i % 2) for i in range(1, n + 1)], max_dispatch=200)
        assert picker.cycle() == 200
        looked.append(picker.status.looked)
    assert looked[0] == looked[1] <= 210


def test_no_placement_reason_from_a_partial_view_and_all_of_them_after_each_sync() -> None:
    view = SchedulerView()
    sent: list[Any] = []
    picker = Picker(view, Requirements(Evaluator), sent.extend)
    frames = sync([host("a", slots=1)], [job(1), job(2), job(3, queue="parked")], QUEUES)
    for event, data in frames[:-1]:  # everything but sync_end: the view is still partial
        view.apply(event, data)
    picker.cycle()
    assert dispatched(sent) == [1], "a partial view still schedules (the controller checks)"
    assert reasons(sent) == {} and picker.status.view_complete is False
    view.apply(*frames[-1])
    picker.cycle()
    assert reasons(sent) == {"2": R.NO_SLOTS}
    echo(picker, sent)
    picker.view.apply("host", host("a", slots=1))
    picker.cycle()
    assert reasons(sent) == {}
    # A re-join after a failover: a delta sync, and the new primary has no reasons at all.
    for event, data in [*sync([], [], QUEUES, mode="delta", rev=2)[:1], ("sync_end", {"rev": 2})]:
        view.apply(event, data)
    picker.cycle()
    assert reasons(sent) == {"2": R.NO_SLOTS}, "only what the queue does not say is re-sent"
