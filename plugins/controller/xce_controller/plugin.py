"""The controller's plugin: the ``controller`` role, its config section, its own hooks (election
and store, added with ``xce_addhooks``) and their built-in implementations (file lock, SQLite).

Importing this module registers hooks only; the server, anyio networking and SQLite are
imported when the role starts, so ``xce`` commands that never run a controller stay fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xce_controller import hookspecs
from xce_controller.settings import SECTION
from xcecore.config import Config
from xcecore.hookspecs import HookAdder, hookimpl
from xcecore.records import ConfigSection
from xcecore.role import Role, RoleSpec, reexec

if TYPE_CHECKING:
    from xce_controller.election import Election
    from xce_controller.hookspecs import Store

GC_THRESHOLDS = (20_000, 50, 100)
"""Young collections every 20,000 allocations instead of 700, and full ones rarely.

A primary holds many long-lived objects (the state, a connection per member) and allocates
fast (a request, a reply and a few records per heartbeat); with CPython's defaults the
collector re-scanned that heap so often that it took a quarter of the primary's CPU while
4,000 workers re-joined it (measured: benchmarks/bench_storm.py). Its garbage is mostly freed
by reference counting; the cycles (exception tracebacks of closed connections) wait longer.
"""


MMAP_THRESHOLD = 128 * 1024
"""Allocations from this size up are mmapped by glibc, and given back to the system when freed.

glibc raises its threshold each time a large mmapped block is freed (up to 32 MiB), after which
blocks of that size come from the heap and stay in the process when freed. A controller
encodes replies and state chunks of megabytes for clients that may never read them; measured
(tests/controller/test_ctl_bounds.py, non-reading floods), its RSS kept 130-140 MB of freed
frames with the moving threshold and 40-50 MB with it fixed. Setting it fixes it.
"""


HUGEPAGE_ENV = {"PYTHONMALLOC": "malloc",
                "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1"}
"""The environment a candidate re-executes itself with (:func:`heap_on_huge_pages`)."""
HUGEPAGE_SWITCH = "XCE_CONTROLLER_HUGEPAGES"
"""A candidate's heap on huge pages (:func:`heap_on_huge_pages`): ``1`` always, ``0`` never,
unset: when its file store is large (:data:`HUGEPAGE_AUTO_BYTES`)."""
HUGEPAGE_AUTO_BYTES = 64 * 1024 * 1024
"""Unset switch: huge pages when the file store's ``state.db`` and WAL hold this much (about
150,000 jobs at ~450 B a job on disk, a heap of ~200 MB): a SIGKILLed primary's teardown of
its heap in 4 KiB pages, which the failover waits for, grows with it (0.4-1.6 s for ~1 GB
here); a small cluster (and every test) keeps pymalloc and one interpreter start. Another
backend (no ``state.db``) decides with the switch only."""


def _wants_huge_pages(switch: str | None, state_dir: str | None) -> bool:
    """The switch's decision (``applied``: done already, never again)."""
    if switch in ("0", "applied"):
        return False
    if switch == "1":
        return True
    if state_dir is None:
        return False
    import contextlib
    import os

    size = 0
    for name in ("state.db", "state.db-wal"):
        with contextlib.suppress(OSError):  # no store yet: a new cluster
            size += os.stat(os.path.join(state_dir, name)).st_size
    return size >= HUGEPAGE_AUTO_BYTES


def huge_page_env(state_dir: str | None = None) -> dict[str, str] | None:
    """The environment to execute this process again with, so that its heap is on transparent
    huge pages: Python's objects from glibc's malloc (``PYTHONMALLOC=malloc``), which madvises
    its memory for huge pages (``glibc.malloc.hugetlb=1``, glibc >= 2.35, THP ``always`` or
    ``madvise``) -- from one arena (``glibc.malloc.arena_max=1``): the arenas of other threads
    (the jobs load on one) are not madvised, and held 90 % of a primary's 1.3 GB. None: not
    wanted, unavailable, or done (this process started with it: the switch says ``applied``,
    or an operator's unit set ``PYTHONMALLOC=malloc`` and the tunable itself).

    Why: the kernel releases a SIGKILLed process's ``flock`` and sockets only after it has
    torn down its memory, page by page. For a process holding ~1 GB (a primary with
    1,000,000 jobs) that took 0.4-1.6 s on a loaded 2-core machine -- the standbys wait for
    the lock and the clients for the connection's end all that time -- and 20-50 ms with
    2 MiB pages (docs/operator.md, "Large clusters"). The price: a second interpreter start
    (asked before the role's imports: :attr:`~xcecore.role.RoleSpec.exec_env`), ~9 % more
    memory per object than pymalloc, and slower full collections; so it is the default only
    for a large file store (``state_dir``'s ``state.db``, see :data:`HUGEPAGE_SWITCH`).
    """
    import os
    import platform
    import sys
    from pathlib import Path

    from loguru import logger

    env = os.environ
    tunables = env.get("GLIBC_TUNABLES", "")
    # Once: the new process says "applied" (glibc may rewrite GLIBC_TUNABLES as it reads it).
    if not _wants_huge_pages(env.get(HUGEPAGE_SWITCH), state_dir) or sys.platform != "linux":
        return None
    if env.get("PYTHONMALLOC") == "malloc" and "glibc.malloc.hugetlb=1" in tunables:
        return None  # started so (a service unit's environment): nothing to gain
    lib, version = platform.libc_ver()
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        glibc = tuple(int(x) for x in version.split(".")[:2])
    except (OSError, ValueError):
        return None
    if lib != "glibc" or glibc < (2, 35) or not ("[always]" in thp or "[madvise]" in thp):
        return None
    why = (f"{HUGEPAGE_SWITCH}=1" if env.get(HUGEPAGE_SWITCH) == "1" else
           f"its store holds {HUGEPAGE_AUTO_BYTES >> 20} MiB or more; {HUGEPAGE_SWITCH}=0 to keep pymalloc")
    logger.info("controller: re-executing itself with its heap on transparent huge pages "
                "(PYTHONMALLOC=malloc, glibc.malloc.hugetlb=1, one arena; {}), so that a SIGKILL "
                "releases its lock within milliseconds", why)
    return {HUGEPAGE_SWITCH: "applied", "PYTHONMALLOC": "malloc",
            "GLIBC_TUNABLES": ":".join(filter(None, (tunables, HUGEPAGE_ENV["GLIBC_TUNABLES"])))}


def heap_on_huge_pages(state_dir: str | None = None) -> None:
    """Execute this process again with :func:`huge_page_env`, when it says so (``python -m
    xce_controller``, before it has done anything)."""
    env = huge_page_env(state_dir)
    if env:
        reexec(env)


def role_exec_env(config: Config) -> dict[str, str] | None:
    """The role's :attr:`~xcecore.role.RoleSpec.exec_env`: :func:`huge_page_env` of its
    ``[controller] state_dir`` (none configured: nothing; the role's start says what is
    missing)."""
    state_dir = config.section("controller").get("state_dir")
    return huge_page_env(str(state_dir)) if state_dir else None


def tune_memory() -> None:
    """Set :data:`GC_THRESHOLDS` and a fixed :data:`MMAP_THRESHOLD` for this process (a
    controller candidate owns its process). Without glibc (musl, macOS) only the first."""
    import ctypes
    import ctypes.util
    import gc

    gc.set_threshold(*GC_THRESHOLDS)
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is not None:
        mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD


class ControllerRole(Role):
    """One controller candidate: stand by, promote when elected, serve until told to stop."""

    controller: Any = None  # the candidate, once it listens (its metrics read it)

    def metrics(self) -> Iterable[Any]:
        """``xce_controller_*`` (:mod:`xce_controller.metrics`), once the candidate listens."""
        if self.controller is None:
            return ()
        from xce_controller.metrics import families

        return list(families(self.controller))

    async def main(self) -> None:
        """Serve until ``ctx.stop`` (SIGTERM/SIGINT) or a ``shutdown`` op."""
        import dataclasses
        import signal

        from xce_controller.settings import ControllerSettings, settings_from_config

        ctx = self.ctx
        read = settings_from_config(ctx.config, ctx.auth)  # (huge pages: role_exec_env, before)

        import anyio
        import anyio.abc
        from loguru import logger

        from xce_controller.server import serve

        tune_memory()

        def reload() -> ControllerSettings:  # blocking: the server calls it on a thread
            from xcecore.runtime import reload as reread

            return settings_from_config(reread(ctx.config), ctx.auth)

        settings = dataclasses.replace(read, reload=reload)
        hook = ctx.pm.hook

        backend, config = settings.backend, ctx.config
        elected: list[Election] = []  # the election this candidate made (its store's guard)

        def election(state_dir: str, advertise: str) -> Election:
            made = hookspecs.election(hook, state_dir, advertise, settings.hung_timeout,
                                      backend, config)
            elected.append(made)
            return made

        def store(state_dir: str) -> Store:
            return hookspecs.store(hook, state_dir, backend, config, elected[-1] if elected else None)

        async with anyio.create_task_group() as tg:

            async def stop_when_told() -> None:
                await ctx.stop.wait_async()
                tg.cancel_scope.cancel()

            async def run(*, task_status: anyio.abc.TaskStatus[Any]) -> None:
                await serve(settings, election_factory=election, store_factory=store,
                            task_status=task_status)
                tg.cancel_scope.cancel()

            async def reconfigure_on_hup() -> None:
                with anyio.open_signal_receiver(signal.SIGHUP) as signals:
                    async for _ in signals:
                        logger.info("controller {}: SIGHUP: reading the configuration again",
                                    self.controller.address if self.controller else ctx.identity)
                        if self.controller is not None:
                            await self.controller.reconfigure_now("SIGHUP")

            tg.start_soon(stop_when_told)
            tg.start_soon(reconfigure_on_hup)
            self.controller = await tg.start(run)


@hookimpl
def xce_addhooks(pluginmanager: HookAdder) -> None:
    """Add ``xce_controller_election`` and ``xce_controller_store``."""
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The ``controller`` role (a server: it gets no client)."""
    return [RoleSpec("controller", ControllerRole,
                     "controller candidate: cluster state, primary/standby HA", client=False,
                     exec_env=role_exec_env)]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """The ``[controller]`` section (see docs/protocol-ops.md, "Configuration")."""
    return [SECTION]


@hookimpl(trylast=True)
def xce_controller_election(state_dir: str, advertise: str, hung_timeout: float,
                            backend: str = "file") -> Election | None:
    """Built-in election (backend "file"): an exclusive flock on ``<state_dir>/primary.lock``,
    with a heartbeat record and fencing of a hung primary on the same host."""
    from xce_controller.election import FileLockElection

    if backend != "file":
        return None

    return FileLockElection(state_dir, advertise, hung_timeout=hung_timeout)


@hookimpl(trylast=True)
def xce_controller_store(state_dir: str, backend: str = "file") -> Store | None:
    """Built-in store (backend "file"): SQLite (WAL, synchronous=FULL, group commit) in the
    state dir."""
    from xce_controller.store import SQLiteStore

    if backend != "file":
        return None

    return SQLiteStore(state_dir)
