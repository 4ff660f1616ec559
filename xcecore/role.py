"""The role API: what a plugin registers, the object it builds, and the context that object gets.

A plugin adds a role by returning a :class:`RoleSpec` from ``xce_roles``. ``xce run NAME``
builds the role's object with ``spec.factory(ctx)`` (a :class:`Role`, usually the subclass
itself), then asks it once for what it joins with, after which ops it re-joins and which
pushes it wants, connects, joins, starts its monitors and awaits its :meth:`Role.main`. The
core calls that one object for the role's pushes and connection changes: a role never needs to
ask "is this push for me?".

The role's identity is its name (the handshake says ``NAME@host``); the controller decides
what a role may do from that name (``docs/protocol-ops.md``), which is where configured grants
of ops to third-party roles will attach.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from xcecore import auth
from xcecore.bridge import LoopBridge, StopEvent
from xcecore.candidates import Candidate, candidates_from_config
from xcecore.config import Config

if TYPE_CHECKING:
    import pluggy
    from anyio.from_thread import BlockingPortal

    from xcecore.client import Client, SyncClient


# -------------------------------------------------------------------------------------------
# Records a role declares
# -------------------------------------------------------------------------------------------

PushSelection = Literal["all", "none"]


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which pushes a role receives from the controller; sent with every join.

    Today a role takes every push (``all``: the full ``state`` after each join, then every
    delta) or none (``none``: it joins, so it is a member the controller lists, but is sent
    nothing). The record will grow finer selections (per kind of push); a role that says
    nothing gets ``all``.
    """

    pushes: PushSelection = "all"

    def __post_init__(self) -> None:
        if self.pushes not in ("all", "none"):
            raise ValueError(f"Subscription.pushes must be 'all' or 'none', got {self.pushes!r}")

    def to_wire(self) -> dict[str, Any]:
        """The ``subscribe`` argument of the ``join`` op."""
        return {"pushes": self.pushes}


ALL_PUSHES = Subscription("all")
NO_PUSHES = Subscription("none")


@dataclass(frozen=True, slots=True)
class Monitor:
    """A blocking loop a role runs on its own thread, never on the event loop.

    ``run(stop)`` must return soon after ``stop`` (a ``threading.Event``) is set. It reaches
    the controller through the role's context: ``ctx.call`` (blocking), ``ctx.client.post_latest``
    (send the newest value of something, never blocks), or ``ctx.bridge`` to hand work to the loop.
    """

    name: str
    run: Callable[[threading.Event], None]


RoleFactory = Callable[["RoleContext"], "Role"]


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """A role a plugin adds: ``xce run NAME`` builds ``factory(ctx)`` and runs it.

    ``client`` roles get a connected, joined client in ``ctx.client`` before ``main`` runs;
    a server role (the controller) gets none and serves on its own. The role's config section
    is ``[NAME]`` (``ctx.section``); its required keys are checked before the role connects.
    """

    name: str
    factory: RoleFactory
    description: str = ""
    client: bool = True


# -------------------------------------------------------------------------------------------
# The object a role builds
# -------------------------------------------------------------------------------------------

Handled = Awaitable[None] | None
"""What a push or connection-state handler returns: None, or an awaitable the core awaits."""


class Role:
    """Base class of a role's object; override what the role needs.

    The core asks :meth:`join_attributes`, :attr:`rejoin_points` and :attr:`subscription`
    once, before connecting; calls :meth:`push` and :meth:`connection_state` on the event loop
    (one at a time, in order; an ``async def`` handler is awaited before the next one runs);
    starts each of :meth:`monitors` on its own thread after the first join; and awaits
    :meth:`main`. The role stops when ``main`` returns or ``ctx.stop`` is set.
    """

    rejoin_points: frozenset[str] = frozenset()
    """Ops after which the client re-joins when a reconnect left a rejoin pending."""

    subscription: Subscription = ALL_PUSHES
    """Which pushes the role receives."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx

    def join_attributes(self) -> dict[str, Any]:
        """What the role joins with, sent by every join and re-join: describe the member
        (a worker's host name, ncpus, ...), not a moment. Asked once; must not call the client."""
        return {}

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """The controller pushed ``event``: ``state`` (the full state) after every (re-)join,
        deltas after it. On the event loop: never block; hand long work to a thread."""
        return None

    def connection_state(self, state: str, candidate: Candidate | None, detail: str) -> Handled:
        """The client's connection changed state (``connecting``, ``connected``,
        ``reconnecting``, ``rejoined``, ``degraded``, ``closed``). On the event loop, from
        the client's observer task; calling the client from here is allowed."""
        return None

    def monitors(self) -> Iterable[Monitor]:
        """The role's threads, started after the first join and stopped with the role."""
        return ()

    async def main(self) -> None:
        """The role's work; the default serves pushes until the role is told to stop."""
        await self.ctx.stop.wait_async()


# -------------------------------------------------------------------------------------------
# The context a role gets
# -------------------------------------------------------------------------------------------


class Plugins(Protocol):
    """What a role may ask of the plugin manager (:class:`xcecore.plugins.PluginManager`)."""

    @property
    def hook(self) -> pluggy.HookRelay:
        """Every hook, including those a distribution adds with ``xce_addhooks``."""
        ...

    def resreq_evaluator(self, registry: Any) -> Any:
        """The resource-requirement evaluator for ``registry``."""
        ...


@dataclass(eq=False)  # identity semantics: one context per running role
class RoleContext:
    """What a role's object gets: its name, config, plugins, and (client roles) its client.

    - ``client``: connected and joined before ``main`` runs (None for server roles). On the
      loop, ``await ctx.client.call(op, args)``; from a thread, :meth:`call`.
    - ``bridge``: hands work from a thread to the loop (:class:`xcecore.bridge.LoopBridge`).
    - ``stop``: set when the role must stop; threads ``stop.wait(t)``, tasks
      ``await stop.wait_async()``.
    - ``section``: the role's own config section ``[<role>]``, validated, defaults filled.
    """

    role: str
    config: Config
    pm: Plugins
    identity: str
    candidates: tuple[Candidate, ...]
    key: bytes | None
    client: Client | None = None
    bridge: LoopBridge = field(default_factory=LoopBridge)
    stop: StopEvent = field(init=False)
    portal: BlockingPortal | None = None
    _sync: SyncClient | None = None

    def __post_init__(self) -> None:
        self.stop = StopEvent(self.bridge)

    @classmethod
    def create(cls, role: str, pm: Plugins, config: Config) -> RoleContext:
        """A context for ``role`` before any connection is made."""
        cluster = config.cluster
        cands: tuple[Candidate, ...] = ()
        if cluster.get("peers") is not None or cluster.get("address") is not None:
            cands = candidates_from_config(cluster)
        key = auth.load_key(cluster.get("key"), cluster.get("key_file"))
        return cls(role, config, pm, identity(role, config.section(role)), cands, key)

    @property
    def section(self) -> dict[str, Any]:
        """This role's config section (``[<role>]``)."""
        return self.config.section(self.role)

    def call(self, op: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
        """Call the controller from a thread (never from the event loop); blocks for the answer.

        Raises what ``Client.call`` raises (:class:`xcecore.wire.RemoteError` for a refusal,
        ``BackendUnavailable`` when a retry budget or deadline runs out), and
        ``ClientClosed`` once the role is stopping instead of waiting through an outage.
        """
        if self._sync is None:
            raise RuntimeError(f"role {self.role!r} has no client to call through")
        return self._sync.call(op, args, **kw)


def identity(role: str, section: Mapping[str, Any]) -> str:
    """``role@host``: the handshake identity; the section's ``hname`` overrides the host name."""
    host = section.get("hname") or socket.gethostname()
    return f"{role}@{host}"
