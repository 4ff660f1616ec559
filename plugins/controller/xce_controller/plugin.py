"""The controller's pluggy hooks: the ``controller`` role, its config section, and the
built-in election (file lock) and store (SQLite).

Importing this module registers hooks only; the server, anyio networking and SQLite are
imported when the role starts, so ``xce`` commands that never run a controller stay fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field, RoleSpec

if TYPE_CHECKING:
    from xcecore.runtime import RoleContext

_DEFAULT_QUEUES = [
    {"name": "normal", "priority": 30, "description": "For normal low-priority jobs (default)"},
    {"name": "priority", "priority": 43, "description": "Jobs submitted here run first"},
]


GC_THRESHOLDS = (20_000, 50, 100)
"""Young collections every 20,000 allocations instead of 700, and full ones rarely.

A primary holds many long-lived objects (the state, a connection per member) and allocates
fast (a request, a reply and a few records per heartbeat); with CPython's defaults the
collector re-scanned that heap so often that it took a quarter of the primary's CPU while
4,000 workers re-joined it (measured: benchmarks/bench_storm.py). Its garbage is mostly freed
by reference counting; the cycles (exception tracebacks of closed connections) wait longer.
"""


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (a controller candidate owns its process)."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)


async def controller_main(ctx: RoleContext) -> None:
    """Run this candidate: stand by, promote when elected, serve until ``ctx.stop``."""
    import anyio

    from xce_controller.server import serve
    from xce_controller.settings import settings_from_config

    cluster = ctx.config.cluster
    tune_gc()
    settings = settings_from_config(cluster, ctx.config.section("controller"), ctx.key)

    def election(state_dir: str, advertise: str) -> Any:
        return ctx.pm.controller_election(state_dir=state_dir, advertise=advertise)

    def store(state_dir: str) -> Any:
        return ctx.pm.controller_store(state_dir=state_dir)

    async with anyio.create_task_group() as tg:

        async def watch_stop() -> None:
            while not ctx.stop.is_set():
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()

        tg.start_soon(watch_stop)
        await serve(settings, election_factory=election, store_factory=store)
        tg.cancel_scope.cancel()


def _check(section: dict[str, Any]) -> None:
    from xce_controller.settings import check_controller_section

    check_controller_section(section)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The ``controller`` role (a server: it gets no client)."""
    return [
        RoleSpec(
            name="controller",
            main=controller_main,
            description="controller candidate: cluster state, primary/standby HA",
            client=False,
        )
    ]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """The ``[controller]`` section (see docs/protocol-ops.md, "Configuration")."""
    num = (int, float)
    fields = {
        "listen": Field((str,), "127.0.0.1:7600", "host:port this candidate listens on"),
        "advertise": Field((str,), None, "address clients are redirected to (default: listen)"),
        "admins": Field((list,), [], "user names with administrator rights"),
        "host_timeout": Field(num, 30.0, "seconds without a worker heartbeat before unavail"),
        "queues": Field((list,), _DEFAULT_QUEUES, "queues: tables {name, priority, description, open, active}"),
        "default_queue": Field((str,), "normal", "queue of a submission that names none"),
        "host_groups": Field((dict,), {}, "host group name -> list of hosts"),
        "user_groups": Field((dict,), {}, "user group name -> list of users"),
        "max_subscriber_queue": Field((int,), 10000, "unsent pushes before a member is dropped"),
        "max_inflight": Field((int,), 4096, "requests in flight per connection"),
        "idem_ttl": Field(num, 86400.0, "seconds an idempotency key's result is kept"),
        "clean_period": Field(
            num, 3600.0,
            "seconds a finished (DONE/EXIT) job is kept after it ends before it is purged "
            "(like LSF CLEAN_PERIOD); 0 keeps finished jobs forever",
        ),
        "state_dir": Field((str,), None, "state directory (default: cluster.state_dir)"),
    }
    return [ConfigSection("controller", fields, "the controller role", check=_check)]


@hookimpl(trylast=True)
def xce_controller_election(state_dir: str, advertise: str) -> Any:
    """Built-in election: an exclusive flock on ``<state_dir>/primary.lock``."""
    from xce_controller.election import FileLockElection

    return FileLockElection(state_dir, advertise)


@hookimpl(trylast=True)
def xce_controller_store(state_dir: str) -> Any:
    """Built-in store: SQLite (WAL, synchronous=FULL, group commit) in the state dir."""
    from xce_controller.store import SQLiteStore

    return SQLiteStore(state_dir)
