"""The scheduler role's object: its view, picker, allocator and status, wired for one process.

The view exists from the role object's birth (pushes start right after the join, before the
monitors and ``main`` run); the rest (:class:`SchedulerApp`) is built when the runtime asks
for the monitors, once the client exists.

Rejoin points: ``hello`` and ``jobdispatch_many``. Every op the scheduler sends needs a joined
member, so after a reconnect its first dispatch would only earn ``NOT_JOINED`` (one
wasted round trip per failover). Instead, while a rejoin is pending the scheduler says
``hello`` first (also as soon as the connection is back): the client re-joins right after it,
and the dispatch goes out on a joined connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
from loguru import logger

from xce_scheduler.allocator import Allocator
from xce_scheduler.matching import Requirements
from xce_scheduler.picker import Picker
from xce_scheduler.status import SchedulerStatus, StatusReporter
from xce_scheduler.view import SUBSCRIPTION, SchedulerView
from xcecore.candidates import Candidate
from xcecore.role import Handled, Monitor, Role, RoleContext

REJOIN_POINTS = frozenset({"hello", "jobdispatch_many"})
HELLO_TIMEOUT = 5.0  # a hello sent to re-join waits at most this long (it is only a nudge)


@dataclass
class SchedulerApp:
    """One scheduler: its view, picker (thread side) and allocator (event-loop side)."""

    view: SchedulerView
    picker: Picker
    allocator: Allocator
    status: SchedulerStatus


class SchedulerRole(Role):
    """Decides where pending jobs run: a picker thread proposes, the allocator dispatches."""

    rejoin_points = REJOIN_POINTS
    subscription = SUBSCRIPTION

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.view = SchedulerView(name=ctx.identity)
        self._app: SchedulerApp | None = None

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """Feed the view's replica (the sync after each join, then the changes)."""
        if not self.view.apply(event, data) and event == "shutdown":
            logger.info("{}: controller {} is shutting down; the client moves to the next "
                        "primary", self.ctx.identity, (data or {}).get("server"))
        return None

    def connection_state(self, state: str, candidate: Candidate | None, detail: str) -> Handled:
        """Back on a primary with a rejoin pending: say hello now, so the client re-joins."""
        client = self.ctx.client
        if state == "connected" and client is not None and client.rejoin_pending:
            return self._hello()
        return None

    async def _hello(self) -> None:
        client = self.ctx.client
        assert client is not None
        with anyio.move_on_after(HELLO_TIMEOUT):
            try:
                await client.call("hello", {})
            except Exception as exc:  # the next rejoin point or the NOT_JOINED retry heals it
                logger.info("{}: hello to re-join failed ({}); re-joining later", self.ctx.identity, exc)

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        """The allocator's controller call: ``hello`` first while a rejoin is pending."""
        client = self.ctx.client
        assert client is not None
        if client.rejoin_pending:
            await client.call("hello", {})
        return await client.call(op, args)

    @property
    def app(self) -> SchedulerApp:
        """The scheduler's parts, built on first use (once the client exists)."""
        if self._app is None:
            self._app = self._build()
        return self._app

    def _build(self) -> SchedulerApp:
        ctx = self.ctx
        if ctx.client is None:
            raise RuntimeError("the scheduler needs a connected client (it is a client role)")
        section = ctx.section
        status = SchedulerStatus()
        reporter = StatusReporter(status, section["status_file"],
                                  log_interval=section["status_log_interval"])
        holder: dict[str, Picker] = {}
        allocator = Allocator(
            self.call,
            on_answer=lambda jobid, ok: holder["picker"].answered(jobid, ok),
            on_reasons_lost=lambda keys: holder["picker"].forget_reasons(keys),
            status=status,
            concurrency=section["dispatch_concurrency"],
        )

        def submit(items: list[Any]) -> None:
            # The picker is a thread; the allocator's queue belongs to the event loop.
            ctx.bridge.call(allocator.submit, items)

        picker = Picker(self.view, Requirements(ctx.pm.resreq_evaluator), submit, status,
                        interval=section["interval"],
                        max_dispatch=section["max_dispatch_per_cycle"],
                        load_interval=section["load_interval"],
                        reporter=reporter)
        holder["picker"] = picker
        return SchedulerApp(self.view, picker, allocator, status)

    def metrics(self) -> list[Any]:
        """``xce_scheduler_*`` from the picker's and allocator's status."""
        return [] if self._app is None else self._app.status.metrics()

    def monitors(self) -> list[Monitor]:
        """The job picker, on its own thread."""
        return [Monitor("picker", self.app.picker.run)]

    async def main(self) -> None:
        """Run the allocator on the event loop until the role stops."""
        app = self.app
        logger.info("{}: scheduler running (dispatch concurrency {}, status file {})",
                    self.ctx.identity, self.ctx.section["dispatch_concurrency"],
                    self.ctx.section["status_file"] or "none")
        await app.allocator.run()
