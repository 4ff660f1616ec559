"""Which idempotency keys have a committed result: about 14 bytes of memory per key.

The results themselves stay in the store (written in the same transaction as the write they
belong to). In memory the primary keeps only a membership filter: a 64-bit hash of each
committed key and the second it was committed, in 4,096 partitions of sorted arrays. A
request whose key is not in the filter is new (the common case, answered at once); one whose
key is in it is looked up in the store, off the event loop, for its real result (a hash
collision finds nothing there and is applied as new). Keys expire after the store's TTL: a
timer sweeps a few partitions at a time, so no pass touches every key.

The hash is Python's ``hash`` of the key (random per process, which is fine: every process
builds its filter from the store).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable

PARTS = 4096
_MASK = PARTS - 1


class RidFilter:
    """A set of committed keys' hashes with their commit times, sweepable by partition."""

    __slots__ = ("_hashes", "_n", "_sweep_at", "_times", "ready")

    def __init__(self) -> None:
        self._hashes: list[array[int]] = [array("q") for _ in range(PARTS)]
        self._times: list[array[int]] = [array("I") for _ in range(PARTS)]
        self._n = 0
        self._sweep_at = 0  # the next partition a sweep looks at
        self.ready = True  # False while a new primary still loads it: every key may be known

    def __len__(self) -> int:
        return self._n

    def add(self, rid: str, ts: float) -> None:
        """Remember ``rid`` as committed at ``ts`` (seconds since the epoch)."""
        self.add_hash(hash(rid), ts)

    def add_hash(self, h: int, ts: float) -> None:
        p = h & _MASK
        hashes, times = self._hashes[p], self._times[p]
        i = bisect_left(hashes, h)
        t = max(0, int(ts))
        if i < len(hashes) and hashes[i] == h:
            times[i] = max(times[i], t)
            return
        hashes.insert(i, h)
        times.insert(i, t)
        self._n += 1

    def add_many(self, keys: Iterable[tuple[str, float]]) -> None:
        for rid, ts in keys:
            self.add_hash(hash(rid), ts)

    def merge(self, other: RidFilter) -> None:
        """Add every key of ``other`` (a few: what committed while this one loaded)."""
        for hashes, times in zip(other._hashes, other._times, strict=True):
            for h, t in zip(hashes, times, strict=True):
                self.add_hash(h, t)

    def may_contain(self, rid: str) -> bool:
        """True when ``rid`` may have a committed result (look it up); False: it has none."""
        if not self.ready:
            return True
        h = hash(rid)
        hashes = self._hashes[h & _MASK]
        i = bisect_left(hashes, h)
        return i < len(hashes) and hashes[i] == h

    def time_of(self, rid: str) -> float | None:
        """The second ``rid`` was remembered as committed at, or None when the filter does
        not know it (or is not ready): what a store that files keys by time looks it up by."""
        if not self.ready:
            return None
        h = hash(rid)
        p = h & _MASK
        hashes = self._hashes[p]
        i = bisect_left(hashes, h)
        return float(self._times[p][i]) if i < len(hashes) and hashes[i] == h else None

    def sweep(self, older_than: float, parts: int) -> int:
        """Forget keys committed before ``older_than`` in the next ``parts`` partitions (the
        sweep goes round); returns how many were forgotten."""
        cutoff = int(older_than)
        gone = 0
        for _ in range(min(parts, PARTS)):
            p = self._sweep_at
            self._sweep_at = (p + 1) % PARTS
            times = self._times[p]
            if not times or min(times) >= cutoff:
                continue
            hashes = self._hashes[p]
            keep = [i for i, t in enumerate(times) if t >= cutoff]
            self._hashes[p] = array("q", (hashes[i] for i in keep))
            self._times[p] = array("I", (times[i] for i in keep))
            gone += len(times) - len(keep)
        self._n -= gone
        return gone

    def nbytes(self) -> int:
        """Bytes the partitions' words take (the 8,192 arrays' headers add ~0.5 MB)."""
        return sum(a.buffer_info()[1] * a.itemsize for a in (*self._hashes, *self._times))
