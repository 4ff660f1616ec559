"""A mailbox that keeps only the newest value per key, posted from any thread.

Monitors on their own threads post what they measured; one task on the client's event loop
sends it. While the controller is unreachable the values keep coming and replace each other,
so a reconnect sends the newest value once, never a backlog of stale ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
from anyio import from_thread, lowlevel


class LatestBox:
    """Newest ``item`` per key; :meth:`post` from any thread, :meth:`wait`/:meth:`take` on the loop."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._event = anyio.Event()
        self._wake: Callable[[], None] | None = None

    def bind(self) -> None:
        """Attach to the running event loop (call on it): posts from threads wake :meth:`wait`."""
        loop_thread = threading.get_ident()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend: a short blocking hop through anyio
            token = lowlevel.current_token()

            def hop() -> None:
                if threading.get_ident() == loop_thread:
                    self._event.set()
                else:
                    from_thread.run_sync(self._event.set, token=token)

            self._wake = hop
        else:

            def wake() -> None:
                # RuntimeError: the loop closed under us; its client is gone anyway.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._event.set)

            self._wake = wake
        if self._items:  # posted before the loop ran
            self._event.set()

    def unbind(self) -> None:
        """Detach from the loop (it is closing); later posts are kept but wake nobody."""
        self._wake = None

    def post(self, key: str, item: Any) -> None:
        """Replace ``key``'s pending item; thread-safe and never blocks."""
        with self._lock:
            self._items[key] = item
        wake = self._wake
        if wake is not None:
            wake()

    async def wait(self) -> None:
        """Return once an item is pending."""
        while not self._items:
            await self._event.wait()
            self._event = anyio.Event()

    def take(self) -> tuple[str, Any] | None:
        """The oldest key still pending and its newest item, or None."""
        with self._lock:
            if not self._items:
                return None
            key = next(iter(self._items))
            return key, self._items.pop(key)
