"""The allocator: an async task on the event loop that sends the picker's proposals.

The :class:`Dispatch` items of one hand-off (one picker pass) become ``jobdispatch_many``
calls of at most :data:`BATCH_ITEMS` jobs and :data:`BATCH_ELEMENTS` allocations each (one
call for a pass of the default ``max_dispatch_per_cycle``), several in flight at once, up to
``concurrency``; each :class:`ReasonBatch` one ``set_pend_reason``. The controller's answer
is final, per job: a refusal (CONFLICT: the job is no longer pending, a host is full or
closed) means the view was stale, so the proposal is dropped and the next push corrects the
view; a call that fails as a whole fails each of its jobs. Reconnects, redirects and the
re-join after ``jobdispatch_many`` (the scheduler's rejoin point) happen inside the client's
``call``; while one waits, the picker thread keeps cycling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from loguru import logger

from xce_scheduler.status import SchedulerStatus
from xcecore.schema.limits import DISPATCH_BATCH_MAX
from xcecore.wire import RemoteError

CallFn = Callable[[str, dict[str, Any]], Awaitable[Any]]
SUMMARY_EVERY = 1.0  # seconds between "dispatched N job(s)" lines while dispatching
BATCH_ITEMS = DISPATCH_BATCH_MAX  # jobs in one jobdispatch_many
BATCH_ELEMENTS = 1000  # allocations (array elements counted) in one; an item with more goes alone


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run job ``jobid`` with ``alloc`` (``[{"host": name, "ntasks": n}]``); a job array: its
    next pending element on ``alloc`` and one more on each of ``more``."""

    jobid: int
    alloc: list[dict[str, Any]]
    more: tuple[list[dict[str, Any]], ...] = ()

    def body(self) -> dict[str, Any]:
        """Its item of a ``jobdispatch_many``."""
        body: dict[str, Any] = {"jobid": self.jobid, "alloc": self.alloc}
        if self.more:
            body["more"] = list(self.more)
        return body

    def where(self) -> str:
        """Where it goes, for log lines."""
        if not self.more:
            return describe_alloc(self.alloc)
        return f"{len(self.more) + 1} array elements on {describe_alloc(self.every_alloc())}"

    def every_alloc(self) -> list[dict[str, Any]]:
        """Every host entry of every element (what the proposal takes, host by host)."""
        if not self.more:
            return self.alloc
        return [a for each in (self.alloc, *self.more) for a in each]


@dataclass(frozen=True, slots=True)
class DispatchBatch:
    """Dispatches sent in one ``jobdispatch_many``."""

    items: tuple[Dispatch, ...]


def batches(items: Iterable[Any]) -> list[Any]:
    """``items`` with each run of :class:`Dispatch` cut into batches (:class:`DispatchBatch`)
    within :data:`BATCH_ITEMS` and :data:`BATCH_ELEMENTS`; other items as they are, in order."""
    out: list[Any] = []
    run: list[Dispatch] = []
    elements = 0

    def close() -> None:
        nonlocal elements
        if run:
            out.append(DispatchBatch(tuple(run)))
            run.clear()
        elements = 0

    for item in items:
        if not isinstance(item, Dispatch):
            close()
            out.append(item)
            continue
        size = 1 + len(item.more)
        if run and (len(run) >= BATCH_ITEMS or elements + size > BATCH_ELEMENTS):
            close()
        run.append(item)
        elements += size
    close()
    return out


@dataclass(frozen=True, slots=True)
class ReasonBatch:
    """Set these pend reasons (job id as a string -> reason)."""

    reasons: dict[str, str]


def describe_alloc(alloc: Sequence[dict[str, Any]]) -> str:
    """``n1:2 n2:1`` for log lines."""
    return " ".join(f"{a['host']}:{a['ntasks']}" for a in alloc)


class Allocator:
    """Sends proposals through ``call`` (``ctx.client.call``) and reports each answer.

    ``on_answer(jobid, ok)`` tells the picker how a dispatch ended; ``on_reasons_lost(keys)``
    that a reason batch was not delivered. :meth:`submit` is the thread-side entry point
    (``Picker.submit``): it must run on the event loop, so the role wraps it in a portal call.
    """

    def __init__(
        self,
        call: CallFn,
        *,
        on_answer: Callable[[int, bool], None],
        on_reasons_lost: Callable[[Iterable[str]], None],
        status: SchedulerStatus | None = None,
        concurrency: int = 32,
    ) -> None:
        self._call = call
        self._on_answer = on_answer
        self._on_reasons_lost = on_reasons_lost
        self.status = status or SchedulerStatus()
        self._slots = anyio.Semaphore(max(1, concurrency))
        self._dispatched = 0  # since the last summary line
        self._since = time.monotonic()
        self._send: MemoryObjectSendStream[Any]
        self._receive: MemoryObjectReceiveStream[Any]
        # Unbounded: the picker must never block on the allocator; the queue is bounded by
        # the number of pending jobs, since a job is proposed again only after its answer.
        self._send, self._receive = anyio.create_memory_object_stream[Any](math.inf)

    def submit(self, items: Iterable[Any]) -> None:
        """Queue proposals (one hand-off's dispatches are batched); call on the event loop
        (never blocks)."""
        for item in batches(items):
            self._send.send_nowait(item)

    async def run(self) -> None:
        """Serve proposals until cancelled."""
        async with anyio.create_task_group() as tg, self._receive:
            async for item in self._receive:
                await self._slots.acquire()
                tg.start_soon(self._handle, item)

    async def _handle(self, item: Any) -> None:
        self.status.add(allocator_busy=1)
        try:
            if isinstance(item, DispatchBatch):
                await self._dispatch(item)
            elif isinstance(item, ReasonBatch):
                await self._reasons(item)
            else:
                logger.error("scheduler: allocator got an unknown item {!r}; dropped", item)
        finally:
            self.status.add(allocator_busy=-1)
            self._slots.release()
            if self.status.allocator_busy == 0:
                self._summary(True)

    async def _dispatch(self, batch: DispatchBatch) -> None:
        items = batch.items
        try:
            result = await self._call("jobdispatch_many",
                                      {"dispatches": [item.body() for item in items]})
            answers = result["results"]
            if len(answers) != len(items):
                raise ValueError(f"{len(answers)} results for {len(items)} dispatches")
        except RemoteError as exc:
            self.status.add(refused=len(items))
            logger.info("scheduler: controller refused a batch of {} dispatch(es), jobs {}..{} "
                        "({}: {}); dropped, the next push corrects the view", len(items),
                        items[0].jobid, items[-1].jobid, exc.code, exc.message)
            for item in items:
                self._on_answer(item.jobid, False)
            return
        except Exception as exc:
            self.status.add(failed=len(items))
            logger.warning("scheduler: jobdispatch_many of {} job(s), {}..{}, failed ({}: {}); "
                           "they stay pending for a later cycle", len(items), items[0].jobid,
                           items[-1].jobid, type(exc).__name__, exc)
            for item in items:
                self._on_answer(item.jobid, False)
            return
        ok, refused = 0, []
        for item, answer in zip(items, answers, strict=True):
            if answer.get("state") == "RUN":
                ok += 1
                # One INFO line a second at most (a line per job was a fifth of the event
                # loop's time while 10,000 jobs were dispatched); each job at DEBUG.
                logger.debug("scheduler: dispatched job {} to {}", item.jobid, item.where())
                self._on_answer(item.jobid, True)
            else:
                logger.debug("scheduler: controller refused job {} on {} ({}: {})", item.jobid,
                             item.where(), answer.get("code"), answer.get("message"))
                refused.append((item, answer))
                self._on_answer(item.jobid, False)
        if refused:  # one line per batch, naming the first
            item, answer = refused[0]
            logger.info("scheduler: controller refused {} of {} dispatch(es) in a batch (the first: "
                        "job {} on {}, {}: {}); dropped, the next push corrects the view",
                        len(refused), len(items), item.jobid, item.where(), answer.get("code"),
                        answer.get("message"))
        self.status.add(dispatched=ok, refused=len(items) - ok, batches=1)
        self._dispatched += ok
        self._summary(False)

    def _summary(self, idle: bool) -> None:
        """Log how many jobs were dispatched since the last such line: once ``SUMMARY_EVERY``
        seconds have passed, or when nothing is left in flight (``idle``)."""
        now = time.monotonic()
        if self._dispatched and (idle or now - self._since >= SUMMARY_EVERY):
            logger.info("scheduler: dispatched {} job(s) in the last {:.1f} s ({} refused, {} "
                        "failed in all)", self._dispatched, now - self._since,
                        self.status.refused, self.status.failed)
            self._dispatched, self._since = 0, now
        elif not self._dispatched:
            self._since = now

    async def _reasons(self, item: ReasonBatch) -> None:
        try:
            result = await self._call("set_pend_reason", {"reasons": item.reasons})
        except Exception as exc:
            logger.warning("scheduler: set_pend_reason for {} job(s) failed ({}: {}); sent "
                           "again next cycle", len(item.reasons), type(exc).__name__, exc)
            self._on_reasons_lost(list(item.reasons))
        else:
            logger.debug("scheduler: pend reasons of {} job(s) sent ({})", len(item.reasons),
                         result)
