"""Hook implementations of the scheduler role (``xce run scheduler``).

The scheduler joins with no attributes, re-joins after ``jobdispatch`` when a reconnect left a
rejoin pending, keeps its view from the pushes, and runs the picker as a monitor thread and
the allocator as its main. Heavy work happens in those, never at import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xcecore.config import Config
from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field, Monitor, RoleSpec
from xcecore.runtime import RoleContext

ROLE = "scheduler"


def _check(values: dict[str, Any]) -> None:
    if values["interval"] <= 0:
        raise ValueError("interval must be > 0 seconds")
    if values["max_dispatch_per_cycle"] < 1:
        raise ValueError("max_dispatch_per_cycle must be >= 1")
    if values["dispatch_concurrency"] < 1:
        raise ValueError("dispatch_concurrency must be >= 1")
    if values["load_interval"] < 0:
        raise ValueError("load_interval must be >= 0 seconds")
    if values["status_log_interval"] <= 0:
        raise ValueError("status_log_interval must be > 0 seconds")


async def main(ctx: RoleContext) -> None:
    """Run the scheduler (the allocator; the picker runs as a monitor thread)."""
    from xce_scheduler.role import main as run

    await run(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The scheduler role."""
    return [RoleSpec(ROLE, main, "decides where pending jobs run (job picker + allocator)")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """``[scheduler]``: cadence, batch limits, status file."""
    return [
        ConfigSection(
            ROLE,
            {
                "interval": Field((float, int), 0.05,
                                  "seconds between picker cycles (a push of a new pending job "
                                  "or of freed slots wakes it at once)"),
                "max_dispatch_per_cycle": Field((int,), 1000,
                                                "most dispatches one cycle proposes"),
                "load_interval": Field((float, int), 1.0,
                                       "seconds between re-evaluations caused only by changed "
                                       "load values (r1m, mem...)"),
                "dispatch_concurrency": Field((int,), 32, "jobdispatch calls in flight at once"),
                "status_file": Field((str,), None, "write the picker/allocator status here (JSON)"),
                "status_log_interval": Field((float, int), 5.0,
                                             "seconds between DEBUG status lines"),
                "hname": Field((str,), None, "host name in this scheduler's identity"),
            },
            "the scheduler role",
            check=_check,
        )
    ]


@hookimpl
def xce_join_attributes(role: str, config: Config) -> dict[str, Any] | None:
    """The scheduler joins with no attributes."""
    return {} if role == ROLE else None


@hookimpl
def xce_rejoin_points(role: str) -> Iterable[str] | None:
    """Re-join after ``jobdispatch`` when a reconnect left a rejoin pending."""
    return ["jobdispatch"] if role == ROLE else None


@hookimpl
def xce_push(client: Any, role: str, event: str, seq: int, data: Any) -> None:
    """Update the scheduler's view (a ``state`` push replaces it; deltas update it)."""
    if role != ROLE:
        return
    from xce_scheduler.role import view_for

    view_for(client).apply(event, data)


@hookimpl
def xce_monitors(role: str, ctx: RoleContext) -> Iterable[Monitor] | None:
    """The job picker, on its own thread."""
    if role != ROLE:
        return None
    from xce_scheduler.role import run_picker

    return [Monitor("picker", run_picker)]
