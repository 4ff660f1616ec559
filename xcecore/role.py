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
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from xcecore import auth
from xcecore.auth import AuthMethod
from xcecore.bridge import LoopBridge, StopEvent
from xcecore.candidates import Candidate, candidates_from_config
from xcecore.config import Config

if TYPE_CHECKING:
    import pluggy
    from anyio.from_thread import BlockingPortal
    from prometheus_client import CollectorRegistry

    from xcecore.client import Client, SyncClient


# -------------------------------------------------------------------------------------------
# Records a role declares
# -------------------------------------------------------------------------------------------

KINDS: tuple[str, ...] = ("cluster", "queues", "hosts", "jobs", "members", "resvals",
                          "pend_reasons", "jusage", "revocations")
"""The kinds of records a member can subscribe to (docs/protocol.md, "State sync")."""

SCOPES: Mapping[str, frozenset[str]] = {
    "cluster": frozenset({"all"}),
    "queues": frozenset({"all"}),
    "hosts": frozenset({"all", "own"}),
    "jobs": frozenset({"all", "unfinished", "host"}),
    "members": frozenset({"all"}),
    "resvals": frozenset({"all", "own"}),
    "pend_reasons": frozenset({"all"}),
    "jusage": frozenset({"all"}),
    "revocations": frozenset({"all"}),
}
"""The scopes each kind accepts: ``all``; ``unfinished`` (pending and active jobs) and
``host`` (active jobs allocated to the member's own host); ``own`` (the member's own host)."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which records a role receives from the controller: kind -> scope; sent with every join.

    The join's ``subscribe`` argument is exactly :meth:`to_wire`. A kind that is absent is
    not sent at all; an empty subscription (:data:`NO_PUSHES`) joins a member that is sent
    nothing but ``shutdown``. Build one with keywords::

        Subscription.of(jobs="unfinished", hosts="all", queues="all", cluster="all")

    A role that declares nothing gets :data:`ALL_PUSHES` (every kind, ``all``).
    """

    scopes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for kind, scope in self.scopes:
            accepted = SCOPES.get(kind)
            if accepted is None:
                raise ValueError(f"Subscription: unknown kind {kind!r}; kinds are "
                                 f"{', '.join(KINDS)}")
            if scope not in accepted:
                raise ValueError(f"Subscription: kind {kind!r} takes scope "
                                 f"{' or '.join(repr(s) for s in sorted(accepted))}, not {scope!r}")
            if kind in seen:
                raise ValueError(f"Subscription: kind {kind!r} given twice")
            seen.add(kind)

    @classmethod
    def of(cls, **scopes: str) -> Subscription:
        """A subscription from ``kind=scope`` keywords (kinds in :data:`KINDS` order)."""
        order = {kind: i for i, kind in enumerate(KINDS)}
        return cls(tuple(sorted(scopes.items(), key=lambda kv: order.get(kv[0], len(order)))))

    @classmethod
    def from_wire(cls, given: Mapping[str, object]) -> Subscription:
        """The subscription a join's ``subscribe`` argument names (:meth:`to_wire`'s inverse);
        the one parser of it, the controller's too. ``ValueError`` names what is wrong."""
        scopes: dict[str, str] = {}
        for kind, scope in given.items():
            if not isinstance(kind, str) or not isinstance(scope, str):
                raise ValueError(f"Subscription: kind {kind!r:.40} -> scope {scope!r:.40}: both "
                                 "must be strings")
            scopes[kind] = scope
        return cls.of(**scopes)

    def scope(self, kind: str) -> str | None:
        """The scope of ``kind``, or None when the role does not subscribe to it."""
        for name, scope in self.scopes:
            if name == kind:
                return scope
        return None

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds subscribed to."""
        return frozenset(kind for kind, _ in self.scopes)

    def to_wire(self) -> dict[str, str]:
        """The ``subscribe`` argument of the ``join`` op."""
        return dict(self.scopes)


ALL_PUSHES = Subscription.of(**dict.fromkeys(KINDS, "all"))
"""Every kind, every record: what a role that declares nothing receives."""
NO_PUSHES = Subscription()
"""Nothing (but ``shutdown``): a member that only calls."""


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
    exec_env: ExecEnv | None = None
    """Environment variables the role's process must start with (read by the interpreter or
    the C library only at start: an allocator, glibc tunables), asked with the loaded config
    before anything else runs; when it returns any, ``xce run`` executes the process again
    (:func:`reexec`: same pid and command line) with them set. It must return None in the
    process so started (mark it with one of the variables), or it would execute forever."""


ExecEnv = Callable[[Config], Mapping[str, str] | None]
"""A :attr:`RoleSpec.exec_env`: the config -> the variables to start again with, or None."""


def reexec(env: Mapping[str, str]) -> NoReturn:
    """Execute this process again (same pid, interpreter and command line) with ``env`` added
    to its environment; output written so far is flushed first."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **env})


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
    """Which records the role receives (kind -> scope); sent with every join."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx

    def join_attributes(self) -> dict[str, Any]:
        """What the role joins with, sent by every join and re-join: describe the member
        (a worker's host name, ncpus, ...), not a moment. Asked once; must not call the client."""
        return {}

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """The controller pushed ``event``: the sync after every (re-)join (``sync_begin``,
        ``sync_records``, ``sync_removed``, ``sync_end``), ordinary pushes (``job``, ``host``,
        ...) after and between its frames. Feed them to an :class:`xcecore.replica.Replica`
        rather than parsing them by hand. On the event loop: never block; hand long work to a
        thread."""
        return None

    def connection_state(self, state: str, candidate: Candidate | None, detail: str) -> Handled:
        """The client's connection changed state (``connecting``, ``connected``,
        ``reconnecting``, ``rejoined``, ``degraded``, ``closed``). On the event loop, from
        the client's observer task; calling the client from here is allowed."""
        return None

    def monitors(self) -> Iterable[Monitor]:
        """The role's threads, started after the first join and stopped with the role."""
        return ()

    def metrics(self) -> Iterable[Any]:
        """The role's gauges at a scrape of its ``/metrics`` (:mod:`xcecore.metrics`):
        prometheus-client metric families (``GaugeMetricFamily`` ...) named ``xce_<role>_*``.

        Called on the event loop at each scrape, and only when ``[metrics] ports`` gives the
        role a port. Read counts the role keeps: never walk its jobs or hosts (a scrape is a
        request; its cost must not grow with the cluster), never block or call the client;
        take the lock of what a thread updates. Counters and histograms updated as events
        happen belong in ``ctx.metrics`` instead.
        """
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
    auth: AuthMethod  # the configured authentication method ([cluster] auth)
    client: Client | None = None
    bridge: LoopBridge = field(default_factory=LoopBridge)
    stop: StopEvent = field(init=False)
    portal: BlockingPortal | None = None
    _sync: SyncClient | None = None
    _metrics: Any = None

    def __post_init__(self) -> None:
        self.stop = StopEvent(self.bridge)

    @classmethod
    def create(cls, role: str, pm: Plugins, config: Config) -> RoleContext:
        """A context for ``role`` before any connection is made."""
        cluster = config.cluster
        cands: tuple[Candidate, ...] = ()
        if cluster.get("peers") is not None or cluster.get("address") is not None:
            cands = candidates_from_config(cluster)
        method = auth.load_method(auth.settings_from_cluster(cluster))
        return cls(role, config, pm, identity(role, config.section(role)), cands, method)

    @property
    def section(self) -> dict[str, Any]:
        """This role's config section (``[<role>]``)."""
        return self.config.section(self.role)

    @property
    def metrics(self) -> CollectorRegistry:
        """The process's Prometheus registry: make counters and histograms with
        ``registry=ctx.metrics`` (exported only when ``[metrics] ports`` names the role)."""
        if self._metrics is None:
            from xcecore.metrics import new_registry

            self._metrics = new_registry()
        registry: CollectorRegistry = self._metrics
        return registry

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
