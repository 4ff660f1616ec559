"""The primary's heartbeat, written by a thread while its event loop makes progress.

A standby fences a primary whose beats stop for ``hung_timeout`` (:mod:`xce_controller.
fencing`). The beats used to come from a timer on the event loop; in a join storm of 10,000
workers a loop *pass* (every callback that was ready when it began: thousands of handshakes,
replies and pushes) took over 2 s on a loaded 2-core machine, the timer waited behind it, and
the standbys fenced a primary that was serving as fast as it could; the next primary got the
same storm and was fenced in turn.

So the beat no longer proves that a timer fired: it proves that the loop did work. The loop
stamps :attr:`LoopBeat.last` (one clock read) whenever it serves something: a connection
accepted, a handshake message, a request, a writer's wake-up, and every ``interval`` from a
timer (an idle loop). A thread wakes every ``interval`` and, when the stamp moved since its
last look, beats, stamped with *that* moment, not its own clock: the record then says when the
loop last made progress, which keeps the standby's reasoning of :class:`fencing.HangWatch`
exact (a stall began at most one interval after the beat; a fence means the loop did nothing
for ``hung_timeout``).

What is still fenced, within ``hung_timeout`` + ``interval`` of the loop's last progress:

- a stopped or frozen process (the thread stops with it);
- a loop blocked in one call (a blocking system call, a ``time.sleep``, a long computation in a
  single callback): the stamp stops moving, the thread writes nothing;
- a deadlocked loop (waiting on a lock that is never released): likewise.

What is not: a loop that is busy but serving, however long its passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger


class LoopBeat:
    """The loop's progress stamp, and the thread that beats for an election while it moves."""

    def __init__(self, name: str = "") -> None:
        self.name = name  # the candidate, for the log
        self.last = time.monotonic()  # when the loop last served something (CLOCK_MONOTONIC)
        self.interval = 0.1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat: Callable[[float], None] = lambda at: None

    def progress(self) -> None:
        """The loop served something (called on the loop: one clock read, nothing else)."""
        self.last = time.monotonic()

    def start(self, election: Any, interval: float) -> None:
        """Beat for ``election`` every ``interval`` while the stamp moves (a daemon thread:
        it never holds the process up at exit)."""
        beat: Callable[..., None] = election.heartbeat
        self._beat = lambda at: beat(at=at)
        self.interval = interval
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="xce-primary-beat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (returns at once; the thread ends within one interval)."""
        self._stop.set()

    def _run(self) -> None:
        seen = None
        while not self._stop.wait(self.interval):
            last = self.last
            if last == seen:
                continue  # the loop did nothing since the last look: no beat (a hang, if it lasts)
            seen = last
            try:
                self._beat(last)
            except Exception as exc:  # a beat must never end the thread: say so, keep trying
                logger.error("controller {}: the heartbeat failed: {}; retrying in {:g} s",
                             self.name, exc, self.interval)
