"""The event-loop client: one connection to the primary, many requests in flight.

A :class:`Client` keeps one connection to whichever controller candidate is primary. It is
the async shell around :class:`~xcecore.client.machine.Machine` (the decisions) and
:mod:`xcecore.client.dialer` (the candidate walk); what it adds is I/O and tasks:

- **connect** walks the candidates (:class:`~xcecore.client.dialer.Walk`) and backs off
  with full-jitter exponential delay between failed passes. It never gives up unless the
  caller set a deadline or a retry budget.
- **failover lock** (:class:`~xcecore.client.lock.FailoverLock`): a lost link sends every
  waiting call through ONE reconnect; no call reconnects on its own.
- **reconnect hook**: after a RE-connect, still under the lock, ``hooks.reconnected`` runs. A
  client call from inside it raises :class:`HookContractError` instead of deadlocking.
- **post-call rejoin**: after a call returns, if a rejoin is pending and the op is a rejoin
  point, the client re-joins as a separate call. With nothing pending that costs one
  attribute read. A ``NOT_JOINED`` reply triggers a re-join and one retry.
- **heartbeats** make one best-effort reconnect pass, never sleep in back-off, never call the
  reconnect hook, and re-join when they go from failing to succeeding.
- **liveness**: no frame for ``liveness_timeout`` while a reply is owed marks the link dead.
- **sync token** (:class:`~xcecore.client.sync.SyncToken`): every push is shown to it; every
  join and re-join sends its ``since`` (store id and highest complete revision), so a member
  back within the controller's retention window is sent only what it missed.
- **idempotency**: every call has one ``rid`` (given, or generated), reused by all its
  retries; a keyed write whose reply is lost raises :class:`OutcomeUnknown` with it, and
  :meth:`Client.outcome` asks the controller what became of it.

Connections go through a :class:`~xcecore.client.backend.NetworkBackend` (TCP by default; an
in-memory network in tests).
"""

from __future__ import annotations

import inspect
import itertools
import math
import threading
import uuid
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from loguru import logger

from xcecore import wire
from xcecore.bridge import LoopBridge
from xcecore.candidates import Candidate
from xcecore.client.backend import TCP, NetworkBackend
from xcecore.client.backoff import Backoff
from xcecore.client.dialer import Dialed, walk_async
from xcecore.client.errors import (
    AuthenticationFailed,
    BackendUnavailable,
    ClientClosed,
    HookContractError,
    OutcomeUnknown,
)
from xcecore.client.latest import LatestBox
from xcecore.client.link import Link, LinkLost, open_link
from xcecore.client.lock import FailoverLock
from xcecore.client.machine import (
    CLOSED,
    CONNECTED,
    CONNECTING,
    NOT_JOINED,
    WRONG_SERVER,
    Budget,
    Call,
    Effect,
    Log,
    Machine,
    Notify,
    WakeBeat,
    WakeRejoin,
    judge_reply,
    reply_error,
)
from xcecore.client.settings import ClientConfig
from xcecore.client.sync import SyncToken

_T = TypeVar("_T")


class ClientHooks(Protocol):
    """What the client calls back: ONE events object (the runtime composes the role's
    handlers and the observer hooks into it; the plugin manager's facade is one).

    Any method may return an awaitable, or a list of results some of which are awaitables
    (async implementations); the client awaits them.
    """

    def reconnected(self, client: Client, candidate: Candidate) -> object:
        """``xce_reconnected``: called under the failover lock after every RE-connect."""
        ...

    def connection_state(
        self, client: Client, state: str, candidate: Candidate | None, detail: str
    ) -> object:
        """``xce_connection_state``: called by the observer task, in order."""
        ...

    def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> object:
        """``xce_push``: called by the push task, in sequence order."""
        ...


class _DefaultHooks:
    """Hooks of a client made without any: the built-in rejoin behaviour only."""

    def reconnected(self, client: Client, candidate: Candidate) -> object:
        client.mark_rejoin_pending()
        return None

    def connection_state(
        self, client: Client, state: str, candidate: Candidate | None, detail: str
    ) -> object:
        return None

    def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> object:
        return None


async def _await_all(result: object) -> None:
    """Await a hook's result: an awaitable, or a list of results some of which are awaitables."""
    items = result if isinstance(result, list | tuple) else (result,)
    waiting = [r for r in items if inspect.isawaitable(r)]
    try:
        while waiting:
            await waiting.pop(0)
    finally:
        for left in waiting:  # a failure above: do not leak "never awaited" coroutines
            if inspect.iscoroutine(left):
                left.close()


_LOG = {"DEBUG": logger.debug, "INFO": logger.info, "WARNING": logger.warning,
        "ERROR": logger.error}


class Client:
    """An async client of the controller: ``async with Client(...) as c: await c.call(...)``.

    ``rejoin_points`` (ops after which a pending rejoin happens) are resolved once, here;
    ``join_attrs`` are sent by every join and re-join, and so are ``subscribe`` (the role's
    :class:`~xcecore.role.Subscription` on the wire; None: the role's default at the
    controller) and the sync token's ``since``. Attributes for callers: ``role``, ``sync``,
    ``candidate`` (current, or None), ``state`` (see
    :data:`xcecore.client.machine.STATES`), ``connected`` and ``rejoin_pending``.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        role: str,
        hooks: ClientHooks | None = None,
        join_attrs: dict[str, Any] | None = None,
        rejoin_points: Iterable[str] = (),
        subscribe: dict[str, Any] | None = None,
        backend: NetworkBackend = TCP,
    ) -> None:
        self.config = config
        self.role = role
        self.join_attrs: dict[str, Any] = dict(join_attrs or {})
        # The join's ``subscribe`` argument (which pushes the role wants); omitted when it is
        # the default (every push), so a role that says nothing joins as it always did.
        self.subscribe = None if subscribe is None else dict(subscribe)
        self.sync = SyncToken()  # what the next join's ``since`` says
        self.rejoin_points: frozenset[str] = frozenset(rejoin_points)
        self._name = f"xce client {config.sender}"
        self.machine = Machine(config.candidates, name=self._name,
                               allow_unlisted=config.allow_unlisted_redirect,
                               connect_timeout=config.connect_timeout)
        self._rejoin = self.machine.rejoin  # the post-call path reads .pending of this
        self._hooks: ClientHooks = hooks if hooks is not None else _DefaultHooks()
        self._backend = backend
        self._uuid = uuid.uuid4().hex
        self._rids = itertools.count(1)
        self._conn: Link | None = None
        self._lock = FailoverLock(self._name)
        self._join_lock = anyio.Lock()  # one join at a time
        self._closed = False
        self._tg: TaskGroup | None = None
        self._loop_thread: int | None = None
        self._bridge = LoopBridge()  # how SyncClient threads hand calls to this client's loop
        self._state_event = anyio.Event()
        self._rejoin_event = anyio.Event()
        self._beat_now = anyio.Event()  # set when the link drops: try the heartbeat path at once
        self._rejoin_reason = ""
        self._push_tx: MemoryObjectSendStream[tuple[str, int, Any]]
        self._push_rx: MemoryObjectReceiveStream[tuple[str, int, Any]]
        # Unbounded on purpose: a slow push consumer must never stall the reader (and so
        # every reply); pushes are never dropped either, the seq contract forbids it.
        self._push_tx, self._push_rx = anyio.create_memory_object_stream[tuple[str, int, Any]](
            math.inf
        )
        self._latest = LatestBox()  # post_latest: newest value per key, sent by one task

    # ------------------------------------------------------------------ life cycle
    async def __aenter__(self) -> Client:
        if self._tg is not None or self._closed:
            raise ClientClosed(f"{self._name}: a Client can be entered only once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._loop_thread = threading.get_ident()
        self._bridge.bind()
        self._latest.bind()
        for loop in (self._push_loop, self._state_loop, self._heartbeat_loop,
                     self._rejoin_loop, self._latest_loop):
            tg.start_soon(loop, name=f"{self._name} {loop.__name__}")
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        await self.aclose()
        assert self._tg is not None
        try:
            # The body's own exception is the caller's to see as it is: handing it to the task
            # group would wrap it in an ExceptionGroup. Our tasks are cancelled by aclose().
            await self._tg.__aexit__(None, None, None)
            return None
        finally:
            self._latest.unbind()
            self._bridge.unbind()
            with anyio.move_on_after(1.0, shield=True):
                await self._deliver_states()

    async def aclose(self) -> None:
        """Close the connection and stop every background task; idempotent."""
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        if conn is not None:
            self._drop(conn, "client closed")
        self._do(self.machine.set_state(CLOSED, None, "client closed"))
        logger.info("{}: closed", self._name)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    @property
    def state(self) -> str:
        """The connection state (one of :data:`xcecore.client.machine.STATES`)."""
        return self.machine.state

    @property
    def candidate(self) -> Candidate | None:
        """The primary's candidate the client is (or was last) connected to."""
        return self.machine.candidate

    @property
    def connected(self) -> bool:
        """True while a live connection to a primary exists."""
        conn = self._conn
        return conn is not None and conn.alive

    @property
    def failover_locked(self) -> bool:
        """True while a (re)connect holds the failover lock."""
        return self._lock.locked()

    @property
    def rejoin_pending(self) -> bool:
        """A re-join is due after the next rejoin-point call."""
        return self._rejoin.pending

    def mark_rejoin_pending(self) -> None:
        """Ask for a re-join at the next rejoin point (what ``xce_reconnected`` impls do)."""
        self._rejoin.ask()

    # ------------------------------------------------------------------ public calls
    async def connect(
        self, *, deadline: float | None = None, retry_budget: int | None = None
    ) -> Candidate:
        """Connect (if not connected) and return the primary's candidate.

        ``deadline`` is seconds from now; ``retry_budget`` is how many failed passes over the
        candidates are allowed after the first. Either running out raises
        :class:`BackendUnavailable`; with neither, this never gives up.
        """
        self._lock.check_reentry("connect()")
        conn = self._conn
        if conn is not None and conn.alive:
            return conn.candidate
        budget = Budget(retry_budget)
        conn = await self._bounded("connect", self._failover(budget), deadline, budget, None)
        return conn.candidate

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        deadline: float | None = None,
        retry_budget: int | None = None,
        rid: str | None = None,
    ) -> Any:
        """Send ``op`` with ``args`` to the primary and return its result.

        Retries (same idempotency key: ``rid``, or one generated for this call) across
        connection loss and REDIRECT/NO_PRIMARY replies, re-joins and retries once on
        NOT_JOINED, and runs the post-call rejoin. Raises :class:`xcecore.wire.RemoteError`
        for other error replies. When ``deadline`` (seconds from now) or ``retry_budget``
        (retries after the first try: re-sends and failed connect passes) runs out it raises
        :class:`OutcomeUnknown` for a keyed write that was sent and never answered, else
        :class:`BackendUnavailable` (the call was not applied).
        """
        if self._lock.owner is not None:
            self._lock.check_reentry(f"call({op!r})")
        result = await self._invoke(op, args, deadline, retry_budget, rid)
        if self._rejoin.pending and op in self.rejoin_points:
            await self._post_call_rejoin(op)
        return result

    def rejoin_due(self, op: str) -> bool:
        """The post-call check :meth:`call` makes inline: is a re-join due after ``op``?"""
        return self._rejoin.pending and op in self.rejoin_points

    async def outcome(self, rid: str, *, deadline: float | None = None,
                      retry_budget: int | None = None) -> dict[str, Any]:
        """What became of the write with idempotency key ``rid`` (the controller's ``outcome``
        op): ``{"rid", "outcome": "applied", "result"}``, ``{"outcome": "pending"}`` (ask
        again) or ``{"outcome": "not_applied"}`` -- final: the key can no longer be applied,
        so send the write again under a new key if it is still wanted."""
        result: dict[str, Any] = await self.call("outcome", {"rid": rid}, deadline=deadline,
                                                 retry_budget=retry_budget)
        return result

    async def join(
        self, *, deadline: float | None = None, retry_budget: int | None = None
    ) -> Any:
        """Join (or re-join) as :attr:`role` with the join attributes; returns the reply.

        Clears :attr:`rejoin_pending`: a join brings the member's state up to date (a sync,
        resumed from :attr:`sync` when the controller still has what was missed).
        """
        self._lock.check_reentry("join()")
        async with self._join_lock:
            return await self._join(deadline, retry_budget)

    async def _join(self, deadline: float | None, retry_budget: int | None) -> Any:
        """The join itself; the caller holds ``_join_lock``, so joins never overlap."""
        args: dict[str, Any] = {"role": self.role, "attrs": self.join_attrs,
                                "since": self.sync.since()}
        if self.subscribe is not None:
            args["subscribe"] = self.subscribe
        return await self._invoke("join", args, deadline, retry_budget, None)

    async def heartbeat(self) -> bool:
        """Send one ``heartbeat``; True if the primary answered.

        If disconnected, first makes one best-effort reconnect pass (skipped when a failover
        holds the lock; never sleeps in back-off; never calls the reconnect hook). When
        heartbeats go from failing to succeeding on a connection that has not joined, the
        client re-joins, so an idle client recovers on its own.
        """
        self._lock.check_reentry("heartbeat()")
        rj = self._rejoin
        conn = self._conn
        recovered = False
        if conn is None or not conn.alive:
            conn = await self._best_effort_reconnect()
            if conn is None:
                rj.beats_failing = True
                return False
            effects = self.machine.beat_reconnected(conn.joined)
            if effects:
                self._do(effects)
                return True
            recovered = True
        try:
            reply = await conn.request("heartbeat", {}, None)
        except LinkLost:
            rj.beats_failing = True
            return False
        code = "" if reply.get("ok") is True else reply_error(reply)[0]
        if code in WRONG_SERVER:
            self._drop(conn, f"it answered {code} to a heartbeat: it is not the primary")
            rj.beats_failing = True
            return False
        self._do(self.machine.beat_answered(code, conn.joined, recovered))
        return True

    def post_latest(self, key: str, op: str, args: dict[str, Any]) -> None:
        """Queue ``op(args)`` for delivery by a background task; only the newest per ``key``.

        Thread-safe and non-blocking, callable from any thread (monitors). While the client
        is disconnected, a newer value for the same key replaces the queued one.
        """
        self._latest.post(key, (op, args))

    # ------------------------------------------------------------------ effects
    def _do(self, effects: list[Effect]) -> None:
        """Perform what the machine decided."""
        for effect in effects:
            if type(effect) is Notify:
                self._state_event.set()
            elif type(effect) is Log:
                _LOG[effect.level]("{}", effect.text)
            elif type(effect) is WakeRejoin:
                self._rejoin_reason = effect.reason
                self._rejoin_event.set()
            elif type(effect) is WakeBeat:
                self._beat_now.set()

    def _log(self, level: str, text: str) -> None:
        _LOG[level]("{}", text)

    # ------------------------------------------------------------------ call machinery
    async def _invoke(
        self,
        op: str,
        args: dict[str, Any] | None,
        deadline: float | None,
        retry_budget: int | None,
        rid: str | None,
    ) -> Any:
        call = Call(op, rid or f"{self._uuid}-{next(self._rids)}", Budget(retry_budget))
        if deadline is None and retry_budget is None:
            return await self._attempts(call, args or {})
        return await self._bounded(op, self._attempts(call, args or {}), deadline, call.budget,
                                   call)

    async def _bounded(
        self, what: str, work: Coroutine[Any, Any, _T], deadline: float | None, budget: Budget,
        call: Call | None,
    ) -> _T:
        """Run ``work`` within ``deadline``; either bound running out is the give-up error."""
        try:
            if deadline is None:
                return await work
            with anyio.fail_after(deadline):
                return await work
        except TimeoutError:
            exc = self.machine.deadline_error(what, deadline or 0.0, call, budget)
            self._do(self.machine.gave_up(what, exc))
            raise exc from budget.last_error
        except AuthenticationFailed:  # logged where it was found
            raise
        except (BackendUnavailable, OutcomeUnknown) as exc:
            self._do(self.machine.gave_up(what, exc))
            raise
        finally:
            work.close()  # never started if fail_after(0) fired first

    async def _attempts(self, call: Call, args: dict[str, Any]) -> Any:
        """Send until a primary answers: one rid, retried across failovers."""
        op, rid, rj = call.op, call.rid, self._rejoin
        retried_not_joined = False
        while True:
            conn = self._conn
            if conn is None or not conn.alive:
                conn = await self._failover(call.budget, call)
            asked = rj.sending() if op == "join" else 0
            joins_before = rj.joins
            try:
                reply = await conn.request(op, args, rid, call)
            except LinkLost as exc:
                call.link_lost()
                call.spend(exc)
                continue
            call.answered()
            verdict = judge_reply(op, reply, retried_not_joined)
            if verdict.kind == "ok":
                if op == "join":
                    conn.joined = True
                    rj.joins += 1
                    again = rj.done(asked)
                    self._do(self.machine.joined(again, self.role, self.machine.candidate))
                return verdict.result
            if verdict.kind == "wrong_server":
                error = wire.RemoteError(verdict.code, verdict.message, verdict.extra)
                self._drop(conn, f"it answered {verdict.code} to {op}: it is no longer the primary",
                           redirect=verdict.extra.get("primary"), retrying=True)
                call.spend(error)
                continue
            if verdict.kind == "not_joined":
                retried_not_joined = True
                self._log("INFO", f"{self._name}: {conn.candidate} answered NOT_JOINED to {op}; "
                                  "re-joining, then retrying once")
                self._lock.check_reentry("join()")
                async with self._join_lock:
                    # A join that completed on this connection after the request went out (a
                    # heartbeat's re-join racing this call) already answers it: just retry.
                    if not (conn.joined and conn is self._conn and rj.joins > joins_before):
                        await self._join(None, None)
                continue
            raise wire.RemoteError(verdict.code, verdict.message, verdict.extra)

    async def _post_call_rejoin(self, op: str) -> None:
        self._rejoin.pending = False
        await self._rejoin_now(f"{op} (rejoin pending)", self._rejoin.asks)

    async def _rejoin_now(self, why: str, want: int | None) -> None:
        """Re-join unless that is done already; a failure keeps the rejoin pending.

        ``want`` is the count of rejoin requests this re-join must answer: a join that
        started after them answers them all, so a heartbeat's re-join and a rejoin point's
        racing each other send one join, not two. None: any join on this connection will do.
        """
        async with self._join_lock:
            conn = self._conn
            if conn is not None and conn.alive and self._rejoin.covered(conn.joined, want):
                return
            self._log("INFO", f"{self._name}: re-joining after {why}")
            try:
                await self._join(None, None)
            except wire.RemoteError as exc:
                self._rejoin.ask()
                self._log("WARNING", f"{self._name}: re-join after {why} refused: {exc}; still pending")

    # ------------------------------------------------------------------ failover
    def _check_sync_caller(self) -> None:
        """Refuse blocking facade calls made on this client's own event-loop thread."""
        if threading.get_ident() == self._loop_thread:
            raise HookContractError(
                f"{self._name}: the blocking SyncClient was called on the client's own event-"
                "loop thread (from a hook such as xce_reconnected or xce_push?); it would "
                "deadlock. The xce_reconnected contract: only call client.mark_rejoin_pending()"
                " and return; elsewhere on the loop, await client.call() from a task."
            )

    async def _failover(self, budget: Budget, call: Call | None = None) -> Link:
        """The live connection, after waiting for (or doing) the one reconnect.

        ``budget`` pays for failed passes; when it runs out, ``call`` (if any) decides the
        error (an unanswered keyed write's outcome is unknown).
        """
        if self._closed or self._tg is None:
            raise ClientClosed(f"{self._name}: client is closed or not entered (use async with)")
        async with self._lock.hold("a client call"):
            conn = self._conn
            if conn is not None and conn.alive:
                return conn  # another task reconnected while we waited
            conn, detail = await self._establish(budget, call)
        # State observers hear about it only once the lock is free (they may call us).
        self._do(self.machine.set_state(CONNECTED, conn.candidate, detail))
        return conn

    async def _establish(self, budget: Budget, call: Call | None) -> tuple[Link, str]:
        """Under the lock: passes with back-off until a primary answers, then the hook."""
        machine = self.machine
        if not machine.ever_connected:
            self._do(machine.set_state(CONNECTING, None, "connecting"))
        backoff = Backoff(self.config.backoff_base, self.config.backoff_cap)
        while True:
            conn = await self._connect_pass()
            if conn is not None:
                break
            if self._closed:
                raise ClientClosed(f"{self._name}: closed while connecting")
            refused = machine.auth_refused()
            if refused is not None:  # not an outage: say so now, do not retry
                self._do(refused[1])
                raise refused[0]
            if not budget.take(machine.last_error):
                if call is not None:
                    raise call.give_up(budget.exhausted())
                raise BackendUnavailable(budget.exhausted(), budget.last_error)
            delay, effects = machine.pass_failed(backoff)
            self._do(effects)
            await anyio.sleep(delay)
        first, took, effects = machine.connected(conn.candidate, anyio.current_time())
        self._install(conn)
        self._do(effects)
        if first:
            self._publish(conn)
            return conn, "connected"
        try:
            await self._call_reconnected_hook(conn)
        finally:
            self._publish(conn)
        self._do([machine.reconnected_line(conn.candidate, took)])
        return conn, f"reconnected after {took}"

    async def _call_reconnected_hook(self, conn: Link) -> None:
        try:
            await _await_all(self._hooks.reconnected(client=self, candidate=conn.candidate))
        except HookContractError as exc:
            self._log("ERROR", f"{self._name}: an xce_reconnected implementation broke its contract: {exc}")
            raise
        except Exception:
            logger.opt(exception=True).error(
                "{}: an xce_reconnected implementation failed; marking a rejoin pending",
                self._name)
            self.mark_rejoin_pending()

    async def _best_effort_reconnect(self) -> Link | None:
        """The heartbeat's one pass: no back-off, no hook, skipped if a failover is running."""
        if self._closed or self._tg is None or not self.machine.ever_connected or self._lock.locked():
            return None
        with self._lock.try_hold() as held:
            if not held:
                return None
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            conn = await self._connect_pass()
            if conn is None:
                refused = self.machine.auth_refused()
                if refused is not None:  # logged once; the next beat tries again
                    self._do(refused[1])
                return None
            detail, effects = self.machine.heartbeat_reconnected(conn.candidate, anyio.current_time())
            self._install(conn)
            self._publish(conn)
        self._do(effects)
        self._do(self.machine.set_state(CONNECTED, conn.candidate, detail))
        return conn

    async def _connect_pass(self) -> Link | None:
        """One walk over the candidates, following redirects; a primary's link or None."""
        walk = self.machine.start_pass()
        try:
            return await walk_async(walk, self._dial, self._log)
        finally:
            self.machine.pass_over(walk)

    async def _dial(self, cand: Candidate) -> Link | Dialed:
        """Dial ``cand``: its link if primary, else why not (and where a standby points)."""
        cfg = self.config
        opened = await open_link(cand, sender=cfg.sender, auth=cfg.auth,
                                 connect_timeout=cfg.connect_timeout, max_frame=cfg.max_frame,
                                 backend=self._backend, tls=cfg.tls)
        if opened.stream is None:
            return Dialed(opened.redirect, opened.failure, opened.timed_out, opened.refused,
                          opened.takeover)
        return Link(cand, opened.stream, max_frame=cfg.max_frame,
                    liveness_timeout=cfg.liveness_timeout, on_push=self._on_push,
                    on_lost=self._drop)

    # ------------------------------------------------------------------ a live connection
    def _install(self, conn: Link) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._serve, conn, name=f"{self._name} reader {conn.candidate}")

    async def _serve(self, conn: Link) -> None:
        try:
            await conn.serve()
        except Exception as exc:  # never let one connection take the client down
            logger.opt(exception=True).error("{}: reader for {} failed", self._name,
                                             conn.candidate)
            self._drop(conn, f"internal error: {exc}")

    def _publish(self, conn: Link) -> None:
        self._conn = conn
        self.machine.candidate = conn.candidate

    def _drop(
        self, conn: Link, reason: str, *, redirect: object = None, retrying: bool = False
    ) -> None:
        """Mark ``conn`` dead: fail its outstanding requests, stop its reader, log once."""
        pending = conn.kill(reason)
        if pending is None:
            return
        self._do(self.machine.link_lost(
            conn.candidate, reason, current=conn is self._conn, closing=self._closed,
            in_flight=pending, redirect=redirect, retrying=retrying, now=anyio.current_time()))

    def _on_push(self, conn: Link, msg: dict[str, Any]) -> None:
        event, seq = msg.get("push"), msg.get("seq")
        if not isinstance(event, str) or not isinstance(seq, int) or isinstance(seq, bool):
            raise wire.WireError(f"malformed push: {msg!r:.200}")
        self._do(self.machine.push_arrived(conn.candidate, conn.next_seq, seq))
        conn.next_seq = seq + 1
        data = msg.get("data")
        self.sync.observe(event, data)
        self._push_tx.send_nowait((event, seq, data))

    # ------------------------------------------------------------------ background tasks
    async def _push_loop(self) -> None:
        async for event, seq, data in self._push_rx:
            try:
                result = self._hooks.push(client=self, role=self.role, event=event, seq=seq,
                                          data=data)
                if result is not None:
                    await _await_all(result)
            except Exception:
                logger.opt(exception=True).error("{}: xce_push for {} (seq {}) failed",
                                                 self._name, event, seq)

    async def _state_loop(self) -> None:
        while True:
            await self._state_event.wait()
            self._state_event = anyio.Event()
            await self._deliver_states()

    async def _deliver_states(self) -> None:
        for state, candidate, detail in self.machine.states.take():
            try:
                await _await_all(self._hooks.connection_state(
                    client=self, state=state, candidate=candidate, detail=detail))
            except Exception:
                logger.opt(exception=True).error("{}: xce_connection_state({}) failed",
                                                 self._name, state)

    async def _heartbeat_loop(self) -> None:
        # While the link is down, beats come faster than the cadence, each one best-effort
        # reconnect pass: at once when the link drops, then after jittered delays growing to
        # the heartbeat interval. An idle member thus finds a freshly promoted standby in
        # milliseconds, and a herd of members that lost the same primary is spread out.
        if self.config.heartbeat_interval == 0:
            return  # heartbeats off
        cfg, machine, rj = self.config, self.machine, self._rejoin
        quick = Backoff(cfg.backoff_base, cfg.heartbeat_interval, busy_cap=cfg.backoff_cap)
        while True:
            conn = self._conn
            down = rj.joined_once and (conn is None or not conn.alive)
            # After a pass in which a candidate timed out (alive, but too busy to finish our
            # handshake), spread over a connect timeout like the call path does: a thousand
            # members re-queuing every heartbeat interval is how a re-join storm collapses.
            # After one that ended at a standby promising a takeover, wait as long as it said.
            with anyio.move_on_after(machine.beat_delay(quick, down, cfg.heartbeat_interval)):
                await self._beat_now.wait()
            self._beat_now = anyio.Event()
            # Heartbeats keep a member alive and bring an idle member back; a client that never
            # joined (a command, a script) has nothing to keep alive and only calls.
            if machine.ever_connected and rj.joined_once:
                try:
                    await self.heartbeat()
                except Exception:
                    logger.opt(exception=True).error("{}: heartbeat failed", self._name)

    async def _rejoin_loop(self) -> None:
        while True:
            await self._rejoin_event.wait()
            self._rejoin_event = anyio.Event()
            try:
                await self._rejoin_now(self._rejoin_reason,
                                       self._rejoin.asks if self._rejoin.pending else None)
            except Exception:
                logger.opt(exception=True).error("{}: re-join failed", self._name)

    async def _latest_loop(self) -> None:
        while True:
            await self._latest.wait()
            if not self.connected:
                # Values keep replacing each other meanwhile: the newest is sent after.
                await self._failover(Budget(None))
            taken = self._latest.take()
            if taken is None:
                continue
            key, (op, args) = taken
            try:
                await self.call(op, args)
            except ClientClosed:
                return
            except wire.RemoteError as exc:
                self._log("WARNING", f"{self._name}: {op} for {key!r} refused ({exc}); value dropped")
            except Exception:
                logger.opt(exception=True).error("{}: sending {} for {!r} failed",
                                                 self._name, op, key)


__all__ = ["NOT_JOINED", "Client", "ClientHooks"]
