"""The picker and job arrays: one entry that yields as many elements as fit, within the
array's %limit, in one proposal; the in-flight proposal ends when the array's record moves."""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job
from test_sched_picker import make, reasons
from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch

pytestmark = pytest.mark.timeout(60)


def array(jobid: int, left: int, limit: int | None = None, counts: dict[str, int] | None = None,
          **kw: Any) -> dict[str, Any]:
    return {**job(jobid, **kw), "array": {
        "spec": f"1-{left}", "limit": limit, "pending": [[1, left, 1]], "left": left, "size": left,
        "counts": counts or {}, "held": False}}


def proposals(sent: list[Any]) -> list[Dispatch]:
    return [d for d in sent if isinstance(d, Dispatch)]


def test_an_array_fills_free_slots_in_one_proposal() -> None:
    picker, sent = make([host("a", slots=3), host("b", slots=2)], [array(7, 100)])
    assert picker.cycle() == 1
    (p,) = proposals(sent)
    assert p.jobid == 7 and len(p.more) == 4
    taken: dict[str, int] = {}
    for a in p.every_alloc():
        taken[a["host"]] = taken.get(a["host"], 0) + a["ntasks"]
    assert taken == {"a": 3, "b": 2}
    sent.clear()
    picker.answered(7, True)
    assert picker.cycle() == 0  # still in flight: no second proposal for the same slots
    # The array's record moves (5 elements gone), the hosts fill: nothing fits, none proposed.
    picker.view.apply("host", host("a", slots=3, used=3))
    picker.view.apply("host", host("b", slots=2, used=2))
    picker.view.apply("job", array(7, 95, counts={"RUN": 5}))
    picker.cycle()
    assert not proposals(sent)
    picker.view.apply("host", host("b", slots=2, used=0))  # two elements finished there
    picker.cycle()
    (p,) = proposals(sent)
    assert p.jobid == 7 and [a["host"] for a in p.every_alloc()] == ["b", "b"]


def test_the_limit_caps_elements_and_gives_a_reason() -> None:
    picker, sent = make([host("a", slots=8)], [array(3, 50, limit=3, counts={"RUN": 1})])
    picker.cycle()
    (p,) = proposals(sent)
    assert len(p.every_alloc()) == 2  # 3 at once, 1 runs already
    sent.clear()
    picker.answered(3, True)
    picker.view.apply("job", array(3, 48, limit=3, counts={"RUN": 3}))
    picker.cycle()
    assert not proposals(sent)
    assert reasons(sent) == {"3": R.array_limit(3)}


def test_jobs_after_an_array_at_its_limit_still_go() -> None:
    jobs = [array(1, 10, limit=2, submit_time=1.0), job(2, submit_time=2.0)]
    picker, sent = make([host("a", slots=4)], jobs)
    picker.cycle()
    got = {p.jobid: len(p.every_alloc()) for p in proposals(sent)}
    assert got == {1: 2, 2: 1}  # the array first (submit time), to its limit; then the job


def test_a_pending_element_record_is_a_plain_job() -> None:
    element = {**job(9), "array": {"of": 3, "index": 4}}  # requeued: pending again
    picker, sent = make([host("a", slots=4)], [element])
    picker.cycle()
    (p,) = proposals(sent)
    assert (p.jobid, p.more, p.alloc) == (9, (), [{"host": "a", "ntasks": 1}])
