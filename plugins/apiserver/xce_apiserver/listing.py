"""Job listings built in bounded slices that give way to writes.

A page of 1,000 jobs costs milliseconds of Python (each job's client view, then its JSON);
built in one go on the event loop it holds every other request behind it, and a client that
pages back to back would slow every POST by a page each. So a listing is built
:data:`SLICE` jobs at a time, and between two slices it lets the loop run: the requests that
arrived during the slice start, and while writes are in flight the listing waits until they
are answered (at most :data:`YIELD_MAX` per slice, so a listing never starves either). The loop's longest stall
while paging is then about one slice (``xce_apiserver_loop_lag_seconds``).

Writes are the requests that are not ``GET``/``HEAD`` (:class:`WritesFirst` counts them from
their arrival to their last byte). Event streams and listings are ``GET``: they never count.

A listing stays stable under concurrent changes: each slice goes on from the last job id the
one before looked at, so a job that matches throughout appears exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import anyio.lowlevel

from xce_apiserver.envelope import dumps
from xce_apiserver.hosts import client_job
from xce_apiserver.store import SCAN_BUDGET, Store

SLICE = 50
"""Jobs built and encoded between two turns of the event loop (~0.15 ms of CPU: what a write
arriving meanwhile may wait)."""

SLICE_SCAN = 2_000
"""Jobs one slice may look at (a filter that matches little costs a slice this much)."""

YIELD_MAX = 0.02
"""Seconds a listing waits, between two slices, for the writes in flight to be answered."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_READS = frozenset({"GET", "HEAD"})


class WriteGate:
    """The writes in flight, and a wait for there to be none (event loop only)."""

    def __init__(self) -> None:
        self.inflight = 0
        self.waits = 0  # listings' slices that waited for writes (a figure for tests)
        self._idle: anyio.Event | None = None

    def begin(self) -> None:
        """A write arrived."""
        self.inflight += 1

    def end(self) -> None:
        """A write was answered (or failed)."""
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            idle, self._idle = self._idle, None
            if idle is not None:
                idle.set()

    async def give_way(self, most: float = YIELD_MAX) -> None:
        """Let the loop run other work: first the requests that arrived meanwhile, then the
        writes in flight until they are answered (waiting at most ``most`` s in all)."""
        # Two turns of the loop: in the first its reader callbacks take in what arrived
        # during the slice and create the requests' tasks, in the second those tasks start
        # -- and a write counts itself in flight (WritesFirst) before its first await.
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        if self.inflight:
            self.waits += 1
            if self._idle is None:
                self._idle = anyio.Event()
            with anyio.move_on_after(most):
                await self._idle.wait()


class WritesFirst:
    """ASGI middleware counting the writes in flight into a :class:`WriteGate`."""

    def __init__(self, app: ASGIApp, gate: WriteGate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in _READS:
            await self.app(scope, receive, send)
            return
        self.gate.begin()
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.end()


def jobs_json(jobs: list[dict[str, Any]], keep: list[str] | None) -> bytes:
    """The client views of ``jobs`` (only the fields ``keep`` names, if given) as a JSON array."""
    views = [client_job(j) for j in jobs]
    if keep is not None:
        views = [{k: j.get(k) for k in keep} for j in views]
    return dumps(views)


class Filters:
    """What a listing selects and shows: states, owner, queue, array, and the fields kept."""

    __slots__ = ("array", "keep", "queue", "states", "user")

    def __init__(self, states: list[str] | None = None, user: str | None = None,
                 queue: str | None = None, array: int | None = None,
                 keep: list[str] | None = None) -> None:
        self.states, self.user, self.queue, self.array, self.keep = states, user, queue, array, keep


async def slices(store: Store, gate: WriteGate, after: int, filters: Filters, limit: int | None,
                 budget: int | None = SCAN_BUDGET) -> AsyncIterator[tuple[bytes, int, int | None]]:
    """The matching jobs above ``after`` in id order, a slice at a time: ``(the slice's jobs
    as JSON array items without brackets, how many, the cursor after it or None at the end)``.

    Stops after ``limit`` jobs (None: every one) or once ``budget`` jobs were looked at
    (None: no bound), with the cursor to go on from; the loop runs other work between two
    slices (:meth:`WriteGate.give_way`)."""
    count = scanned = 0
    first = True
    while True:
        want = SLICE if limit is None else min(SLICE, limit - count)
        look = SLICE_SCAN if budget is None else min(SLICE_SCAN, budget - scanned)
        if not first:
            await gate.give_way()
        first = False
        page = store.page_jobs(after=after, limit=want, states=filters.states, user=filters.user,
                               queue=filters.queue, array=filters.array, budget=look)
        scanned += page.scanned
        count += len(page.jobs)
        body = jobs_json(page.jobs, filters.keep)[1:-1] if page.jobs else b""
        full = (limit is not None and count >= limit) or (budget is not None and scanned >= budget)
        yield body, len(page.jobs), page.next
        if page.next is None or full:
            return
        after = page.next


async def page_body(store: Store, gate: WriteGate, after: int, filters: Filters,
                    limit: int) -> bytes:
    """One page's envelope: at most ``limit`` jobs and the next page's cursor."""
    parts: list[bytes] = []
    count, cursor = 0, None
    async for body, n, nxt in slices(store, gate, after, filters, limit):
        cursor = nxt
        if n:
            parts.append(body)
            count += n
    after_b = b"null" if cursor is None else b'"' + str(cursor).encode() + b'"'
    return (b'{"code":200,"msg":"ok","data":[' + b",".join(parts) + b'],"count":'
            + str(count).encode() + b',"next":' + after_b + b"}")


async def stream_body(store: Store, gate: WriteGate, after: int,
                      filters: Filters) -> AsyncIterator[bytes]:
    """Every matching job as one envelope, streamed a slice at a time."""
    yield b'{"code":200,"msg":"ok","data":['
    count = 0
    async for body, n, _ in slices(store, gate, after, filters, None, None):
        if n:
            yield (b"," + body) if count else body
            count += n
    yield b'],"count":' + str(count).encode() + b',"next":null}'
