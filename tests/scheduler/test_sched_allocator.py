"""The allocator: jobdispatch per proposal, the controller's answer is final, reasons batched."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from xce_scheduler.allocator import Allocator, Dispatch, ReasonBatch, describe_alloc

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


def test_dispatch_answers() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    answers: list[tuple[int, bool]] = []
    lost: list[str] = []

    async def call(op: str, args: dict[str, Any]) -> Any:
        calls.append((op, args))
        if op == "jobdispatch" and args["jobid"] == 2:
            raise RemoteError("CONFLICT", "job 2 is not pending")
        if op == "jobdispatch" and args["jobid"] == 3:
            raise RuntimeError("boom")
        if op == "set_pend_reason":
            raise RemoteError("INTERNAL", "lost")
        return {"jobid": args.get("jobid"), "state": "RUN"}

    alloc = Allocator(call, on_answer=lambda j, ok: answers.append((j, ok)),
                      on_reasons_lost=lost.extend, concurrency=2)
    items = [Dispatch(1, [{"host": "a", "ntasks": 1}]), Dispatch(2, [{"host": "a", "ntasks": 1}]),
             Dispatch(3, [{"host": "b", "ntasks": 2}]), ReasonBatch({"4": "x"})]
    anyio.run(_serve, alloc, items, lambda: len(answers) == 3 and lost)
    assert sorted(answers) == [(1, True), (2, False), (3, False)]
    assert lost == ["4"]
    assert ("jobdispatch", {"jobid": 1, "alloc": [{"host": "a", "ntasks": 1}]}) in calls
    st = alloc.status.as_dict()
    assert (st["dispatched"], st["refused"], st["failed"]) == (1, 1, 1)


def test_many_in_flight_while_one_is_blocked() -> None:
    release = anyio.Event()
    answers: list[int] = []

    async def call(op: str, args: dict[str, Any]) -> Any:
        if args["jobid"] == 1:
            await release.wait()  # e.g. waiting in a reconnect
        return {}

    alloc = Allocator(call, on_answer=lambda j, ok: answers.append(j), on_reasons_lost=print,
                      concurrency=4)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alloc.run)
            alloc.submit([Dispatch(i, [{"host": "a", "ntasks": 1}]) for i in range(1, 4)])
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
