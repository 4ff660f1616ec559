"""Which cores and GPUs a job is bound to: distinct within a job, least used first.

A job with N slots on a host gets N distinct cores, those held by the fewest running jobs
first (so concurrent jobs get distinct cores while there are enough, and share the least
loaded ones when there are not); a job asking ``rusage[ngpus=N]`` gets N distinct GPUs the
same way. :func:`pick` is the pure choice; :class:`DevicePool` keeps who holds what.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping


def pick(items: Iterable[int], use: Mapping[int, int], n: int) -> list[int]:
    """``n`` distinct ``items`` (fewer if there are fewer), least used first, then lowest."""
    return sorted(sorted(set(items), key=lambda i: (use.get(i, 0), i))[:max(0, n)])


class DevicePool:
    """Devices (core or GPU numbers) held by job keys; thread-safe."""

    def __init__(self, items: Iterable[int]) -> None:
        self.items = sorted(set(items))
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, ...]] = {}
        self._use: dict[int, int] = {}

    def take(self, key: str, n: int) -> tuple[int, ...]:
        """Bind job ``key`` to ``n`` devices (:func:`pick`); its devices."""
        with self._lock:
            chosen = tuple(pick(self.items, self._use, n))
            self._hold(key, chosen)
            return chosen

    def hold(self, key: str, devices: Iterable[int]) -> None:
        """Record that job ``key`` holds ``devices`` (a job re-adopted after a restart)."""
        with self._lock:
            self._hold(key, tuple(d for d in devices if d in self.items))

    def _hold(self, key: str, devices: tuple[int, ...]) -> None:
        self._release(key)
        self._held[key] = devices
        for d in devices:
            self._use[d] = self._use.get(d, 0) + 1

    def give(self, key: str) -> None:
        """Job ``key`` ended: its devices are free again."""
        with self._lock:
            self._release(key)

    def _release(self, key: str) -> None:
        for d in self._held.pop(key, ()):
            left = self._use.get(d, 0) - 1
            if left > 0:
                self._use[d] = left
            else:
                self._use.pop(d, None)

    def held(self) -> dict[str, tuple[int, ...]]:
        """Job key -> its devices (a copy)."""
        with self._lock:
            return dict(self._held)
