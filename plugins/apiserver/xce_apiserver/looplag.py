"""How long the API server's event loop was kept from running a ready task: its stall.

A ticker task asks to wake every :data:`TICK` seconds; how late it wakes is how long the loop
was busy with something else (a page of jobs being encoded, a push being applied, a
collection). Every lateness goes into a histogram (``xce_apiserver_loop_lag_seconds``: a
client diffs two scrapes to see a window's worst bucket), and the worst of the last
:data:`WINDOW` to :data:`WINDOW` x 2 seconds is a gauge. One wake-up costs a few
microseconds: about 1 % of a core at the default tick.
"""

from __future__ import annotations

import threading
import time

import anyio

from xcecore.metrics import Histogram

TICK = 0.002
"""Seconds between two wake-ups of the ticker."""

WINDOW = 10.0
"""Seconds of one window of the recent-worst gauge (the gauge covers the current and the
previous window)."""

LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
               0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds of lateness of one wake-up."""


class LoopLag:
    """The ticker's figures: the histogram and the recent worst (the loop writes, the
    exporter's thread reads, under one lock)."""

    def __init__(self, tick: float = TICK, window: float = WINDOW) -> None:
        self.tick, self.window = tick, window
        self.lock = threading.Lock()
        self.hist = Histogram(LAG_BUCKETS)
        self.worst_now = 0.0  # the current window's worst
        self.worst_before = 0.0  # the previous window's
        self._window_end = 0.0

    def observe(self, late: float, now: float) -> None:
        """One wake-up ``late`` seconds after it was due, at monotonic time ``now``."""
        with self.lock:
            self.hist.observe(late)
            if now >= self._window_end:
                stale = now >= self._window_end + self.window  # a whole window with no tick
                self.worst_before = 0.0 if stale else self.worst_now
                self.worst_now = 0.0
                self._window_end = now + self.window
            if late > self.worst_now:
                self.worst_now = late

    def recent_worst(self) -> float:
        """The worst lateness of the last one to two windows, seconds."""
        with self.lock:
            return max(self.worst_now, self.worst_before)

    async def run(self) -> None:
        """Tick until cancelled."""
        clock = time.perf_counter
        tick = self.tick
        while True:
            due = clock() + tick
            await anyio.sleep(tick)
            now = clock()
            self.observe(max(0.0, now - due), time.monotonic())
