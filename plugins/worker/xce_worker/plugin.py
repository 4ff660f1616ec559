"""Hook implementations of the worker role (``xce run worker``).

The worker is the daemon on every compute host (LSF's sbatchd+LIM, Slurm's slurmd). It joins
with its host's attributes, re-joins after ``hello`` when a reconnect left a rejoin pending,
runs its monitors and process manager on their own threads, and keeps every job report in a
durable journal until the controller has it. Reconnecting, following redirects and re-joining
are the core client's work: there is no reconnect loop here.

This module is imported by every ``xce`` command, so it imports only what registering the
hooks needs; the worker's machinery (and psutil) loads when the role runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xce_worker.settings import SECTION
from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Monitor, RoleSpec

if TYPE_CHECKING:
    from xcecore.config import Config
    from xcecore.connection import Client
    from xcecore.runtime import RoleContext

ROLE = "worker"
REJOIN_POINTS = ("hello",)


async def main(ctx: RoleContext) -> None:
    """Run the worker until it is told to stop: the liveness probe, then a graceful stop."""
    import faulthandler
    import signal

    import anyio

    from xce_worker.daemon import worker_for

    # `kill -USR1 <worker pid>` prints every thread's stack to stderr: for a hung worker.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    worker = worker_for(ctx)
    try:
        await worker.liveness()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(worker.shutdown)
            worker_for.forget(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The worker role."""
    return [RoleSpec(ROLE, main, "runs jobs on this host and reports its load")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """The ``[worker]`` section."""
    return [SECTION]


@hookimpl
def xce_join_attributes(role: str, config: Config) -> dict[str, Any] | None:
    """The host's attributes (``hname``, ``max_slots``, ncpus, maxmem, resources...)."""
    if role != ROLE:
        return None
    from xce_worker.attrs import join_attributes

    return join_attributes(config.section(ROLE))


@hookimpl
def xce_rejoin_points(role: str) -> Iterable[str] | None:
    """The worker re-joins after its liveness probe, ``hello``."""
    return REJOIN_POINTS if role == ROLE else None


@hookimpl
def xce_push(client: Client, role: str, event: str, seq: int, data: Any) -> None:
    """Hand the push to the worker's push thread (never blocks the event loop)."""
    if role != ROLE:
        return
    from xce_worker.pushes import inbox_for

    inbox_for(client).put(event, seq, data)


@hookimpl
def xce_monitors(role: str, ctx: RoleContext) -> Iterable[Monitor] | None:
    """Hardware, system, job-usage, push and report-delivery loops, each on its own thread."""
    if role != ROLE:
        return None
    from xce_worker.daemon import worker_for

    return worker_for(ctx).monitors()
