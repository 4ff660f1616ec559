"""Between threads and the event loop: the one bridge, the one wake-up, the one stop signal.

Roles run an event loop (the client, the role's main) and threads (monitors, blocking work).
Work crosses between them here and nowhere else:

- :class:`LoopBridge` hands a function to the loop from any thread: :meth:`~LoopBridge.post`
  (fire and forget, never blocks) or :meth:`~LoopBridge.call` (waits for the result).
- :class:`Wakeup` is a flag a task waits on and that re-arms itself (the "replace the
  ``anyio.Event``" idiom, written once); set it from the loop, or from a thread through a bridge.
- :class:`StopEvent` is a role's stop signal: a ``threading.Event`` for threads that also
  wakes tasks awaiting :meth:`~StopEvent.wait_async`, so nothing polls for it.
- :class:`Inbox` carries items from the loop to one thread, in order, without blocking the loop.

Importing this module imports no anyio (role plugins import it at every ``xce`` command);
anyio loads when a bridge, wake-up or stop event is made.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import anyio

T = TypeVar("T")


def _event() -> anyio.Event:
    import anyio

    return anyio.Event()


class LoopBridge:
    """Runs functions on one event loop on behalf of other threads.

    :meth:`bind` it on the loop (the runtime does, before the role starts). Called on the loop
    thread itself, :meth:`post` and :meth:`call` run the function at once.
    """

    def __init__(self) -> None:
        self._thread: int | None = None
        self._token: Any = None
        self._post: Callable[[Callable[[], object]], object] | None = None

    def bind(self) -> None:
        """Attach to the running loop (call it on the loop)."""
        from anyio import lowlevel

        self._thread = threading.get_ident()
        self._token = token = lowlevel.current_token()
        # One non-blocking hop on any backend (asyncio: ``call_soon_threadsafe``), and the
        # function runs knowing its async library: it may start tasks, set events, cancel.
        backend, native = token.backend_class, token.native_token
        self._post = lambda fn: backend.run_sync_soon(fn, (), native)

    def unbind(self) -> None:
        """Detach (the loop is closing): later posts are dropped, later calls raise."""
        self._post = None
        self._token = None
        self._thread = None

    @property
    def bound(self) -> bool:
        """True while attached to a running loop."""
        return self._post is not None

    @property
    def on_loop(self) -> bool:
        """True when the calling thread is the loop's own."""
        return self._thread == threading.get_ident()

    def post(self, fn: Callable[[], object]) -> bool:
        """Run ``fn()`` on the loop soon; never blocks. False if the loop is gone (dropped)."""
        if self.on_loop:
            fn()
            return True
        post = self._post
        if post is None:
            return False
        try:
            post(fn)
        except RuntimeError:  # the loop closed under us
            return False
        return True

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the loop and return its result (blocks this thread meanwhile).

        Raises ``RuntimeError`` when the bridge is not bound to a running loop.
        """
        if self.on_loop:
            return fn(*args)
        token = self._token
        if token is None:
            raise RuntimeError("the event loop this bridge served is not running")
        from anyio import from_thread

        return from_thread.run_sync(fn, *args, token=token)


class Wakeup:
    """A flag one task waits on: :meth:`set` wakes it, :meth:`wait` returns and re-arms.

    Sets between two waits coalesce into one wake-up. Without a ``bridge``, :meth:`set` must
    be called on the loop; with one it may be called from any thread.
    """

    def __init__(self, bridge: LoopBridge | None = None) -> None:
        self._event = _event()
        self._bridge = bridge

    def set(self) -> None:
        """Wake the waiter (now, or when it next waits)."""
        if self._bridge is not None and not self._bridge.on_loop:
            self._bridge.post(self._set)
        else:
            self._set()

    def _set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        """True if a wake-up is pending."""
        return self._event.is_set()

    async def wait(self) -> None:
        """Wait until set, then re-arm for the next wake-up."""
        await self._event.wait()
        self._event = _event()


class StopEvent(threading.Event):
    """A role's stop signal: threads use it as a ``threading.Event``; tasks await it.

    :meth:`set` from any thread also wakes every task in :meth:`wait_async` (through the
    role's bridge when called off the loop).
    """

    def __init__(self, bridge: LoopBridge | None = None) -> None:
        super().__init__()
        self._bridge = bridge or LoopBridge()
        self._async = _event()
        self._callbacks: list[Callable[[], object]] = []
        self._callbacks_lock = threading.Lock()

    def set(self) -> None:
        """Signal stop to threads and tasks alike (and run the :meth:`add_callback` ones)."""
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        if self._bridge.on_loop:
            self._async.set()
        else:
            self._bridge.post(self._async.set)

    def add_callback(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` once, in the thread that calls :meth:`set` (at once, here, if it was
        set already): what a thread blocked on something else needs to be woken, without
        polling the event. ``fn`` must not block."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(fn)
                return
        fn()

    async def wait_async(self) -> None:
        """Return once :meth:`set` was called (at once if it was already)."""
        if not self.is_set():
            await self._async.wait()


class Inbox(Generic[T]):
    """A FIFO from the event loop to one thread: :meth:`put` never blocks the loop."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[T] = queue.SimpleQueue()

    def put(self, item: T) -> None:
        """Append ``item`` (any thread; never blocks)."""
        self._q.put(item)

    def get(self, timeout: float) -> T | None:
        """The next item, or None after ``timeout`` seconds."""
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def __len__(self) -> int:
        return self._q.qsize()
