"""The blocking facade of :class:`xcecore.client.Client`, for threads.

A :class:`SyncClient` hands each call to the client's event loop and waits for the answer, so
any number of threads may share one connection. Either it owns its loop (``with
SyncClient.open(config, role=...) as c:``, which starts a loop thread) or it wraps a client
that runs on an existing loop (``SyncClient(client, portal)``).

The hand-off is one ``call_soon_threadsafe`` hop (the client's :class:`~xcecore.bridge.LoopBridge`)
that starts the call as a task of the client's task group, and one wait on a
``concurrent.futures.Future`` it settles: no portal round trip to start the task, no polling.
A role's stop (:class:`~xcecore.bridge.StopEvent`) abandons the waits at once through a callback.

It must never be used on the client's own event-loop thread (that would block the loop it
waits on); such a call raises :class:`xcecore.client.HookContractError`.

(The one-shot commands use :class:`xcecore.client.OneShotClient` instead: no event loop.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, InvalidStateError
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from xcecore.client.asyncclient import Client, ClientHooks
from xcecore.client.errors import ClientClosed

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from xcecore.bridge import StopEvent
    from xcecore.candidates import Candidate
    from xcecore.client.settings import ClientConfig


class _Handoff:
    """One blocking call in flight: the coroutine function, its future, its cancel scope.

    Everything but :meth:`abandon` runs on the loop; :meth:`abandon` (a role stopping) may come
    from any thread and settles the future at once, so the waiting thread never waits for the
    loop to notice.
    """

    __slots__ = ("abandoned", "fn", "future", "role", "scope")

    def __init__(self, fn: Callable[[], Awaitable[Any]], role: str) -> None:
        self.fn = fn
        self.role = role
        self.future: Future[Any] = Future()
        self.scope: anyio.CancelScope | None = None
        self.abandoned = False

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """Settle the future unless it is already (abandoned first: that answer stands)."""
        try:
            if error is None:
                self.future.set_result(result)
            else:
                self.future.set_exception(error)
        except InvalidStateError:
            pass

    def start(self, client: Client) -> None:
        """On the loop: start the call as a task of the client's task group."""
        tg = client._tg
        if tg is not None and not client._closed:
            try:
                tg.start_soon(self.run, name=f"{client._name} blocking call")
                return
            except RuntimeError:  # the task group is closing
                pass
        self.settle(error=ClientClosed(f"{self.role}: client is closed or not entered; "
                                       "call not sent"))

    async def run(self) -> None:
        """The task: await the call and settle the future with its outcome."""
        with anyio.CancelScope() as scope:
            self.scope = scope
            if self.abandoned:
                scope.cancel()
            try:
                result = await self.fn()
            except Exception as exc:
                self.settle(error=exc)
            except BaseException:  # the client closing cancels its tasks: let that through
                self.settle(error=ClientClosed(f"{self.role}: client closed; call abandoned"))
                raise
            else:
                self.settle(result)

    def abandon(self, client: Client) -> None:
        """Any thread: fail the wait now (the role stops) and cancel the call on the loop."""
        self.settle(error=ClientClosed(f"{self.role}: stopping; call abandoned"))
        client._bridge.post(self._cancel)

    def _cancel(self) -> None:
        self.abandoned = True
        if self.scope is not None:
            self.scope.cancel()


class SyncClient:
    """Thread-safe blocking calls on a :class:`~xcecore.client.Client`.

    ``stop`` (a role's :class:`~xcecore.bridge.StopEvent`): once it is set, calls are no
    longer sent and those waiting are abandoned (cancelled, :class:`ClientClosed` raised): a
    role that is stopping must not keep a thread waiting for a primary that may never come
    back, or its shutdown would hang.
    """

    def __init__(self, client: Client, portal: BlockingPortal, stop: StopEvent | None = None) -> None:
        self.client = client
        self.portal = portal
        self.stop = stop
        self._inflight: set[_Handoff] = set()
        self._inflight_lock = threading.Lock()
        if stop is not None:
            stop.add_callback(self._abandon_all)

    def _abandon_all(self) -> None:
        with self._inflight_lock:
            waiting, self._inflight = self._inflight, set()
        for call in waiting:
            call.abandon(self.client)

    def _run(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``fn()`` (a coroutine function) on the client's loop and wait for it."""
        client = self.client
        client._check_sync_caller()
        stop = self.stop
        call = _Handoff(fn, client.role)
        if stop is not None:
            with self._inflight_lock:
                if stop.is_set():
                    raise ClientClosed(f"{client.role}: stopping; call not sent")
                self._inflight.add(call)
        try:
            if not client._bridge.post(partial(call.start, client)):
                raise ClientClosed(f"{client.role}: the client's event loop is not running; "
                                   "call not sent")
            return call.future.result()
        finally:
            if stop is not None:
                with self._inflight_lock:
                    self._inflight.discard(call)

    @classmethod
    @contextmanager
    def open(
        cls,
        config: ClientConfig,
        *,
        role: str,
        hooks: ClientHooks | None = None,
        join_attrs: dict[str, Any] | None = None,
        rejoin_points: Iterable[str] = (),
        connect: bool = True,
        backend: str = "asyncio",
    ) -> Iterator[SyncClient]:
        """A client on its own event-loop thread; connected first unless ``connect=False``.

        Everything (loop thread, connection, background tasks) is closed on exit.
        """
        client = Client(config, role=role, hooks=hooks, join_attrs=join_attrs,
                        rejoin_points=rejoin_points)
        with start_blocking_portal(backend) as portal, portal.wrap_async_context_manager(client):
            sync = cls(client, portal)
            if connect:
                sync.connect()
            yield sync

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        deadline: float | None = None,
        retry_budget: int | None = None,
        rid: str | None = None,
    ) -> Any:
        """Blocking :meth:`Client.call <xcecore.client.Client.call>`; same errors."""
        return self._run(partial(self.client.call, op, args, deadline=deadline,
                                 retry_budget=retry_budget, rid=rid))

    def outcome(self, rid: str, *, deadline: float | None = None) -> dict[str, Any]:
        """Blocking :meth:`Client.outcome <xcecore.client.Client.outcome>`."""
        result: dict[str, Any] = self._run(partial(self.client.outcome, rid, deadline=deadline))
        return result

    def join(self, *, deadline: float | None = None, retry_budget: int | None = None) -> Any:
        """Blocking :meth:`Client.join <xcecore.client.Client.join>`."""
        return self._run(partial(self.client.join, deadline=deadline, retry_budget=retry_budget))

    def connect(
        self, *, deadline: float | None = None, retry_budget: int | None = None
    ) -> Candidate:
        """Blocking :meth:`Client.connect <xcecore.client.Client.connect>`."""
        result: Candidate = self._run(partial(self.client.connect, deadline=deadline, retry_budget=retry_budget))
        return result

    def heartbeat(self) -> bool:
        """Blocking :meth:`Client.heartbeat <xcecore.client.Client.heartbeat>`."""
        return bool(self._run(self.client.heartbeat))

    def post_latest(self, key: str, op: str, args: dict[str, Any]) -> None:
        """:meth:`Client.post_latest <xcecore.client.Client.post_latest>`; never blocks."""
        self.client.post_latest(key, op, args)

    def close(self) -> None:
        """Close the client (idempotent); an owned loop thread stops when ``open`` exits."""
        self.client._check_sync_caller()
        self.portal.call(self.client.aclose)
