"""The scheduler's plugin: the ``scheduler`` role and its ``[scheduler]`` config section.

The role object (:class:`xce_scheduler.role.SchedulerRole`) joins with no attributes, keeps
its view from the pushes, and runs the picker as a monitor thread and the allocator as its
main. Heavy work happens in those, never at import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field
from xcecore.role import RoleSpec

if TYPE_CHECKING:
    from xcecore.role import Role, RoleContext

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


def scheduler_role(ctx: RoleContext) -> Role:
    """Build the scheduler's role object (imports the scheduler's machinery only now)."""
    from xce_scheduler.role import SchedulerRole

    return SchedulerRole(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The scheduler role."""
    return [RoleSpec(ROLE, scheduler_role, "decides where pending jobs run (job picker + allocator)")]


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
                "dispatch_concurrency": Field((int,), 2, "jobdispatch_many calls (batches) in flight at once"),
                "status_file": Field((str,), None, "write the picker/allocator status here (JSON)"),
                "status_log_interval": Field((float, int), 5.0,
                                             "seconds between DEBUG status lines"),
                "hname": Field((str,), None, "host name in this scheduler's identity"),
            },
            "the scheduler role",
            check=_check,
        )
    ]
