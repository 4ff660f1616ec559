"""The failover lock: one reconnect at a time, and a lock that knows who holds it.

Every call that finds the link dead goes through :meth:`FailoverLock.hold`; the first one
reconnects, the others wait and then use its link. The holder also runs ``xce_reconnected``;
a client call made from inside that hook would wait on the lock its own task holds, so the
lock refuses it with :class:`~xcecore.client.errors.HookContractError` instead. That check
(:meth:`check_reentry`) lives here and only here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio

from xcecore.client.errors import HookContractError


class FailoverLock:
    """A non-reentrant anyio lock that records its holder's task and refuses its re-entry."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = anyio.Lock()
        self.owner: int | None = None
        """The id of the task holding the lock (None: free)."""

    def locked(self) -> bool:
        """True while a (re)connect holds the lock."""
        return self._lock.locked()

    def check_reentry(self, what: str) -> None:
        """Raise :class:`HookContractError` if the current task holds the lock (``what``: the
        call it attempted, for the message)."""
        owner = self.owner
        if owner is not None and owner == anyio.get_current_task().id:
            raise HookContractError(
                f"{self.name}: {what} called from inside an xce_reconnected implementation, "
                "which runs while the failover lock is held; it would wait on that lock "
                "forever. The xce_reconnected contract: only record that a rejoin is needed "
                "(client.mark_rejoin_pending()) and return; the client re-joins after the next "
                "rejoin-point call."
            )

    @asynccontextmanager
    async def hold(self, what: str) -> AsyncIterator[None]:
        """Hold the lock (waiting for it); ``what`` names the caller if it is a re-entry."""
        self.check_reentry(what)
        async with self._lock:
            self.owner = anyio.get_current_task().id
            try:
                yield
            finally:
                self.owner = None

    @contextmanager
    def try_hold(self) -> Iterator[bool]:
        """Hold the lock if it is free, without waiting: yields whether it was taken."""
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            yield False
            return
        self.owner = anyio.get_current_task().id
        try:
            yield True
        finally:
            self.owner = None
            self._lock.release()
