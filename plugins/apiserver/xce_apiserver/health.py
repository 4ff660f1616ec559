"""Whether the backend (the controller) is usable: the API server's circuit breaker.

A write that exhausts its retry budget marks the backend degraded for a TTL; while degraded,
every write fails fast (HTTP 503) without touching the connection. The state clears when the
TTL expires (the next write probes the backend again), when the core reports a successful
re-join (heartbeat recovery), or when a write succeeds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class BackendHealth:
    """Degraded/healthy state, safe to use from many tasks and threads at once.

    ``clock`` is injectable (monotonic seconds) so tests can expire a TTL without sleeping.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: float | None = None
        self._reason = ""

    def is_degraded(self) -> bool:
        """True while a degradation mark is set and its TTL has not expired."""
        with self._lock:
            if self._until is None:
                return False
            if self._clock() >= self._until:
                # TTL expiry: let the next call probe the backend (half-open breaker).
                self._until, self._reason = None, ""
                return False
            return True

    def mark_degraded(self, ttl: float, reason: str = "") -> None:
        """Mark the backend degraded for ``ttl`` seconds (extends, never shortens, a mark)."""
        if ttl <= 0:
            return
        with self._lock:
            until = self._clock() + ttl
            if self._until is None or until > self._until:
                self._until = until
            self._reason = reason or self._reason

    def mark_healthy(self) -> None:
        """Clear any degradation mark at once."""
        with self._lock:
            self._until, self._reason = None, ""

    def retry_after(self) -> float:
        """Seconds left of the current mark (0 when healthy)."""
        with self._lock:
            if self._until is None:
                return 0.0
            return max(0.0, self._until - self._clock())

    @property
    def reason(self) -> str:
        """Why the backend was marked degraded ("" when healthy)."""
        with self._lock:
            return self._reason
