"""Small frozen records that registration hooks return (roles, monitors, config sections)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xcecore.runtime import RoleContext


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """A role a plugin adds: ``xce run NAME`` runs ``main(ctx)``.

    ``client`` roles get a connected, joined client in ``ctx.client`` before ``main`` runs;
    a server role (the controller) gets none and serves on its own.
    """

    name: str
    main: Callable[[RoleContext], Awaitable[None]]
    description: str = ""
    client: bool = True


@dataclass(frozen=True, slots=True)
class Monitor:
    """A blocking loop a role runs on its own thread, never on the event loop.

    ``run(ctx, stop)`` must return soon after ``stop`` (a ``threading.Event``) is set. It may
    call the client through ``ctx.call`` (the sync facade) or ``ctx.send_soon``.
    """

    name: str
    run: Callable[..., None]


@dataclass(frozen=True, slots=True)
class Field:
    """One configuration key: its type(s), default, and what it means."""

    types: tuple[type, ...]
    default: Any = None
    doc: str = ""
    required: bool = False


@dataclass(frozen=True, slots=True)
class ConfigSection:
    """A top-level ``[name]`` table of the config file and its keys.

    Keys not listed are errors unless ``open`` is true (a free-form table such as site
    resources). ``check`` may validate the whole section further and raise ``ValueError``.
    """

    name: str
    fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""
    open: bool = False
    check: Callable[[dict[str, Any]], None] | None = None
