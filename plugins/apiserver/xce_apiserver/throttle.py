"""Logon throttling: failed logons counted per user name and per client address.

After ``limit`` failures of one key (a user name, or a client address) within ``window``
seconds, further logons of that key are refused with 429 and ``Retry-After`` -- without
checking the password, so a guesser also stops costing PBKDF2 time -- until the oldest of
those failures leaves the window. A success clears the user's count (not the address's: one
address guessing many users stays throttled).

Bounded whatever a client does: at most ``limit`` failure times per key, at most ``max_keys``
keys (the least recently failed go first), and every call costs O(limit). No I/O, no clock of
its own (``now`` is passed in), thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque


class Throttle:
    """Failed-logon counts per key, with the refusals they cause (see the module doc)."""

    def __init__(self, limit: int, window: float, *, max_keys: int = 100_000) -> None:
        if limit < 1 or not window > 0 or max_keys < 1:
            raise ValueError("Throttle needs limit >= 1, window > 0 and max_keys >= 1")
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _live(self, key: str, now: float) -> deque[float] | None:
        times = self._fails.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._fails[key]
            return None
        return times

    def retry_after(self, keys: tuple[str, ...], now: float) -> float:
        """Seconds until a logon of ``keys`` (``user:NAME``, ``addr:IP``) may be tried
        again: 0 when none of them is throttled."""
        wait = 0.0
        with self._lock:
            for key in keys:
                times = self._live(key, now)
                if times is not None and len(times) >= self.limit:
                    wait = max(wait, times[0] + self.window - now)
        return wait

    def failed(self, keys: tuple[str, ...], now: float) -> None:
        """Count a failed logon against each of ``keys``."""
        with self._lock:
            for key in keys:
                times = self._live(key, now)
                if times is None:
                    times = self._fails[key] = deque(maxlen=self.limit)
                    while len(self._fails) > self.max_keys:
                        self._fails.popitem(last=False)
                else:
                    self._fails.move_to_end(key)
                times.append(now)

    def succeeded(self, key: str) -> None:
        """Clear ``key``'s count (a user who got the password right)."""
        with self._lock:
            self._fails.pop(key, None)
