"""A sorted set of integers (job ids) in blocks of machine words: the controller's index type.

Every job index (per state, user, queue, host, name, and all jobs) is one :class:`IdSet`.
Job ids only grow, so nearly every insertion is an append to the last block; a job that
changes state moves between two sets with an insertion in the middle, which costs a
binary search over the block maxima and one over a block of at most ``2 * BLOCK`` words.
Iteration from any id (a page's cursor) starts with the same two searches, so a page of a
million-entry index costs what the page costs.

Why not ``sortedcontainers.SortedList``: its blocks are Python lists of int objects (8 bytes
of pointer plus, for ids the table does not otherwise keep, a 28-byte int each), and it is
untyped. Here a block is an ``array('q')``: 8 bytes per entry, nothing else kept alive.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator

BLOCK = 1024
"""Entries per block after a split (a block holds at most twice that)."""


class IdSet:
    """A set of ints, iterated in ascending order, from any starting value."""

    __slots__ = ("_blocks", "_len", "_maxes")

    def __init__(self, ordered: Iterable[int] = ()) -> None:
        """``ordered`` must be strictly ascending (a load's ids, in key order)."""
        a = array("q", ordered)
        for i in range(1, len(a)):
            if a[i] <= a[i - 1]:
                raise ValueError(f"IdSet(ordered): {a[i]} after {a[i - 1]} is not ascending")
        self._fill(a)

    @classmethod
    def of_ascending(cls, ordered: list[int]) -> IdSet:
        """An IdSet of ``ordered``, which the caller guarantees strictly ascending (a load
        builds its indexes from ids in key order: no check). Block by block: one array of a
        million ids is one call that holds the GIL (a loop stall while a thread loads)."""
        s = cls.__new__(cls)
        s._blocks = [array("q", ordered[i:i + BLOCK]) for i in range(0, len(ordered), BLOCK)]
        s._maxes = [b[-1] for b in s._blocks]
        s._len = len(ordered)
        return s

    def _fill(self, a: array[int]) -> None:
        n = len(a)
        if n <= BLOCK:
            self._blocks = [a] if n else []
        else:
            self._blocks = [a[i:i + BLOCK] for i in range(0, n, BLOCK)]
        self._maxes = [b[-1] for b in self._blocks]
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        i = bisect_left(self._maxes, x)
        if i == len(self._maxes):
            return False
        block = self._blocks[i]
        pos = bisect_left(block, x)
        return pos < len(block) and block[pos] == x

    def add(self, x: int) -> None:
        """Add ``x`` (nothing if present)."""
        maxes = self._maxes
        if not maxes or x > maxes[-1]:  # the common case: a new, highest id
            if not maxes or len(self._blocks[-1]) >= BLOCK:
                self._blocks.append(array("q", (x,)))
                maxes.append(x)
            else:
                self._blocks[-1].append(x)
                maxes[-1] = x
            self._len += 1
            return
        i = bisect_left(maxes, x)
        block = self._blocks[i]
        pos = bisect_left(block, x)
        if block[pos] == x:  # maxes[i] >= x, so pos is inside the block
            return
        block.insert(pos, x)
        self._len += 1
        if len(block) > 2 * BLOCK:
            half = len(block) // 2
            self._blocks.insert(i + 1, block[half:])
            del block[half:]
            maxes.insert(i, block[-1])

    def discard(self, x: int) -> None:
        """Remove ``x`` if present."""
        maxes = self._maxes
        i = bisect_left(maxes, x)
        if i == len(maxes):
            return
        block = self._blocks[i]
        pos = bisect_left(block, x)
        if block[pos] != x:
            return
        del block[pos]
        self._len -= 1
        if not block:
            del self._blocks[i]
            del maxes[i]
        elif pos == len(block):
            maxes[i] = block[-1]

    def first(self) -> int | None:
        """The smallest entry, or None."""
        return self._blocks[0][0] if self._blocks else None

    def last(self) -> int | None:
        """The largest entry, or None."""
        return self._maxes[-1] if self._maxes else None

    def iter_from(self, start: int) -> Iterator[int]:
        """Entries >= ``start``, ascending. Safe against changes between two ``next``
        calls only in the sense that it never fails; a caller that changes the set while
        iterating (none does) must start again from its own cursor."""
        maxes = self._maxes
        i = bisect_left(maxes, start)
        if i == len(maxes):
            return
        blocks = self._blocks
        block = blocks[i]
        yield from block[bisect_left(block, start):]
        for j in range(i + 1, len(blocks)):
            yield from blocks[j]

    def count_below(self, x: int) -> int:
        """How many entries are < ``x`` (for tests and statistics; O(blocks))."""
        i = bisect_left(self._maxes, x)
        n = sum(len(self._blocks[j]) for j in range(i))
        if i < len(self._blocks):
            n += bisect_left(self._blocks[i], x)
        return n

    def __iter__(self) -> Iterator[int]:
        for block in self._blocks:
            yield from block

    def nbytes(self) -> int:
        """Bytes held by the blocks (their words; the arrays' own headers are ~64 B each)."""
        return sum(b.buffer_info()[1] * b.itemsize for b in self._blocks)

    def __repr__(self) -> str:
        return f"IdSet(len={self._len}, blocks={len(self._blocks)})"

