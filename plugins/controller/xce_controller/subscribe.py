"""What a member receives: its subscription, per kind of record (docs/protocol.md, "Join").

A join's ``subscribe`` maps a kind to a scope; a kind it leaves out is not sent. Absent, the
role's historical default applies (:func:`default_for`); ``{}`` joins with no pushes but
``shutdown``. The older form ``{"pushes": "all" | "none"}`` still means the role's default
and nothing.

Scopes: ``all`` for every kind; for ``jobs`` also ``unfinished`` (pending and active jobs; a
job that finishes is sent once more, finished) and ``host`` (the active jobs on the member's
own host: workers); for ``hosts`` and ``resvals`` also ``own`` (the worker's host). A scope
tied to a host needs one: only a worker has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from xcecore import role as _role
from xcecore.wire import ErrorCode, RemoteError

SCOPES: Final = _role.SCOPES
"""Every kind a member may subscribe to, and its scopes (the role API's table)."""
HOSTED: Final = frozenset({"own", "host"})
"""Scopes that mean "the member's own host"."""
WORKER_DEFAULT: Final = {"cluster": "all", "queues": "all", "hosts": "own", "jobs": "host",
                         "resvals": "own"}
EVERYTHING: Final = {kind: "all" for kind in _role.KINDS}


@dataclass(frozen=True, slots=True)
class Subscription:
    """A member's subscription: kind -> scope, and its host for the hosted scopes."""

    scopes: tuple[tuple[str, str], ...]
    host: str | None = None

    def scope(self, kind: str) -> str | None:
        """The member's scope for ``kind``, or None (not subscribed)."""
        for k, s in self.scopes:
            if k == kind:
                return s
        return None

    def kinds(self) -> dict[str, str]:
        return dict(self.scopes)

    def hosted(self) -> bool:
        """Whether it follows records of its own host only (a worker's view)."""
        return any(s in HOSTED for _, s in self.scopes)

    def to_wire(self) -> dict[str, str]:
        return dict(self.scopes)

    def wanted(self) -> _role.Subscription:
        """The same subscription as the role API spells it (what a member's replica takes)."""
        return _role.Subscription(self.scopes)


NONE = Subscription(())


def default_for(role: str, host: str | None) -> Subscription:
    """The subscription of a join that sends none: a worker its host's view, others all."""
    scopes = WORKER_DEFAULT if host is not None and role == "worker" else EVERYTHING
    return Subscription(_role.Subscription.from_wire(scopes).scopes, host)


def parse(given: Mapping[str, Any] | None, role: str, host: str | None) -> Subscription:
    """The subscription a join asks for (:meth:`xcecore.role.Subscription.from_wire` parses
    it); INVALID names what is wrong with it."""
    if given is None:
        return default_for(role, host)
    if set(given) == {"pushes"}:  # the form of joins before per-kind scopes
        pushes = given["pushes"]
        if pushes == "all":
            return default_for(role, host)
        if pushes == "none":
            return NONE
        raise _invalid(f'"pushes" must be "all" or "none", not {pushes!r}')
    try:
        wanted = _role.Subscription.from_wire(given)
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    for kind, scope in wanted.scopes:
        if scope in HOSTED and host is None:
            raise _invalid(f"scope {scope!r} of {kind!r} is a worker's own host; this member "
                           "has none")
    return Subscription(wanted.scopes, host)


def _invalid(text: str) -> RemoteError:
    return RemoteError(ErrorCode.INVALID, f"join: subscribe: {text}", {"arg": "subscribe"})
