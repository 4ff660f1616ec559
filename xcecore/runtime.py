"""Runs one role: config -> plugins -> the role's object -> client -> join -> monitors -> main.

This is the only place that turns configuration into a connected client, so every client
role (the built-in ones and a third party's) connects, joins and re-joins the same way. The
client calls back ONE events object (:class:`RoleEvents`): the role object's own handlers
first, then the cross-role observer hooks, awaiting whatever is async.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from loguru import logger

from xcecore.candidates import Candidate
from xcecore.config import CORE_SECTIONS, Config, ConfigError, parse_override, read_file, validate
from xcecore.log import setup_logging, write_pid_file
from xcecore.plugins import PluginManager
from xcecore.role import Monitor, Role, RoleContext, RoleSpec, reexec

if TYPE_CHECKING:
    from xcecore.client import Client, ClientConfig


class RoleError(Exception):
    """A role cannot start: unknown name, bad configuration."""


def load(
    config_path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> tuple[PluginManager, Config]:
    """Read the config, load the selected plugins, and validate the config against them."""
    path, raw = read_file(config_path)
    for text in overrides:
        section, key, value = parse_override(text)
        raw.setdefault(section, {})[key] = value
    plugins_section = raw.get("plugins", {})
    if not isinstance(plugins_section, dict):
        raise ConfigError("plugins: must be a table ([plugins])")
    pm = PluginManager.load(plugins_section)
    sections = [*CORE_SECTIONS, *pm.config_sections()]
    config = validate(raw, sections, skip=pm.skipped, path=path)
    config.overrides = tuple(overrides)
    return pm, config


def reload(config: Config) -> Config:
    """``config`` read again from its file, with the same command-line overrides (blocking:
    call it on a thread). Raises ``ConfigError`` naming what is wrong with the file now."""
    return load(config.path, config.overrides)[1]


def client_config(config: Config, sender: str) -> ClientConfig:
    """The client's settings from a loaded configuration (see ``xcecore.client.client_config``)."""
    from xcecore.client import client_config as from_sections

    return from_sections(config.cluster, config.section("client"), sender, config.section("tls"))


def _awaitables(results: Iterable[object]) -> list[Awaitable[Any]] | None:
    found = [r for r in results if inspect.isawaitable(r)]
    return found or None


async def _then(first: Awaitable[Any], rest: Callable[[], list[Any]]) -> None:
    """Await the role's own handler, then run (and await) the observers: strict order."""
    await first
    for item in rest():
        if inspect.isawaitable(item):
            await item


class RoleEvents:
    """What the client calls back for a role: the role object's handlers, then the observers.

    Keeps the client's events contract (``reconnected``, ``connection_state``, ``push``):
    each returns None when everything ran synchronously, else awaitables for the client to
    await before it delivers the next event. ``reconnected`` goes to the ``xce_reconnected``
    hook only (the built-in ``rejoin`` plugin marks the rejoin pending).
    """

    def __init__(self, role: Role, pm: PluginManager) -> None:
        self.role = role
        self.pm = pm

    def reconnected(self, client: Client, candidate: Candidate) -> object:
        """``xce_reconnected``, under the failover lock."""
        return _awaitables(self.pm.reconnected(client, candidate))

    def connection_state(self, client: Client, state: str, candidate: Candidate | None, detail: str) -> object:
        """The role's ``connection_state``, then every ``xce_connection_state`` observer."""
        own = self.role.connection_state(state, candidate, detail)

        def observe() -> list[Any]:
            return self.pm.connection_state(client, client.role, state, candidate, detail)

        if own is None:
            return _awaitables(observe())
        return _then(own, observe)

    def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> object:
        """The role's ``push``, then every ``xce_push`` observer."""
        own = self.role.push(event, seq, data)

        def observe() -> list[Any]:
            return self.pm.push(client, role, event, seq, data)

        if own is None:
            return _awaitables(observe())
        return _then(own, observe)


async def _run_monitor(monitor: Monitor, ctx: RoleContext) -> None:
    # One dedicated thread per monitor: a blocked monitor never starves another one.
    await anyio.to_thread.run_sync(monitor.run, ctx.stop, limiter=anyio.CapacityLimiter(1))


async def _watch_signals(ctx: RoleContext, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("{}: received {}; stopping", ctx.identity, signal.Signals(signum).name)
            ctx.stop.set()
            scope.cancel()
            return


def build_role(spec: RoleSpec, ctx: RoleContext) -> Role:
    """Check the role's own config section, then build its object (no connection yet)."""
    ctx.config.require(spec.name)
    role = spec.factory(ctx)
    if not isinstance(role, Role):
        raise RoleError(f"role {spec.name!r}: its factory returned {type(role).__name__}, "
                        "not an xcecore.role.Role")
    return role


async def run_role_async(spec: RoleSpec, ctx: RoleContext) -> None:
    """Run a role until its main returns or SIGTERM/SIGINT arrives."""
    from anyio.from_thread import BlockingPortal

    pm = ctx.pm
    if not isinstance(pm, PluginManager):
        raise TypeError(f"ctx.pm must be an xcecore.plugins.PluginManager, not {type(pm).__name__}")
    ctx.bridge.bind()
    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(_watch_signals, ctx, outer.cancel_scope)
            try:
                role = build_role(spec, ctx)
                from xcecore import metrics

                section = ctx.config.section("metrics")
                if metrics.exporter_port(section, spec.name) is not None:
                    # (only then: ctx.metrics imports prometheus_client, ~0.1 s of a start)
                    await outer.start(partial(metrics.run, ctx.identity, spec.name, section,
                                              ctx.metrics, role))
                if not spec.client:
                    await role.main()
                    return
                from xcecore.client import Client, SyncClient

                cfg = client_config(ctx.config, ctx.identity)
                attrs = dict(role.join_attributes())
                points = frozenset(role.rejoin_points)
                sub = role.subscription
                async with (
                    Client(cfg, role=spec.name, hooks=RoleEvents(role, pm), join_attrs=attrs,
                           rejoin_points=points, subscribe=sub.to_wire()) as client,
                    BlockingPortal() as portal,
                ):
                    ctx.client, ctx.portal = client, portal
                    ctx._sync = SyncClient(client, portal, stop=ctx.stop)
                    await client.connect()
                    await client.join()
                    async with anyio.create_task_group() as tg:
                        for monitor in role.monitors():
                            tg.start_soon(_run_monitor, monitor, ctx)
                        try:
                            await role.main()
                        finally:
                            ctx.stop.set()
            finally:
                ctx.stop.set()
                outer.cancel_scope.cancel()
    finally:
        ctx.bridge.unbind()


def run_role(
    name: str,
    config_path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    *,
    log_level: str | None = None,
    log_json: bool | None = None,
) -> None:
    """Load everything and run role ``name`` in this process (``xce run NAME``)."""
    pm, config = load(config_path, overrides)
    roles = pm.roles()
    if name not in roles:
        raise RoleError(f"unknown role {name!r}; registered roles: {', '.join(sorted(roles)) or 'none'}")
    ctx = RoleContext.create(name, pm, config)
    logcfg = config.section("log")
    setup_logging(
        ctx.identity,
        log_level or logcfg["level"],
        json=logcfg["json"] if log_json is None else log_json,
        file=logcfg["file"],
        rotation=logcfg["rotation"],
        retention=logcfg["retention"],
        repeat_interval=float(logcfg["repeat_interval"]),
    )
    if logcfg["pid_file"]:
        try:
            write_pid_file(logcfg["pid_file"])
        except (OSError, RuntimeError) as exc:
            raise RoleError(f"log.pid_file: {exc}") from None
    spec = roles[name]
    if spec.exec_env is not None:  # before the role's imports and the event loop: cheap
        env = spec.exec_env(config)
        if env:
            reexec(env)
    options = loop_options(config.cluster.get("event_loop") or "auto")
    logger.info(
        "{}: starting role {} (pid {}, config {}, event loop {})",
        ctx.identity, name, os.getpid(), Path(config.path) if config.path else "none",
        "uvloop" if options else "asyncio",
    )
    if config.unchecked:
        logger.info("{}: config section(s) {} not declared by any loaded plugin: kept, not checked",
                    ctx.identity, ", ".join(f"[{n}]" for n in sorted(config.unchecked)))
    config.require(name)  # a missing required key of the role's section: one line, no connect
    try:
        with profiled(ctx.identity):
            anyio.run(run_role_async, spec, ctx, backend_options=options)
    except BaseExceptionGroup as group:
        # A role that cannot start (a port in use, a bad value found late) fails in a task
        # group; the operator needs the one reason, not the group's traceback.
        leaf = _only_leaf(group)
        from xcecore.client.errors import AuthenticationFailed

        if isinstance(leaf, OSError | ValueError | RoleError | AuthenticationFailed):
            logger.error("{}: cannot run: {}", ctx.identity, leaf)
            raise RoleError(f"{name}: {leaf}") from leaf
        raise
    logger.info("{}: stopped", ctx.identity)


PROFILE_ENV = "XCE_PROFILE_DIR"
"""Set to a directory: a role process profiles its event-loop thread (cProfile) and writes
``<identity>-<pid>.prof`` there when the role stops (a diagnostic for benchmarks)."""


@contextlib.contextmanager
def profiled(identity: str) -> Iterator[None]:
    """Profile the calling thread while the block runs when :data:`PROFILE_ENV` names a
    directory; the profile is written when the block ends, however it ends."""
    where = os.environ.get(PROFILE_ENV)
    if not where:
        yield
        return
    import cProfile
    import time

    # CPU time of this thread, not wall time: on a shared machine a wall-clock profile blames
    # whatever was running when the scheduler took the core away (a socket write waking its
    # peer, most often).
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        target = Path(where) / f"{identity.replace('/', '_')}-{os.getpid()}.prof"
        try:
            prof.dump_stats(target)
            logger.info("{}: profile of the event loop written to {}", identity, target)
        except OSError as exc:
            logger.warning("{}: cannot write the profile {}: {}", identity, target, exc)


def loop_options(choice: str) -> dict[str, Any]:
    """anyio's asyncio backend options for ``[cluster] event_loop``.

    uvloop (the event loop uvicorn uses when installed) runs the same anyio code with its
    selector, transports and timers in C: measured here with 10,000 simulated workers, the
    controller's cost per heartbeat fell from ~38 to ~24-29 µs and their re-join after a
    primary's SIGKILL from ~12.4 to 8.4-9.3 s (benchmarks/RESULTS.md, section 2, which compares
    both loops). ``auto`` takes it when installed, as it is on Linux and macOS.
    """
    if choice == "asyncio":
        return {}
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise RoleError("cluster.event_loop is 'uvloop' but uvloop is not installed "
                            "(pip install uvloop, or set event_loop = 'auto')") from None
        return {}
    return {"use_uvloop": True}


def _only_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The single exception at the bottom of nested groups, or None if there are several."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc
