"""Job-array index expressions, and the compact set of indexes an array still has pending.

An array is submitted as LSF spells it, ``-J "name[1-1000:2,2001]%50"``, or as Slurm does,
``--array=1-1000:2%50``: a comma-separated list of items, each ``N`` or ``FIRST-LAST`` with an
optional ``:STEP``, then an optional ``%LIMIT`` (at most that many elements run at once).

- :func:`parse_array` -- the index text (Slurm's form) to :class:`ArraySpec`;
- :func:`split_name` -- LSF's ``name[...]%L`` job name into the name and the index text;
- :class:`Ranges` -- the indexes as a list of ``[first, last, step]`` runs (JSON as it is),
  so 100,000 pending indexes cost a few dozen bytes; taking the lowest, removing one and
  counting them cost what the runs cost, not what the indexes cost.

Pure functions, nothing imported but the standard library: the CLI and the controller share
them (the controller parses again: every client may be hostile).
"""

from __future__ import annotations

import itertools
import re
from typing import Final, NamedTuple

INDEX_MAX: Final = 2**31 - 1
"""The highest array index (LSF's own limit is lower; a 32-bit signed int is enough)."""
ELEMENTS_MAX: Final = 1_000_000
"""The most elements one array may have."""
ITEMS_MAX: Final = 1000
"""The most comma-separated items in one index expression."""
TEXT_MAX: Final = 4096

_ITEM: Final = re.compile(r"(\d{1,10})(?:-(\d{1,10})(?::(\d{1,10}))?)?\Z")
_NAMED: Final = re.compile(r"(.*)\[([^\[\]]*)\](?:%(\d{1,10}))?\Z", re.DOTALL)


class ArrayError(ValueError):
    """An index expression is malformed; the message says where and why."""


Run = list[int]  # [first, last, step], first <= last, (last - first) % step == 0


class ArraySpec(NamedTuple):
    """A parsed array: its canonical text, its index runs, its element count, its limit."""

    text: str  # the index expression, without the limit
    runs: list[Run]
    size: int
    limit: int | None


def parse_array(text: str) -> ArraySpec:
    """``"1-1000:2,2001%50"`` -> its runs (sorted, overlaps refused), size and limit."""
    if not isinstance(text, str) or not text.strip():
        raise ArrayError("array: empty index expression (e.g. 1-100 or 1-1000:2%50)")
    if len(text) > TEXT_MAX:
        raise ArrayError(f"array: index expression longer than {TEXT_MAX} characters")
    body, pct, lim_text = text.strip().partition("%")
    limit: int | None = None
    if pct:
        if not lim_text.isdigit() or len(lim_text) > 10 or int(lim_text) < 1:
            raise ArrayError(f"array {text!r}: the limit after % must be an integer >= 1")
        limit = int(lim_text)
    items = body.split(",")
    if len(items) > ITEMS_MAX:
        raise ArrayError(f"array {text!r}: more than {ITEMS_MAX} items")
    runs: list[Run] = []
    for item in items:
        m = _ITEM.match(item.strip())
        if m is None:
            raise ArrayError(f"array {text!r}: item {item.strip()!r:.40} is not N, FIRST-LAST "
                             "or FIRST-LAST:STEP")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if first < 0 or last > INDEX_MAX:
            raise ArrayError(f"array {text!r}: indexes go from 0 to {INDEX_MAX}")
        if last < first:
            raise ArrayError(f"array {text!r}: item {item.strip()!r} ends before it starts")
        if step < 1:
            raise ArrayError(f"array {text!r}: item {item.strip()!r} has a step below 1")
        last -= (last - first) % step
        runs.append([first, last, step] if first != last else [first, first, 1])
    runs.sort()
    for prev, run in itertools.pairwise(runs):
        if run[0] <= prev[1]:  # interleaved steps (1-9:2,2-10:2) are refused too: keep it plain
            raise ArrayError(f"array {text!r}: items {_show(prev)} and {_show(run)} overlap")
    size = sum(count(run) for run in runs)
    if size > ELEMENTS_MAX:
        raise ArrayError(f"array {text!r}: {size:,} elements, more than {ELEMENTS_MAX:,}")
    return ArraySpec(body.strip(), runs, size, limit)


def _show(run: Run) -> str:
    first, last, step = run
    return str(first) if first == last else f"{first}-{last}" + (f":{step}" if step != 1 else "")


def count(run: Run) -> int:
    """Indexes in one run."""
    return (run[1] - run[0]) // run[2] + 1


def split_name(name: str) -> tuple[str, ArraySpec | None]:
    """LSF's ``-J`` value: ``"sim[1-10]%2"`` -> ``("sim", spec)``; a plain name -> (name, None)."""
    m = _NAMED.match(name)
    if m is None:
        if "[" in name or "]" in name:
            raise ArrayError(f"-J {name!r}: an array name is NAME[INDEXES] or NAME[INDEXES]%LIMIT")
        return name, None
    base, body, limit = m.group(1), m.group(2), m.group(3)
    return base, parse_array(body + (f"%{limit}" if limit is not None else ""))


def describe(spec: ArraySpec) -> str:
    """The canonical text, ``1-1000:2%50``."""
    return spec.text + (f"%{spec.limit}" if spec.limit is not None else "")


class Ranges:
    """Pending indexes as sorted, disjoint ``[first, last, step]`` runs (mutated in place;
    the list is what a record holds)."""

    __slots__ = ("runs",)

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs

    def __len__(self) -> int:
        return sum(count(r) for r in self.runs)

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        return any(r[0] <= index <= r[1] and (index - r[0]) % r[2] == 0 for r in self.runs)

    def lowest(self) -> int | None:
        return self.runs[0][0] if self.runs else None

    def take(self) -> int:
        """Remove and return the lowest index (IndexError when there is none)."""
        run = self.runs[0]
        first = run[0]
        if first >= run[1]:
            del self.runs[0]
        else:
            run[0] = first + run[2]
            if run[0] == run[1]:
                run[2] = 1  # one index left: the canonical single run
        return first

    def remove(self, index: int) -> bool:
        """Remove ``index``; False if it is not pending. A run split in two stays two runs."""
        for i, r in enumerate(self.runs):
            if r[0] <= index <= r[1] and (index - r[0]) % r[2] == 0:
                first, last, step = r
                parts = [p for p in ([first, index - step, step], [index + step, last, step])
                         if p[0] <= p[1]]
                self.runs[i:i + 1] = [p if p[0] != p[1] else [p[0], p[0], 1] for p in parts]
                return True
        return False

    def clear(self) -> int:
        """Remove every index; how many there were."""
        n = len(self)
        self.runs.clear()
        return n
