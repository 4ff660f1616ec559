"""Keys filed by the time they become due: what the housekeeping timers take from.

The finished-job cleaner files a job under its end time, host expiry files a host under its
last heartbeat. A timer asks for what is due (:meth:`TimeBuckets.due`) and gets only the keys
of buckets wholly in the past, so a pass costs what is due, never a scan of every job or
host. Entries are not removed when their key changes (a requeued job, a host that beat
again: it is filed anew): the caller checks each key it gets against the real record, so a
stale entry is skipped once and dropped. A caller files a key again only when its bucket
changes (:meth:`TimeBuckets.bucket_of`), so stale entries stay bounded by the changes.

A bucket is ``width`` seconds long. :meth:`TimeBuckets.due` hands out the keys of every
bucket up to the one the limit falls in: the caller files again, under their time, the keys
of that last bucket that are not due yet (:meth:`TimeBuckets.refile`), so what is due is found
exactly, and a pass looks at no more than one bucket's worth of keys that are not due.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class TimeBuckets(Generic[K]):
    """Keys in buckets of ``width`` seconds, handed out oldest bucket first."""

    __slots__ = ("_buckets", "_heap", "width")

    def __init__(self, width: float) -> None:
        if not width > 0:
            raise ValueError(f"TimeBuckets width must be > 0, got {width!r}")
        self.width = width
        self._buckets: dict[int, list[K]] = {}
        self._heap: list[int] = []  # bucket numbers, each once

    def bucket_of(self, t: float) -> int:
        return math.floor(t / self.width)

    def file(self, key: K, t: float) -> None:
        """File ``key`` as due at time ``t`` (again: its older entry goes stale)."""
        b = self.bucket_of(t)
        keys = self._buckets.get(b)
        if keys is None:
            keys = self._buckets[b] = []
            heapq.heappush(self._heap, b)
        keys.append(key)

    def due(self, limit: float, most: int) -> list[K]:
        """At most ``most`` keys of the buckets up to ``limit``'s, oldest first; they are
        taken out (the caller checks each against its record, and calls :meth:`refile` for
        one that is not due after all)."""
        out: list[K] = []
        edge = self.bucket_of(limit)
        heap, buckets = self._heap, self._buckets
        while heap and heap[0] <= edge and len(out) < most:
            b = heap[0]
            keys = buckets[b]
            room = most - len(out)
            if len(keys) <= room:
                out.extend(keys)
                heapq.heappop(heap)
                del buckets[b]
            else:
                out.extend(keys[-room:])
                del keys[-room:]
        return out

    def refile(self, key: K, t: float, limit: float) -> None:
        """A key :meth:`due` handed out for ``limit`` is not due: its time is ``t``. It is
        filed again if its entry was taken out (else the one under ``t`` is still there)."""
        if self.bucket_of(t) <= self.bucket_of(limit):
            self.file(key, t)

    def __len__(self) -> int:
        """Entries filed (stale ones included)."""
        return sum(len(k) for k in self._buckets.values())

    def next_due(self) -> float | None:
        """When the oldest bucket is wholly past (a timer may sleep until then)."""
        return (self._heap[0] + 1) * self.width if self._heap else None
