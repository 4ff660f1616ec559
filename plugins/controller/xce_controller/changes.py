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

import secrets
from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from xce_controller.state import Event

KINDS: Final = ("jobs", "hosts", "queues", "resvals", "pend_reasons", "jusage", "members",
                "revocations")
"""Kinds a ring holds: the durable ones (in :class:`ChangeRing`s of revs) and the volatile
ones (in a :class:`VolatileLog`'s ring of its own sequence numbers)."""
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
        cap, n, revs = self.capacity, self._n, self._revs
        if n:  # (the newest entry's rev read here, not through ``last``: once per write)
            newest = revs[(self._start + n - 1) % cap]
            if rev < newest:
                raise ValueError(f"change rev {rev} is older than the last one ({newest})")
        if n == cap:  # full: the oldest gives way
            old = self._start
            self.floor = max(self.floor, revs[old])
            self._keys[old] = None
            self._start = (old + 1) % cap
            self._n -= 1
        i = (self._start + self._n) % cap
        revs[i] = rev
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


_VOLATILE_EVENTS: Final = {"resvals": "resvals", "jusage": "jusage", "member": "members"}
_VOLATILE_KEY: Final = {"resvals": "host", "jusage": "jobid", "member": "identity"}


class VolatileLog:
    """Which volatile records (resource values, pend reasons, job usage, members) changed,
    in the order of this primary's pushes: a re-join's delta sends only those.

    Volatile values have no revs and live in the primary's memory only, so their position is
    this log's own sequence number within its ``epoch`` (random, one per primary term): a
    ``since`` of another epoch (another primary, or this one before a restart) or older than
    the ring gets every volatile value whole. The ring holds keys, not values: the sync sends
    their current values (or removes the keys whose value is gone).
    """

    __slots__ = ("epoch", "ring", "seq")

    def __init__(self, capacity: int) -> None:
        self.epoch = secrets.token_hex(8)
        self.seq = 0
        self.ring = ChangeRing(capacity)

    def note(self, events: Iterable[Event]) -> None:
        """Record the volatile keys ``events`` (about to be encoded and pushed) change, and
        give each such push the seq of its last change (``vseq``: a member's position)."""
        ring = self.ring
        for ev in events:
            name, data = ev.name, ev.data
            if not isinstance(data, dict):
                continue
            if name == "pend_reasons":
                reasons = data.get("reasons")
                if isinstance(reasons, dict):
                    for text in reasons:
                        self.seq += 1
                        ring.append(self.seq, "pend_reasons", int(text))
                    data["vseq"] = self.seq
            elif name in _VOLATILE_EVENTS:
                self.seq += 1
                ring.append(self.seq, _VOLATILE_EVENTS[name], data.get(_VOLATILE_KEY[name]))
                data["vseq"] = self.seq

    def resumable(self, since: Mapping[str, Any] | None) -> int | None:
        """The seq a member's ``since["volatile"]`` resumes after, or None (send them whole)."""
        vol = since.get("volatile") if since is not None else None
        if not isinstance(vol, Mapping) or vol.get("epoch") != self.epoch:
            return None
        seq = vol.get("seq")
        if type(seq) is not int or not self.ring.covers(seq) or seq > self.seq:
            return None
        return seq

    def wire(self, mode: str) -> dict[str, Any]:
        """The ``volatile`` field of ``sync_begin``: where the member stands once it ends."""
        return {"epoch": self.epoch, "seq": self.seq, "mode": mode}
