"""The allocator: one jobdispatch_many per hand-off (bounded), each job's answer final, reasons batched."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from xce_scheduler.allocator import (
    BATCH_ELEMENTS,
    BATCH_ITEMS,
    Allocator,
    Dispatch,
    DispatchBatch,
    ReasonBatch,
    batches,
    describe_alloc,
)

from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(30)


async def _serve(alloc: Allocator, items: list[Any], until: Any) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(alloc.run)
        alloc.submit(items)
        with anyio.fail_after(5):
            while not until():
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


def test_one_batch_per_hand_off_each_job_answered_on_its_own() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    answers: list[tuple[int, bool]] = []
    lost: list[str] = []

    async def call(op: str, args: dict[str, Any]) -> Any:
        calls.append((op, args))
        if op == "set_pend_reason":
            raise RemoteError("INTERNAL", "lost")
        assert op == "jobdispatch_many"
        return {"results": [{"jobid": d["jobid"], "state": "RUN"} if d["jobid"] != 2 else
                            {"jobid": 2, "code": "CONFLICT", "message": "job 2 is not pending"}
                            for d in args["dispatches"]]}

    alloc = Allocator(call, on_answer=lambda j, ok: answers.append((j, ok)),
                      on_reasons_lost=lost.extend, concurrency=2)
    items = [Dispatch(1, [{"host": "a", "ntasks": 1}]), Dispatch(2, [{"host": "a", "ntasks": 1}]),
             Dispatch(3, [{"host": "b", "ntasks": 2}], ([{"host": "c", "ntasks": 2}],)),
             ReasonBatch({"4": "x"})]
    anyio.run(_serve, alloc, items, lambda: len(answers) == 3 and lost)
    assert sorted(answers) == [(1, True), (2, False), (3, True)]
    assert lost == ["4"]
    assert [op for op, _ in calls].count("jobdispatch_many") == 1
    assert ("jobdispatch_many", {"dispatches": [
        {"jobid": 1, "alloc": [{"host": "a", "ntasks": 1}]},
        {"jobid": 2, "alloc": [{"host": "a", "ntasks": 1}]},
        {"jobid": 3, "alloc": [{"host": "b", "ntasks": 2}], "more": [[{"host": "c", "ntasks": 2}]]},
    ]}) in calls
    st = alloc.status.as_dict()
    assert (st["dispatched"], st["refused"], st["failed"], st["batches"]) == (2, 1, 0, 1)


@pytest.mark.parametrize("error", [RemoteError("STORAGE", "disk full"), RuntimeError("boom"),
                                   KeyError("results")])
def test_a_batch_that_fails_fails_each_of_its_jobs(error: Exception) -> None:
    answers: list[tuple[int, bool]] = []

    async def call(op: str, args: dict[str, Any]) -> Any:
        if isinstance(error, KeyError):
            return {"dispatched": 0}  # a malformed answer: no results
        raise error

    alloc = Allocator(call, on_answer=lambda j, ok: answers.append((j, ok)), on_reasons_lost=print)
    items = [Dispatch(i, [{"host": "a", "ntasks": 1}]) for i in (1, 2, 3)]
    anyio.run(_serve, alloc, items, lambda: len(answers) == 3)
    assert answers == [(1, False), (2, False), (3, False)]
    st = alloc.status.as_dict()
    refused = 3 if isinstance(error, RemoteError) else 0
    assert (st["dispatched"], st["refused"], st["failed"]) == (0, refused, 3 - refused)


def test_batches_bounded_by_jobs_and_allocations() -> None:
    one = [{"host": "a", "ntasks": 1}]
    items: list[Any] = [Dispatch(i, one) for i in range(BATCH_ITEMS * 2 + 5)]
    sizes = [len(b.items) for b in batches(items)]
    assert sizes == [BATCH_ITEMS, BATCH_ITEMS, 5]
    # Array elements count against the allocation bound; an item above it goes alone; any
    # other item ends the run (order kept).
    big = Dispatch(1, one, tuple([one] * BATCH_ELEMENTS))
    half = Dispatch(2, one, tuple([one] * (BATCH_ELEMENTS // 2 - 1)))
    reasons = ReasonBatch({"9": "x"})
    out = batches([Dispatch(0, one), big, half, half, half, reasons, Dispatch(3, one)])
    assert [type(b).__name__ for b in out] == ["DispatchBatch"] * 4 + ["ReasonBatch", "DispatchBatch"]
    assert [[d.jobid for d in b.items] for b in out if isinstance(b, DispatchBatch)] == [
        [0], [1], [2, 2], [2], [3]]


def test_many_in_flight_while_one_is_blocked() -> None:
    release = anyio.Event()
    answers: list[int] = []

    async def call(op: str, args: dict[str, Any]) -> Any:
        jobids = [d["jobid"] for d in args["dispatches"]]
        if jobids == [1]:
            await release.wait()  # e.g. waiting in a reconnect
        return {"results": [{"jobid": j, "state": "RUN"} for j in jobids]}

    alloc = Allocator(call, on_answer=lambda j, ok: answers.append(j), on_reasons_lost=print,
                      concurrency=4)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alloc.run)
            for i in range(1, 4):  # three picker passes: three batches
                alloc.submit([Dispatch(i, [{"host": "a", "ntasks": 1}])])
            with anyio.fail_after(5):
                while len(answers) < 2:
                    await anyio.sleep(0.01)
            assert 1 not in answers
            release.set()
            while len(answers) < 3:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(go)
    assert answers[-1] == 1


def test_describe_alloc() -> None:
    assert describe_alloc([{"host": "a", "ntasks": 2}, {"host": "b", "ntasks": 1}]) == "a:2 b:1"
