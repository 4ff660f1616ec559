"""The connection manager: one client, one connection to the primary, many requests in flight.

A :class:`Client` keeps one TCP connection to whichever controller candidate is primary.

- **connect** walks the candidates in order, starting from the last one that worked, follows a
  standby's redirect at once (to listed candidates only, unless configured otherwise), and
  backs off with full-jitter exponential delay between failed passes. It never gives up unless
  the caller set a deadline or a retry budget (then :class:`BackendUnavailable`).
- **failover lock**: a lost connection sends every waiting call through ONE reconnect, done by
  one task under a non-reentrant lock; no call reconnects on its own.
- **reconnect hook**: after a RE-connect, still under the lock, ``hooks.reconnected`` runs. A
  client call from inside it raises :class:`HookContractError` instead of deadlocking.
- **post-call rejoin**: after a call returns, if :attr:`Client.rejoin_pending` and the op is a
  rejoin point, the client re-joins as a separate call. With nothing pending that costs one
  attribute read. A ``NOT_JOINED`` reply triggers a re-join and one retry.
- **heartbeats** make one best-effort reconnect pass, never sleep in back-off, never call the
  reconnect hook, and re-join when they go from failing to succeeding.
- **liveness**: no frame for ``liveness_timeout`` while a reply is owed marks the link dead.
- **idempotency**: every call gets one ``rid``, reused by all its retries.

The decisions themselves live in :mod:`xcecore.connstate` (pure); the blocking facade for
threads is :class:`xcecore.syncclient.SyncClient`, re-exported here.
"""

from __future__ import annotations

import inspect
import itertools
import math
import threading
import uuid
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from loguru import logger

from xcecore import wire
from xcecore.backoff import Backoff
from xcecore.candidates import Candidate
from xcecore.connstate import (
    CLOSED,
    CONNECTED,
    CONNECTING,
    DEGRADED,
    RECONNECTING,
    REJOINED,
    WRONG_SERVER,
    StateQueue,
    candidate_order,
    reply_error,
    resolve_redirect,
    seq_gap,
)
from xcecore.latest import LatestBox
from xcecore.link import Link, LinkLost, open_link

__all__ = [
    "BackendUnavailable",
    "Client",
    "ClientClosed",
    "ClientConfig",
    "ClientHooks",
    "HookContractError",
    "SyncClient",
]

_T = TypeVar("_T")
_NOT_JOINED = wire.ErrorCode.NOT_JOINED.value


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How a client reaches the controller; built once from configuration.

    ``connect_timeout`` bounds TCP connect plus handshake per candidate; ``liveness_timeout`` is
    how long a link may stay silent while a reply is owed; ``backoff_base`` is the first
    delay after a full failed pass (doubling, full jitter, at most ``backoff_cap``).
    ``heartbeat_interval`` 0 turns heartbeats off: an idle client then finds out about a
    failover only at its next call (for tests of the call path, and one-shot tools).
    """

    candidates: tuple[Candidate, ...]
    sender: str
    key: bytes | None = None
    allow_unlisted_redirect: bool = False
    connect_timeout: float = 1.0
    liveness_timeout: float = 2.0
    heartbeat_interval: float = 0.5
    backoff_base: float = 0.02
    backoff_cap: float = 2.0
    max_frame: int = wire.DEFAULT_MAX_FRAME

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("ClientConfig needs at least one controller candidate")
        for name in ("connect_timeout", "liveness_timeout", "backoff_base", "backoff_cap"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ClientConfig.{name} must be positive, got {getattr(self, name)}")
        if not self.heartbeat_interval >= 0:
            raise ValueError(f"ClientConfig.heartbeat_interval must be >= 0 (0: off), "
                             f"got {self.heartbeat_interval}")


class ClientHooks(Protocol):
    """What the client calls back; the plugin manager's typed facade implements this.

    Any method may return an awaitable, or a list of results some of which are awaitables
    (async hook implementations); the client awaits them.
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
    """Hooks of a client made without a plugin manager: the built-in rejoin behaviour only."""

    def reconnected(self, client: Client, candidate: Candidate) -> object:
        client.mark_rejoin_pending()
        return None

    def connection_state(
        self, client: Client, state: str, candidate: Candidate | None, detail: str
    ) -> object:
        return None

    def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> object:
        return None


class BackendUnavailable(Exception):
    """A call's retry budget or deadline ran out before any primary answered.

    ``last_error`` is the last failure seen (also the ``__cause__``).
    """

    def __init__(self, message: str, last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.last_error = last_error


class HookContractError(RuntimeError):
    """The client was called from inside ``xce_reconnected`` (or the sync facade from the loop).

    Raised instead of deadlocking on the failover lock the hook's caller holds.
    """


class ClientClosed(RuntimeError):
    """The client is closed (or was never entered with ``async with``)."""


class _Budget:
    """A logical call's retry budget and the last error it saw."""

    __slots__ = ("last_error", "left", "total")

    def __init__(self, retries: int | None) -> None:
        if retries is not None and retries < 0:
            raise ValueError(f"retry_budget must be >= 0, got {retries}")
        self.total = retries
        self.left = retries
        self.last_error: BaseException | None = None

    def spend(self, error: BaseException | None) -> None:
        """Charge one retry for ``error``; raise :class:`BackendUnavailable` when none is left."""
        if error is not None:
            self.last_error = error
        if self.left is None:
            return
        if self.left <= 0:
            raise BackendUnavailable(
                f"retry budget of {self.total} exhausted (last error: {self.last_error})",
                self.last_error,
            )
        self.left -= 1


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


class Client:
    """An async client of the controller: ``async with Client(...) as c: await c.call(...)``.

    ``rejoin_points`` (ops after which a pending rejoin happens) are resolved once, here;
    ``join_attrs`` are sent by every join and re-join. Attributes for callers: ``role``,
    ``candidate`` (current, or None), ``state`` (see :data:`xcecore.connstate.STATES`),
    ``connected``, and ``rejoin_pending``.
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
    ) -> None:
        self.config = config
        self.role = role
        self.join_attrs: dict[str, Any] = dict(join_attrs or {})
        # The join's ``subscribe`` argument (which pushes the role wants); omitted when it is
        # the default (every push), so a role that says nothing joins as it always did.
        self.subscribe = None if subscribe in (None, {"pushes": "all"}) else dict(subscribe or {})
        self.rejoin_points: frozenset[str] = frozenset(rejoin_points)
        self.rejoin_pending = False
        self._asks = 0  # rejoin requests so far (mark_rejoin_pending)
        self._joins_done = 0  # joins answered ok, on any connection
        self._satisfied = 0  # of those, how many a completed join has answered
        self._join_lock = anyio.Lock()  # one join at a time
        """Set by :meth:`mark_rejoin_pending`; the post-call path reads only this."""
        self.candidate: Candidate | None = None
        self.state = CLOSED
        self._hooks: ClientHooks = hooks if hooks is not None else _DefaultHooks()
        self._name = f"xce client {config.sender}"
        self._uuid = uuid.uuid4().hex
        self._rids = itertools.count(1)
        self._conn: Link | None = None
        self._lock = anyio.Lock()
        self._lock_owner: int | None = None  # id of the task holding the failover lock
        self._last_good: Candidate | None = None
        self._preferred: Candidate | None = None  # a primary named by a REDIRECT reply
        self._lost: Candidate | None = None  # whose connection died; tried last until one works
        self._pass_timed_out = False  # a candidate of the last connect pass timed out
        self._ever_connected = False
        self._joined_once = False
        self._lost_at: float | None = None
        self._last_error: BaseException | None = None
        self._hb_failing = False
        self._closed = False
        self._tg: TaskGroup | None = None
        self._loop_thread: int | None = None
        self._states = StateQueue()
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
        self._set_state(CLOSED, None, "client closed")
        logger.info("{}: closed", self._name)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    @property
    def connected(self) -> bool:
        """True while a live connection to a primary exists."""
        conn = self._conn
        return conn is not None and conn.alive

    @property
    def failover_locked(self) -> bool:
        """True while a (re)connect holds the failover lock."""
        return self._lock.locked()

    def mark_rejoin_pending(self) -> None:
        """Ask for a re-join at the next rejoin point (what ``xce_reconnected`` impls do)."""
        self._asks += 1
        self.rejoin_pending = True

    # ------------------------------------------------------------------ public calls
    async def connect(
        self, *, deadline: float | None = None, retry_budget: int | None = None
    ) -> Candidate:
        """Connect (if not connected) and return the primary's candidate.

        ``deadline`` is seconds from now; ``retry_budget`` is how many failed passes over the
        candidates are allowed after the first. Either running out raises
        :class:`BackendUnavailable`; with neither, this never gives up.
        """
        self._check_reentry("connect()")
        conn = self._conn
        if conn is not None and conn.alive:
            return conn.candidate
        budget = _Budget(retry_budget)
        conn = await self._bounded("connect", self._failover(budget), deadline, budget)
        return conn.candidate

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        deadline: float | None = None,
        retry_budget: int | None = None,
    ) -> Any:
        """Send ``op`` with ``args`` to the primary and return its result.

        Retries (same idempotency key) across connection loss and REDIRECT/NO_PRIMARY replies,
        re-joins and retries once on NOT_JOINED, and runs the post-call rejoin. Raises
        :class:`xcecore.wire.RemoteError` for other error replies, and
        :class:`BackendUnavailable` when ``deadline`` (seconds from now) or ``retry_budget``
        (retries after the first try: re-sends and failed connect passes) runs out.
        """
        if self._lock_owner is not None:
            self._check_reentry(f"call({op!r})")
        result = await self._invoke(op, args, deadline, retry_budget)
        if self.rejoin_pending and op in self.rejoin_points:
            await self._post_call_rejoin(op)
        return result

    def rejoin_due(self, op: str) -> bool:
        """The post-call check :meth:`call` makes inline: is a re-join due after ``op``?"""
        return self.rejoin_pending and op in self.rejoin_points

    async def join(
        self, *, deadline: float | None = None, retry_budget: int | None = None
    ) -> Any:
        """Join (or re-join) as :attr:`role` with the join attributes; returns the reply.

        Clears :attr:`rejoin_pending`: a join resends the full state.
        """
        self._check_reentry("join()")
        async with self._join_lock:
            return await self._join(deadline, retry_budget)

    async def _join(self, deadline: float | None, retry_budget: int | None) -> Any:
        """The join itself; the caller holds ``_join_lock``, so joins never overlap."""
        again = self._joined_once
        asked = self._asks
        result = await self._invoke(
            "join", {"role": self.role, "attrs": self.join_attrs,
                     **({"subscribe": self.subscribe} if self.subscribe else {})},
            deadline, retry_budget
        )
        self._satisfied = max(self._satisfied, asked)
        self._joined_once = True
        where = self.candidate
        if again:
            logger.info("{}: re-joined as {} on {}", self._name, self.role, where)
            self._set_state(REJOINED, where, f"re-joined as {self.role}")
        else:
            logger.info("{}: joined as {} on {}", self._name, self.role, where)
        return result

    async def heartbeat(self) -> bool:
        """Send one ``heartbeat``; True if the primary answered.

        If disconnected, first makes one best-effort reconnect pass (skipped when a failover
        holds the lock; never sleeps in back-off; never calls the reconnect hook). When
        heartbeats go from failing to succeeding on a connection that has not joined, the
        client re-joins, so an idle client recovers on its own.
        """
        self._check_reentry("heartbeat()")
        conn = self._conn
        recovered = False
        if conn is None or not conn.alive:
            conn = await self._best_effort_reconnect()
            if conn is None:
                self._hb_failing = True
                return False
            if self._joined_once and not conn.joined:
                # A fresh connection to the primary is its own proof of life, and a member's
                # beat there would only earn NOT_JOINED: re-join at once (one round trip less
                # per member in a re-join storm).
                self._hb_failing = False
                self._wake_rejoin("heartbeats recovered")
                return True
            recovered = True
        try:
            reply = await conn.request("heartbeat", {}, None)
        except LinkLost:
            self._hb_failing = True
            return False
        code = "" if reply.get("ok") is True else reply_error(reply)[0]
        if code in WRONG_SERVER:
            self._drop(conn, f"it answered {code} to a heartbeat: it is not the primary")
            self._hb_failing = True
            return False
        recovered = recovered or self._hb_failing
        self._hb_failing = False
        if self._joined_once and not conn.joined and (recovered or code == _NOT_JOINED):
            self._wake_rejoin("heartbeats recovered")
        return True

    def post_latest(self, key: str, op: str, args: dict[str, Any]) -> None:
        """Queue ``op(args)`` for delivery by a background task; only the newest per ``key``.

        Thread-safe and non-blocking, callable from any thread (monitors). While the client
        is disconnected, a newer value for the same key replaces the queued one.
        """
        self._latest.post(key, (op, args))

    # ------------------------------------------------------------------ call machinery
    async def _invoke(
        self,
        op: str,
        args: dict[str, Any] | None,
        deadline: float | None,
        retry_budget: int | None,
    ) -> Any:
        rid = f"{self._uuid}-{next(self._rids)}"
        if deadline is None and retry_budget is None:
            return await self._attempts(op, args or {}, rid, _Budget(None))
        budget = _Budget(retry_budget)
        return await self._bounded(op, self._attempts(op, args or {}, rid, budget), deadline,
                                   budget)

    async def _bounded(
        self, what: str, work: Coroutine[Any, Any, _T], deadline: float | None, budget: _Budget
    ) -> _T:
        """Run ``work`` within ``deadline``; either bound running out is BackendUnavailable."""
        try:
            if deadline is None:
                return await work
            with anyio.fail_after(deadline):
                return await work
        except TimeoutError:
            exc = BackendUnavailable(
                f"{what}: no primary within the deadline of {deadline:g} s "
                f"(last error: {budget.last_error})", budget.last_error)
            self._give_up(what, exc)
            raise exc from budget.last_error
        except BackendUnavailable as exc:
            self._give_up(what, exc)
            raise
        finally:
            work.close()  # never started if fail_after(0) fired first

    def _give_up(self, what: str, exc: BackendUnavailable) -> None:
        logger.warning("{}: giving up on {}: {}", self._name, what, exc)
        self._set_state(DEGRADED, self.candidate, f"{what}: {exc}")

    async def _attempts(self, op: str, args: dict[str, Any], rid: str, budget: _Budget) -> Any:
        """Send until a primary answers: one rid, retried across failovers."""
        retried_not_joined = False
        while True:
            conn = self._conn
            if conn is None or not conn.alive:
                conn = await self._failover(budget)
            if op == "join":
                self.rejoin_pending = False  # this join resends the state; a later loss re-marks
            joins_before = self._joins_done
            try:
                reply = await conn.request(op, args, rid)
            except LinkLost as exc:
                budget.spend(exc)
                continue
            if reply.get("ok") is True:
                if op == "join":
                    conn.joined = True
                    self._joins_done += 1
                return reply.get("result")
            code, message, extra = reply_error(reply)
            if code in WRONG_SERVER:
                error = wire.RemoteError(code, message, extra)
                self._drop(conn, f"it answered {code} to {op}: it is no longer the primary",
                           redirect=extra.get("primary"), retrying=True)
                budget.spend(error)
                continue
            if code == _NOT_JOINED and op != "join" and not retried_not_joined:
                retried_not_joined = True
                logger.info("{}: {} answered NOT_JOINED to {}; re-joining, then retrying once",
                            self._name, conn.candidate, op)
                self._check_reentry("join()")
                async with self._join_lock:
                    # A join that completed on this connection after the request went out (a
                    # heartbeat's re-join racing this call) already answers it: just retry.
                    if not (conn.joined and conn is self._conn and self._joins_done > joins_before):
                        await self._join(None, None)
                continue
            raise wire.RemoteError(code, message, extra)

    async def _post_call_rejoin(self, op: str) -> None:
        self.rejoin_pending = False
        await self._rejoin(f"{op} (rejoin pending)", self._asks)

    async def _rejoin(self, why: str, want: int | None) -> None:
        """Re-join unless that is done already; a failure keeps the rejoin pending.

        ``want`` is the count of rejoin requests this re-join must answer: a join that
        started after them answers them all, so a heartbeat's re-join and a rejoin point's
        racing each other send one join, not two. None: any join on this connection will do.
        """
        async with self._join_lock:
            conn = self._conn
            if conn is not None and conn.alive and conn.joined and (want is None or self._satisfied >= want):
                return
            logger.info("{}: re-joining after {}", self._name, why)
            try:
                await self._join(None, None)
            except wire.RemoteError as exc:
                self.mark_rejoin_pending()
                logger.warning("{}: re-join after {} refused: {}; still pending", self._name, why, exc)

    # ------------------------------------------------------------------ failover
    def _check_reentry(self, what: str) -> None:
        owner = self._lock_owner
        if owner is not None and owner == anyio.get_current_task().id:
            raise HookContractError(
                f"{self._name}: {what} called from inside an xce_reconnected implementation, "
                "which runs while the failover lock is held; it would wait on that lock "
                "forever. The xce_reconnected contract: only record that a rejoin is needed "
                "(client.mark_rejoin_pending()) and return; the client re-joins after the next "
                "rejoin-point call."
            )

    def _check_sync_caller(self) -> None:
        """Refuse blocking facade calls made on this client's own event-loop thread."""
        if threading.get_ident() == self._loop_thread:
            raise HookContractError(
                f"{self._name}: the blocking SyncClient was called on the client's own event-"
                "loop thread (from a hook such as xce_reconnected or xce_push?); it would "
                "deadlock. The xce_reconnected contract: only call client.mark_rejoin_pending()"
                " and return; elsewhere on the loop, await client.call() from a task."
            )

    async def _failover(self, budget: _Budget) -> Link:
        """The live connection, after waiting for (or doing) the one reconnect."""
        if self._closed or self._tg is None:
            raise ClientClosed(f"{self._name}: client is closed or not entered (use async with)")
        me = anyio.get_current_task().id
        if self._lock_owner == me:
            self._check_reentry("a client call")
        async with self._lock:
            self._lock_owner = me
            try:
                conn = self._conn
                if conn is not None and conn.alive:
                    return conn  # another task reconnected while we waited
                conn, detail = await self._establish(budget)
            finally:
                self._lock_owner = None
        # State observers hear about it only once the lock is free (they may call us).
        self._set_state(CONNECTED, conn.candidate, detail)
        return conn

    async def _establish(self, budget: _Budget) -> tuple[Link, str]:
        """Under the lock: passes with back-off until a primary answers, then the hook."""
        first = not self._ever_connected
        if first:
            self._set_state(CONNECTING, None, "connecting")
        backoff = Backoff(self.config.backoff_base, self.config.backoff_cap)
        while True:
            conn = await self._connect_pass()
            if conn is not None:
                break
            if self._closed:
                raise ClientClosed(f"{self._name}: closed while connecting")
            budget.spend(self._last_error)
            # A candidate that timed out is alive but too busy: spread the retry over a
            # connect timeout at least, rather than re-queue at once (see Backoff.next_delay).
            delay = backoff.next_delay(self.config.connect_timeout if self._pass_timed_out else 0.0)
            if backoff.failures == 1:
                self._set_state(DEGRADED, None, "no controller candidate is primary")
            logger.warning("{}: no primary among {} ({}); next pass in {:.0f} ms",
                           self._name, ", ".join(map(str, self.config.candidates)),
                           self._last_error, delay * 1000)
            await anyio.sleep(delay)
        self._install(conn)
        if first:
            self._ever_connected = True
            logger.info("{}: connected to {} (primary)", self._name, conn.candidate)
            self._publish(conn)
            return conn, "connected"
        took = self._since_lost()
        try:
            await self._call_reconnected_hook(conn)
        finally:
            self._publish(conn)
        pending = "; rejoin pending" if self.rejoin_pending else ""
        logger.info("{}: reconnected to {} after {}{}", self._name, conn.candidate, took, pending)
        return conn, f"reconnected after {took}"

    async def _call_reconnected_hook(self, conn: Link) -> None:
        try:
            await _await_all(self._hooks.reconnected(client=self, candidate=conn.candidate))
        except HookContractError as exc:
            logger.error("{}: an xce_reconnected implementation broke its contract: {}",
                         self._name, exc)
            raise
        except Exception:
            logger.opt(exception=True).error(
                "{}: an xce_reconnected implementation failed; marking a rejoin pending",
                self._name)
            self.mark_rejoin_pending()

    async def _best_effort_reconnect(self) -> Link | None:
        """The heartbeat's one pass: no back-off, no hook, skipped if a failover is running."""
        if self._closed or self._tg is None or not self._ever_connected or self._lock.locked():
            return None
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            return None
        self._lock_owner = anyio.get_current_task().id
        try:
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            conn = await self._connect_pass()
            if conn is None:
                return None
            self._install(conn)
            self._publish(conn)
            took = self._since_lost()
        finally:
            self._lock_owner = None
            self._lock.release()
        logger.info("{}: heartbeat reconnected to {} after {}", self._name, conn.candidate, took)
        self._set_state(CONNECTED, conn.candidate, f"reconnected by heartbeat after {took}")
        return conn

    def _since_lost(self) -> str:
        if self._lost_at is None:
            return "an unknown time"
        return f"{(anyio.current_time() - self._lost_at) * 1000:.0f} ms"

    async def _connect_pass(self) -> Link | None:
        """One walk over the candidates, following redirects; a primary's connection or None."""
        preferred = self._preferred
        order = candidate_order(self.config.candidates, preferred or self._last_good,
                                None if preferred else self._lost)
        self._preferred = None
        self._pass_timed_out = False
        tried: set[Candidate] = set()
        for cand in order:
            target: Candidate | None = cand
            while target is not None and target not in tried:
                tried.add(target)
                outcome = await self._attempt(target)
                if isinstance(outcome, Link):
                    return outcome
                target = self._follow(target, outcome, tried)
        return None

    def _follow(self, source: Candidate, primary: str | None, tried: set[Candidate]) -> \
            Candidate | None:
        """Where a standby's redirect leads (None: go on with the next candidate)."""
        if primary is None:
            return None
        target, why = resolve_redirect(primary, self.config.candidates,
                                       self.config.allow_unlisted_redirect)
        if target is None:
            self._last_error = ConnectionError(f"{source} redirected to unlisted {primary}")
            logger.warning("{}: candidate {} is a standby redirecting to {}, not followed: {}",
                           self._name, source, primary, why)
            return None
        if target in tried:
            logger.warning("{}: candidate {} is a standby redirecting to {}, already tried in "
                           "this pass; going on", self._name, source, target)
            return None
        logger.warning("{}: candidate {} is a standby, following redirect to {}",
                       self._name, source, target)
        return target

    async def _attempt(self, cand: Candidate) -> Link | str | None:
        """Dial ``cand``: its link if primary, the address a standby's redirect names, or
        None for any failure (logged)."""
        cfg = self.config
        dialed = await open_link(cand, sender=cfg.sender, key=cfg.key,
                                 timeout=cfg.connect_timeout, max_frame=cfg.max_frame)
        if dialed.stream is not None:
            return Link(cand, dialed.stream, max_frame=cfg.max_frame,
                        liveness_timeout=cfg.liveness_timeout, on_push=self._on_push,
                        on_lost=self._drop)
        self._last_error = ConnectionError(f"{cand} {dialed.failure}")
        self._pass_timed_out = self._pass_timed_out or dialed.timed_out
        if dialed.redirect is not None:
            return dialed.redirect
        log = logger.error if dialed.failure.startswith("denied") else logger.warning
        log("{}: candidate {} {}; trying the next candidate", self._name, cand, dialed.failure)
        return None

    # ------------------------------------------------------------------ a live connection
    def _install(self, conn: Link) -> None:
        assert self._tg is not None
        self._last_good = conn.candidate
        self._lost = None
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
        self.candidate = conn.candidate

    def _drop(
        self, conn: Link, reason: str, *, redirect: object = None, retrying: bool = False
    ) -> None:
        """Mark ``conn`` dead: fail its outstanding requests, stop its reader, log once."""
        pending = conn.kill(reason)
        if pending is None:
            return
        if isinstance(redirect, str):
            target, _ = resolve_redirect(redirect, self.config.candidates,
                                         self.config.allow_unlisted_redirect)
            self._preferred = target
        elif conn is self._conn:
            self._lost = conn.candidate
        if conn is self._conn and not self._closed:
            self._lost_at = anyio.current_time()
            nxt = ("reconnecting" if retrying and not pending
                   else f"reconnecting ({pending} request(s) in flight)" if pending
                   else "will reconnect on the next call or heartbeat")
            logger.warning("{}: lost connection to {} ({}); {}",
                           self._name, conn.candidate, reason, nxt)
            self._set_state(RECONNECTING, conn.candidate, reason)
            self._beat_now.set()

    def _on_push(self, conn: Link, msg: dict[str, Any]) -> None:
        event, seq = msg.get("push"), msg.get("seq")
        if not isinstance(event, str) or not isinstance(seq, int) or isinstance(seq, bool):
            raise wire.WireError(f"malformed push: {msg!r:.200}")
        gap = seq_gap(conn.next_seq, seq)
        if gap:
            logger.warning("{}: push sequence gap from {}: expected seq {}, got {}; "
                           "state may be stale, re-joining for a full state",
                           self._name, conn.candidate, conn.next_seq, seq)
            self.mark_rejoin_pending()
            self._wake_rejoin(f"push seq gap ({conn.next_seq} -> {seq})")
        conn.next_seq = seq + 1
        self._push_tx.send_nowait((event, seq, msg.get("data")))

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

    def _set_state(self, state: str, candidate: Candidate | None, detail: str) -> None:
        if state == self.state and state != REJOINED:
            return
        self.state = state
        self._states.put(state, candidate, detail)
        self._state_event.set()

    async def _state_loop(self) -> None:
        while True:
            await self._state_event.wait()
            self._state_event = anyio.Event()
            await self._deliver_states()

    async def _deliver_states(self) -> None:
        for state, candidate, detail in self._states.take():
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
        cfg = self.config
        quick = Backoff(cfg.backoff_base, cfg.heartbeat_interval, busy_cap=cfg.backoff_cap)
        while True:
            conn = self._conn
            down = self._joined_once and (conn is None or not conn.alive)
            if not down:
                quick.reset()
            # After a pass in which a candidate timed out (alive, but too busy to finish our
            # handshake), spread over a connect timeout like the call path does: a thousand
            # members re-queuing every heartbeat interval is how a re-join storm collapses.
            busy = cfg.connect_timeout if self._pass_timed_out else 0.0
            with anyio.move_on_after(quick.next_delay(busy) if down else cfg.heartbeat_interval):
                await self._beat_now.wait()
            self._beat_now = anyio.Event()
            # Heartbeats keep a member alive and bring an idle member back; a client that never
            # joined (a command, a script) has nothing to keep alive and only calls.
            if self._ever_connected and self._joined_once:
                try:
                    await self.heartbeat()
                except Exception:
                    logger.opt(exception=True).error("{}: heartbeat failed", self._name)

    def _wake_rejoin(self, why: str) -> None:
        self._rejoin_reason = why
        self._rejoin_event.set()

    async def _rejoin_loop(self) -> None:
        while True:
            await self._rejoin_event.wait()
            self._rejoin_event = anyio.Event()
            try:
                await self._rejoin(self._rejoin_reason, self._asks if self.rejoin_pending else None)
            except Exception:
                logger.opt(exception=True).error("{}: re-join failed", self._name)

    async def _latest_loop(self) -> None:
        while True:
            await self._latest.wait()
            if not self.connected:
                # Values keep replacing each other meanwhile: the newest is sent after.
                await self._failover(_Budget(None))
            taken = self._latest.take()
            if taken is None:
                continue
            key, (op, args) = taken
            try:
                await self.call(op, args)
            except ClientClosed:
                return
            except wire.RemoteError as exc:
                logger.warning("{}: {} for {!r} refused ({}); value dropped",
                               self._name, op, key, exc)
            except Exception:
                logger.opt(exception=True).error("{}: sending {} for {!r} failed",
                                                 self._name, op, key)

from xcecore.syncclient import SyncClient  # noqa: E402  (re-export; it imports us lazily)
