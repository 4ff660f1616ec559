"""Timed actions of the process manager (run limits, kill escalations) on one thread.

A job's run limit and the SIGKILL that follows a SIGTERM after ``kill_grace`` are entries in
one heap served by one thread, rather than a sleeping thread per job: the cost of a timer is
a heap push, whatever the number of jobs.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

from loguru import logger


class Deadlines:
    """``at(key, when, fn)`` runs ``fn()`` at monotonic time ``when`` unless cancelled."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, tuple[int, Callable[[], None]]] = {}
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def at(self, key: str, when: float, fn: Callable[[], None]) -> None:
        """Schedule ``fn`` under ``key`` (replacing what ``key`` had)."""
        with self._cond:
            seq = next(self._seq)
            self._live[key] = (seq, fn)
            heapq.heappush(self._heap, (when, seq, key))
            self._cond.notify()

    def after(self, key: str, delay: float, fn: Callable[[], None]) -> None:
        """Schedule ``fn`` ``delay`` seconds from now."""
        self.at(key, time.monotonic() + delay, fn)

    def cancel(self, key: str) -> None:
        """Drop what ``key`` had scheduled (its heap entry is skipped when it comes up)."""
        with self._cond:
            self._live.pop(key, None)

    def pending(self, key: str) -> bool:
        """True if ``key`` has something scheduled."""
        with self._cond:
            return key in self._live

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._live.get(self._heap[0][2], (None,))[0] != \
                            self._heap[0][1]:
                        heapq.heappop(self._heap)  # cancelled or replaced
                    if not self._heap:
                        self._cond.wait()
                        continue
                    when = self._heap[0][0]
                    now = time.monotonic()
                    if when <= now:
                        _, _, key = heapq.heappop(self._heap)
                        _, fn = self._live.pop(key)
                        break
                    self._cond.wait(when - now)
            try:
                fn()
            except Exception:
                logger.opt(exception=True).error("deadline {} failed; going on", key)
