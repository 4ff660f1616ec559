"""Runs one role: config -> plugins -> client -> join -> monitors -> the role's main.

This is the only place that turns configuration into a connected client, so every client
role (the built-in ones and a third party's) connects, joins and re-joins the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from loguru import logger

from xcecore import auth
from xcecore.candidates import Candidate, candidates_from_config
from xcecore.config import CORE_SECTIONS, Config, ConfigError, parse_override, read_file, validate
from xcecore.log import setup_logging
from xcecore.plugins import PluginManager
from xcecore.records import Monitor, RoleSpec

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from xcecore.connection import Client, ClientConfig, SyncClient


class RoleError(Exception):
    """A role cannot start: unknown name, bad configuration."""


@dataclass(eq=False)  # identity semantics: plugins key their per-role state on it
class RoleContext:
    """What a role's main and its monitors get.

    ``client`` is connected and joined for client roles (None for server roles). Threads
    call the controller through :meth:`call` (the sync facade); coroutines await
    ``ctx.client.call`` directly. ``stop`` is set when the role must stop.
    """

    role: str
    config: Config
    pm: PluginManager
    identity: str
    candidates: tuple[Candidate, ...]
    key: bytes | None
    client: Client | None = None
    portal: BlockingPortal | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    _sync: SyncClient | None = None

    @property
    def section(self) -> dict[str, Any]:
        """This role's config section (``[<role>]``)."""
        return self.config.section(self.role)

    def call(self, op: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
        """Call the controller from a thread (never from the event loop).

        Raises ``xcecore.connection.ClientClosed`` once the role is stopping, instead of
        waiting for a primary through an outage.
        """
        if self._sync is None:
            raise RuntimeError(f"role {self.role!r} has no client to call through")
        return self._sync.call(op, args, **kw)


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
    return pm, validate(raw, sections, skip=pm.skipped, path=path)


def identity(role: str, config: Config) -> str:
    """``role@host``: the handshake identity; ``[<role>] hname`` overrides the host name."""
    host = config.section(role).get("hname") or socket.gethostname()
    return f"{role}@{host}"


def client_config(config: Config, sender: str) -> ClientConfig:
    """The one translation of configuration into the connection manager's settings."""
    from xcecore.connection import ClientConfig

    cluster, tuning = config.cluster, config.section("client")
    cands = candidates_from_config(cluster)
    key = auth.load_key(cluster.get("key"), cluster.get("key_file"))
    auth.check_keyless(key, [c.host for c in cands])
    return ClientConfig(
        candidates=cands,
        sender=sender,
        key=key,
        allow_unlisted_redirect=cluster["allow_unlisted_redirect"],
        max_frame=cluster["max_frame"],
        **tuning,
    )


def make_context(role: str, pm: PluginManager, config: Config) -> RoleContext:
    """A context for ``role`` before any connection is made."""
    cluster = config.cluster
    cands: tuple[Candidate, ...] = ()
    if cluster.get("peers") is not None or cluster.get("address") is not None:
        cands = candidates_from_config(cluster)
    key = auth.load_key(cluster.get("key"), cluster.get("key_file"))
    return RoleContext(role, config, pm, identity(role, config), cands, key)


async def _run_monitor(monitor: Monitor, ctx: RoleContext) -> None:
    # One dedicated thread per monitor: a blocked monitor never starves another one.
    await anyio.to_thread.run_sync(monitor.run, ctx, ctx.stop, limiter=anyio.CapacityLimiter(1))


async def _watch_signals(ctx: RoleContext, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("{}: received {}; stopping", ctx.identity, signal.Signals(signum).name)
            ctx.stop.set()
            scope.cancel()
            return


async def run_role_async(spec: RoleSpec, ctx: RoleContext) -> None:
    """Run a role until its main returns or SIGTERM/SIGINT arrives."""
    from anyio.from_thread import BlockingPortal

    async with anyio.create_task_group() as outer:
        outer.start_soon(_watch_signals, ctx, outer.cancel_scope)
        try:
            if not spec.client:
                await spec.main(ctx)
                return
            from xcecore.connection import Client, SyncClient

            cfg = client_config(ctx.config, ctx.identity)
            attrs = ctx.pm.join_attributes(spec.name, ctx.config)
            points = ctx.pm.rejoin_points(spec.name)
            async with (
                Client(cfg, role=spec.name, hooks=ctx.pm, join_attrs=attrs, rejoin_points=points) as client,
                BlockingPortal() as portal,
            ):
                ctx.client, ctx.portal, ctx._sync = client, portal, SyncClient(client, portal, stop=ctx.stop)
                await client.connect()
                await client.join()
                monitors = ctx.pm.monitors(spec.name, ctx)
                async with anyio.create_task_group() as tg:
                    for monitor in monitors:
                        tg.start_soon(_run_monitor, monitor, ctx)
                    try:
                        await spec.main(ctx)
                    finally:
                        ctx.stop.set()
        finally:
            ctx.stop.set()
            outer.cancel_scope.cancel()


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
    ctx = make_context(name, pm, config)
    logcfg = config.section("log")
    setup_logging(
        ctx.identity,
        log_level or logcfg["level"],
        json=logcfg["json"] if log_json is None else log_json,
        file=logcfg["file"],
    )
    options = loop_options(config.cluster.get("event_loop") or "auto")
    logger.info(
        "{}: starting role {} (pid {}, config {}, event loop {})",
        ctx.identity, name, os.getpid(), Path(config.path) if config.path else "none",
        "uvloop" if options else "asyncio",
    )
    try:
        anyio.run(run_role_async, roles[name], ctx, backend_options=options)
    except BaseExceptionGroup as group:
        # A role that cannot start (a port in use, a bad value found late) fails in a task
        # group; the operator needs the one reason, not the group's traceback.
        leaf = _only_leaf(group)
        if isinstance(leaf, OSError | ValueError | RoleError):
            logger.error("{}: cannot run: {}", ctx.identity, leaf)
            raise RoleError(f"{name}: {leaf}") from leaf
        raise
    logger.info("{}: stopped", ctx.identity)


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
