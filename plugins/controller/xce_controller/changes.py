"""The retention window: the (rev, kind, key) of recent durable changes, in rev order.

A member that re-joins with ``since`` inside the window is sent only what changed after it
(docs/protocol.md, "Resuming"): the ring says which records changed (or were removed) after a
rev, and the sync sends their current versions. It holds no records, only which ones changed:
three parallel arrays (rev, kind, key), about 17 bytes an entry plus the key's object, in a
fixed capacity; the oldest entries give way to new ones.

:attr:`ChangeRing.floor` is the rev up to which changes may be missing: a ``since`` below it
cannot be served from the ring (the member gets a snapshot). Every primary seeds the ring
from the store's rev index when it loads, and a hot standby appends what it follows, so the
window survives restarts and failovers. A rollback truncates what was not committed.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

KINDS: Final = ("jobs", "hosts", "queues")
_CODE: Final = {k: i for i, k in enumerate(KINDS)}
REMOVED: Final = 0x80


class Change(NamedTuple):
    """One change: the record ``key`` of ``kind`` changed (or was removed) at ``rev``."""

    rev: int
    kind: str
    key: Any
    removed: bool


class ChangeRing:
    """The last ``capacity`` changes."""

    __slots__ = ("_keys", "_kinds", "_n", "_revs", "_start", "capacity", "floor")

    def __init__(self, capacity: int, floor: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"ChangeRing capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._revs = array("q", bytes(8 * capacity))
        self._kinds = bytearray(capacity)
        self._keys: list[Any] = [None] * capacity
        self._start = 0  # physical index of the oldest entry
        self._n = 0
        self.floor = floor  # changes at or below this rev may be missing

    def __len__(self) -> int:
        return self._n

    @property
    def last(self) -> int:
        """The rev of the newest entry (the floor when empty)."""
        if not self._n:
            return self.floor
        return self._revs[(self._start + self._n - 1) % self.capacity]

    def covers(self, since: int) -> bool:
        """Whether every change after ``since`` is here."""
        return since >= self.floor

    def append(self, rev: int, kind: str, key: Any, removed: bool = False) -> None:
        """Record a change; revs must not decrease."""
        cap = self.capacity
        if self._n and rev < self.last:
            raise ValueError(f"change rev {rev} is older than the last one ({self.last})")
        if self._n == cap:  # full: the oldest gives way
            old = self._start
            self.floor = max(self.floor, self._revs[old])
            self._keys[old] = None
            self._start = (old + 1) % cap
            self._n -= 1
        i = (self._start + self._n) % cap
        self._revs[i] = rev
        self._kinds[i] = _CODE[kind] | (REMOVED if removed else 0)
        self._keys[i] = key
        self._n += 1

    def extend(self, changes: Iterable[Change]) -> None:
        for c in changes:
            self.append(c.rev, c.kind, c.key, c.removed)

    def _at(self, logical: int) -> Change:
        i = (self._start + logical) % self.capacity
        code = self._kinds[i]
        return Change(self._revs[i], KINDS[code & 0x7F], self._keys[i], bool(code & REMOVED))

    def _first_after(self, rev: int) -> int:
        """The logical index of the first entry with a rev > ``rev``."""
        lo, hi = 0, self._n
        revs, start, cap = self._revs, self._start, self.capacity
        while lo < hi:
            mid = (lo + hi) // 2
            if revs[(start + mid) % cap] <= rev:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def after(self, rev: int, most: int, upto: int | None = None) -> list[Change]:
        """At most ``most`` changes with ``rev`` < change rev (<= ``upto``), oldest first."""
        out: list[Change] = []
        i = self._first_after(rev)
        while i < self._n and len(out) < most:
            c = self._at(i)
            if upto is not None and c.rev > upto:
                break
            out.append(c)
            i += 1
        return out

    def truncate(self, rev: int) -> int:
        """Forget the changes after ``rev`` (a rollback); returns how many."""
        keep = self._first_after(rev)
        gone = self._n - keep
        for j in range(keep, self._n):
            self._keys[(self._start + j) % self.capacity] = None
        self._n = keep
        return gone

    def nbytes(self) -> int:
        """Bytes of the arrays (keys' objects not counted)."""
        return 8 * self.capacity + self.capacity + 8 * self.capacity
