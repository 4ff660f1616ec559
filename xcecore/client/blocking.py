"""The blocking facade of :class:`xcecore.client.Client`, for threads.

A :class:`SyncClient` forwards each call to the client's event loop through an anyio blocking
portal and waits for the answer, so any number of threads may share one connection. Either it
owns its loop (``with SyncClient.open(config, role=...) as c:``, which starts a loop thread)
or it wraps a client that runs on an existing loop (``SyncClient(client, portal)``).

It must never be used on the client's own event-loop thread (that would block the loop it
waits on); such a call raises :class:`xcecore.client.HookContractError`.

(The one-shot commands use :class:`xcecore.client.OneShotClient` instead: no event loop.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from xcecore.client.asyncclient import Client, ClientHooks
from xcecore.client.errors import ClientClosed

if TYPE_CHECKING:
    from xcecore.candidates import Candidate
    from xcecore.client.settings import ClientConfig

_STOP_POLL = 0.1  # how often a waiting thread looks at the stop event


class SyncClient:
    """Thread-safe blocking calls on a :class:`~xcecore.client.Client`."""

    def __init__(self, client: Client, portal: BlockingPortal, stop: threading.Event | None = None) -> None:
        self.client = client
        self.portal = portal
        self.stop = stop

    def _run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` (a coroutine function) on the loop and wait for it.

        With a ``stop`` event, a wait is abandoned (the call cancelled, ``ClientClosed``
        raised) once the event is set: a role that is stopping must not keep a thread waiting
        for a primary that may never come back, or its shutdown would hang.
        """
        self.client._check_sync_caller()
        if self.stop is None:
            return self.portal.call(fn)
        if self.stop.is_set():
            raise ClientClosed(f"{self.client.role}: stopping; call not sent")
        future = self.portal.start_task_soon(fn)
        while True:
            try:
                return future.result(timeout=_STOP_POLL)
            except FutureTimeout:
                if self.stop.is_set():
                    future.cancel()
                    raise ClientClosed(f"{self.client.role}: stopping; call abandoned") from None

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
