"""Every xce hook spec, each with the contract its implementations must keep.

Implement a hook by defining a function of the same name in a plugin module (or class) and
marking it with :data:`hookimpl`; pluggy passes arguments by keyword, so an implementation may
accept any subset of the parameters. The rest of xce never calls ``pm.hook.x`` directly: it goes
through the typed facade in :mod:`xcecore.plugins`.

Hooks that are asked once (roles, join attributes, rejoin points, evaluator, election, store)
are resolved at start and their answers kept; hooks that fire per event (push, connection
state) are cheap calls that must return quickly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click

    from xcecore.candidates import Candidate
    from xcecore.config import Config
    from xcecore.connection import Client
    from xcecore.records import ConfigSection, Monitor, RoleSpec
    from xcecore.runtime import RoleContext

PROJECT = "xce"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -------------------------------------------------------------------------------------------
# Registration: asked once at start, on the main thread.
# -------------------------------------------------------------------------------------------


@hookspec
def xce_roles() -> Iterable[RoleSpec]:
    """Return the roles this plugin adds (:class:`xcecore.records.RoleSpec` records).

    This is how a third party adds a component role: ``xce run NAME`` runs the role whose
    ``name`` is NAME. Called once when the plugin manager is built, on the main thread. Two
    plugins registering the same role name is an error that names both. Must not do I/O.
    """


@hookspec
def xce_config_sections() -> Iterable[ConfigSection]:
    """Return the config-file sections (``[name]`` tables) this plugin owns.

    Called once before the config file is validated, on the main thread. Each key of a
    section has a type and a default; the loader rejects unknown keys and wrong types, naming
    the key path. Must not read the config itself.
    """


@hookspec
def xce_cli_commands(group: click.Group) -> None:
    """Add subcommands to the ``xce`` command line by calling ``group.add_command``.

    Called once when the command line is built, on the main thread, before arguments are
    parsed, so it must be cheap: import heavy modules inside the command, not here.
    """


# -------------------------------------------------------------------------------------------
# Client sessions: how a client role joins, re-joins, and hears the controller.
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def xce_join_attributes(role: str, config: Config) -> dict[str, Any] | None:
    """Return the attributes role ``role`` joins with, or None if this plugin does not own it.

    firstresult: the owner's answer is used. Called once at start on the main thread, and
    the answer is reused by every re-join, so it must describe the member, not a moment (a
    worker's host name, ncpus, maxmem, resources). Must not call the client.
    """


@hookspec
def xce_rejoin_points(role: str) -> Iterable[str] | None:
    """Return the ops after which role ``role`` re-joins when a rejoin is pending.

    The answers of every plugin are united. Called once, on the main thread, when the client
    is made, never per call: the answer must not change afterwards. Return None (or nothing)
    for roles this plugin does not own.
    """


@hookspec
def xce_reconnected(client: Client, candidate: Candidate) -> None:
    """The client reconnected to ``candidate`` after losing its connection.

    Called on the event loop, while the connection's failover lock is still held, only for
    reconnects (never for the first connect). Implementations must only record that something
    is needed (the built-in one marks a rejoin pending) and return at once. Calling the client
    from here would wait on the lock this call holds: the client detects it and raises
    :class:`xcecore.connection.HookContractError` instead of deadlocking.
    """


@hookspec
def xce_connection_state(client: Client, state: str, candidate: Candidate | None, detail: str) -> None:
    """The client's connection changed state.

    ``state`` is one of ``connecting``, ``connected``, ``reconnecting``, ``rejoined``,
    ``degraded``, ``closed``. Called on the event loop from the client's own observer task,
    which never holds the failover lock: ``connected`` and ``rejoined`` arrive after the lock
    is released; ``reconnecting`` and ``degraded`` arrive while a reconnect may still be in
    progress, so that an observer hears of an outage while it lasts. Changes arrive in order
    (a burst may be coalesced to the latest). Calling the client from here is allowed (schedule
    it; it waits for the reconnect like any call). A slow observer delays later notifications
    but never the connection itself. Must not block the loop: hand blocking work to a thread.
    """


@hookspec
def xce_push(client: Client, role: str, event: str, seq: int, data: Any) -> None:
    """The controller pushed ``event`` with ``data`` to a client of role ``role``.

    Called on the event loop by the client's push task, in sequence order, one push at a
    time. The first push after every (re-)join is ``state`` (the full state); deltas follow.
    Return quickly and never block: update in-memory state under a short lock, or hand the
    push to a thread. Implementations ignore roles they do not own. May not call the client
    synchronously; schedule a task instead.
    """


@hookspec
def xce_monitors(role: str, ctx: RoleContext) -> Iterable[Monitor] | None:
    """Return the monitors role ``role`` runs, each on its own thread.

    Called once after the first join, on the main thread. Each :class:`Monitor` loop runs on
    a dedicated thread (never on the event loop) until the role stops; it reaches the client
    through ``ctx`` and is never blocked by a reconnect in progress.
    """


# -------------------------------------------------------------------------------------------
# Resource requirements.
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def xce_resreq_evaluator(registry: Any) -> Any:
    """Return the resource-requirement evaluator for ``registry`` (a ``ResourceRegistry``).

    firstresult: the first non-None answer wins; the built-in plugin ``resreq`` answers last
    (``trylast``), so a site plugin replaces it by answering, or wraps it by calling
    ``xcecore.resreq.Evaluator`` itself. Called once per registry version by the role that
    evaluates requirements, on any thread. The evaluator must be thread-safe and never
    ``eval`` user text.
    """


# -------------------------------------------------------------------------------------------
# The controller's pluggable HA parts (called by the controller role only).
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def xce_controller_election(state_dir: str, advertise: str) -> Any:
    """Return the election for this controller candidate (built-in: a lock on the state dir).

    firstresult. Called once at controller start, on the main thread. The object must offer
    the interface of ``xce_controller.election.FileLockElection``: try/wait to become primary,
    publish ``advertise`` as the primary's address, and read the current primary's address.
    """


@hookspec(firstresult=True)
def xce_controller_store(state_dir: str) -> Any:
    """Return the durable state store for a primary (built-in: SQLite in WAL mode).

    firstresult. Called once when a candidate becomes primary, on the main thread. The
    object must offer the interface of ``xce_controller.store.SQLiteStore``: load state,
    commit grouped writes with their idempotency keys, and look keys up.
    """
