"""Every hook spec of the core, each with the contract its implementations must keep.

Implement a hook by defining a function of the same name in a plugin module (or class) and
marking it with :data:`hookimpl`; pluggy passes arguments by keyword, so an implementation may
accept any subset of the parameters. The rest of xce never calls ``pm.hook.x`` directly: it goes
through the typed facade in :mod:`xcecore.plugins`.

A role is not a set of hooks: ``xce_roles`` registers it as a :class:`~xcecore.role.RoleSpec`
whose factory builds the role's object (join attributes, rejoin points, subscription, push and
connection-state handlers, monitors, main), and the core calls that object. The session hooks
below are for *cross-role observers*: plugins that watch every client role a process runs.
A distribution adds hooks of its own with ``xce_addhooks`` (the controller's election and
store hooks live in ``xce_controller.hookspecs``).

Hooks that are asked once (addhooks, roles, config sections, commands, evaluator) are resolved
at start and their answers kept; hooks that fire per event (push, connection state,
reconnected) are cheap calls that must return quickly.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import click

    from xcecore.candidates import Candidate
    from xcecore.client import Client
    from xcecore.records import ConfigSection
    from xcecore.role import RoleSpec

PROJECT = "xce"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class HookAdder(Protocol):
    """What ``xce_addhooks`` receives: the plugin manager, as far as adding specs goes."""

    def add_hookspecs(self, module_or_class: ModuleType | type) -> None:
        """Add the hook specs (``@hookspec`` functions) of ``module_or_class``."""
        ...


# -------------------------------------------------------------------------------------------
# Registration: asked once at start, on the main thread.
# -------------------------------------------------------------------------------------------


@hookspec(historic=True)
def xce_addhooks(pluginmanager: HookAdder) -> None:
    """Add hook specs of this distribution: ``pluginmanager.add_hookspecs(my_hookspecs)``.

    historic: called for each plugin at the moment it is registered (also for plugins
    registered later), on the main thread, before any other hook of it is called. This is how
    a role distribution gives its own plugins hooks the core does not know (the controller's
    ``xce_controller_election`` / ``xce_controller_store``). Must do nothing else.
    """


@hookspec
def xce_roles() -> Iterable[RoleSpec]:
    """Return the roles this plugin adds (:class:`xcecore.role.RoleSpec` records).

    This is how a third party adds a component role: ``xce run NAME`` builds the object
    ``spec.factory(ctx)`` of the role whose ``name`` is NAME and runs it. Called when the
    plugin manager lists roles, on the main thread. Two plugins registering the same role
    name is an error that names both. Must not do I/O (the factory runs only for ``xce run``).
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
# Client sessions: reconnects, and cross-role observers of every client role's events.
# -------------------------------------------------------------------------------------------


@hookspec
def xce_reconnected(client: Client, candidate: Candidate) -> None:
    """The client reconnected to ``candidate`` after losing its connection.

    Called on the event loop, while the connection's failover lock is still held, only for
    reconnects (never for the first connect). Implementations must only record that something
    is needed (the built-in one marks a rejoin pending) and return at once. Calling the client
    from here would wait on the lock this call holds: the client detects it and raises
    :class:`xcecore.client.HookContractError` instead of deadlocking.
    """


@hookspec
def xce_connection_state(
    client: Client, role: str, state: str, candidate: Candidate | None, detail: str
) -> None:
    """Observer: the connection of a client of role ``role`` changed state.

    For plugins that watch every role; a role hears its own changes through its object's
    ``connection_state``, which runs first. ``state`` is one of ``connecting``,
    ``connected``, ``reconnecting``, ``rejoined``, ``degraded``, ``closed``. Called on the
    event loop from the client's own observer task, which never holds the failover lock:
    ``connected`` and ``rejoined`` arrive after the lock is released; ``reconnecting`` and
    ``degraded`` while a reconnect may still be in progress. Changes arrive in order (a burst
    may be coalesced to the latest). An ``async def`` implementation is awaited before the
    next change is delivered. Calling the client from here is allowed (schedule it). Must not
    block the loop: hand blocking work to a thread.
    """


@hookspec
def xce_push(client: Client, role: str, event: str, seq: int, data: Any) -> None:
    """Observer: the controller pushed ``event`` with ``data`` to a client of role ``role``.

    For plugins that watch every role (a role handles its own pushes in its object's
    ``push``, which runs first). Called on the event loop by the client's push task, in
    sequence order, one push at a time; an ``async def`` implementation is awaited before the
    next push. After every (re-)join come the pushes of its state sync (``sync_begin``,
    ``sync_records`` / ``sync_removed`` frames, ``sync_end``); ordinary pushes follow.
    Return quickly and never block. May not call the client synchronously; schedule a task
    instead.
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
