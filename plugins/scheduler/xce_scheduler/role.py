"""The scheduler role's parts wired together for one process: view, picker, allocator, status.

The view exists from the first push (pushes start right after the join, before the monitors
and ``main`` run), so it is kept per client; the rest is built once per role context, by
whichever of the picker monitor and ``main`` asks first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from loguru import logger

from xce_scheduler.allocator import Allocator
from xce_scheduler.matching import Requirements
from xce_scheduler.picker import Picker
from xce_scheduler.status import SchedulerStatus, StatusReporter
from xce_scheduler.view import SchedulerView
from xcecore.attached import Attached
from xcecore.runtime import RoleContext

# Building an app (under the apps' lock) asks for the view (under the views' own lock).
view_for: Attached[SchedulerView] = Attached(lambda client: SchedulerView())
"""The view fed by a client's pushes (made on first use)."""


@dataclass
class SchedulerApp:
    """One scheduler: its view, picker (thread side) and allocator (event-loop side)."""

    view: SchedulerView
    picker: Picker
    allocator: Allocator
    status: SchedulerStatus


def build(ctx: RoleContext) -> SchedulerApp:
    """Wire the scheduler's parts from ``ctx`` (its client, portal, config and plugins)."""
    if ctx.client is None or ctx.portal is None:
        raise RuntimeError("the scheduler needs a connected client (it is a client role)")
    section = ctx.section
    client, portal = ctx.client, ctx.portal
    status = SchedulerStatus()
    view = view_for(client)
    reporter = StatusReporter(status, section.get("status_file"),
                              log_interval=section.get("status_log_interval", 5.0))
    holder: dict[str, Picker] = {}
    allocator = Allocator(
        client.call,
        on_answer=lambda jobid, ok: holder["picker"].answered(jobid, ok),
        on_reasons_lost=lambda keys: holder["picker"].forget_reasons(keys),
        status=status,
        concurrency=section.get("dispatch_concurrency", 32),
    )

    def submit(items: list[Any]) -> None:
        # The picker is a thread; the allocator's queue belongs to the event loop.
        portal.call(allocator.submit, items)

    picker = Picker(view, Requirements(ctx.pm.resreq_evaluator), submit, status,
                    interval=section.get("interval", 0.05),
                    max_dispatch=section.get("max_dispatch_per_cycle", 1000),
                    load_interval=section.get("load_interval", 1.0),
                    reporter=reporter)
    holder["picker"] = picker
    return SchedulerApp(view, picker, allocator, status)


app_for: Attached[SchedulerApp] = Attached(lambda ctx: build(ctx))
"""The scheduler of a role context (built on first use)."""


def run_picker(ctx: RoleContext, stop: threading.Event) -> None:
    """The picker monitor: runs on its own thread until ``stop``."""
    app_for(ctx).picker.run(stop)


async def main(ctx: RoleContext) -> None:
    """The scheduler role: run the allocator on the event loop until the role stops."""
    app = app_for(ctx)
    logger.info("{}: scheduler running (dispatch concurrency {}, status file {})",
                ctx.identity, ctx.section.get("dispatch_concurrency", 32),
                ctx.section.get("status_file") or "none")
    try:
        await app.allocator.run()
    finally:
        app_for.forget(ctx)
