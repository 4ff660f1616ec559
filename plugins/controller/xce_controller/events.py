"""Cluster events: what happened to the cluster (promotions, members, hosts, queues, admin
actions), recorded by the primary, kept for a window, paged by sequence.

Each event is a flat record ``{"seq", "time", "kind", ...fields, "text"}``: ``seq`` grows by
one per event across primaries (a new primary continues after the last stored one), ``time``
is epoch seconds and never goes back within the log (a clock step back is clamped), so the
log is ordered by both. ``text`` is one human line.

:class:`EventLog` is pure: the state's transitions record into it (``ClusterState.events``),
the server takes what is new (:meth:`EventLog.take_unsaved`) and stores it as rows of the
``events`` table, keyed by :func:`row_key` (the seq zero-padded, so key order is seq order in
every store). Expiry drops from the head (the oldest events), never scans: the log is a list
with a moving start, one per kind beside it, and every lookup is a bisection.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from xcecore.wire import ErrorCode, RemoteError

Event = dict[str, Any]
KINDS: Final = ("promotion", "member_join", "member_leave", "host_state", "queue_state",
                "reconfig", "shutdown")
"""Every kind of event (the ``events`` op's ``kind`` filter takes one of them)."""
PAGE_MAX: Final = 1000  # the most events one page holds (the op's hard cap)
PAGE_DEFAULT: Final = 100
EVENTS_MAX: Final = 100_000  # [controller] events_max default
EVENTS_RETENTION: Final = 7 * 86400.0  # [controller] events_retention default (seconds)
SEQ_DIGITS: Final = 20


def row_key(seq: int) -> str:
    """The store key of event ``seq`` (zero-padded: key order is seq order)."""
    return f"{seq:0{SEQ_DIGITS}d}"


def describe(ev: Event) -> str:
    """One human line for an event (its ``text``)."""
    k = str(ev["kind"])
    by = f" by {ev['by']}" if ev.get("by") else ""
    if k == "promotion":
        old = f" (was {ev['old_primary']})" if ev.get("old_primary") else ""
        ms = ev.get("takeover_ms")
        took = f" in {ms:.1f} ms" if isinstance(ms, int | float) else ""
        return f"{ev['primary']} promoted to primary{old}, {ev.get('how', '?')} standby{took}"
    if k in ("member_join", "member_leave"):
        verb = "joined" if k == "member_join" else "left"
        return f"{ev['role']} {ev['identity']} {verb} primary {ev.get('candidate', '?')}"
    if k == "host_state":
        why = f": {ev['comment']}" if ev.get("comment") else ""
        return f"host {ev['host']} {ev['state']}{by}{why}"
    if k == "queue_state":
        return f"queue {ev['queue']} {ev['state']}{by}"
    if k == "reconfig":
        added = ", ".join(ev.get("queues_added") or ()) or "none"
        return f"reconfigured{by}: queues added {added}"
    if k == "shutdown":
        return f"controller {ev.get('server', '?')} shut down{by}"
    return k


class _Run:
    """Events in seq order: a list whose head moves on as events expire (compacted now and
    then, so dropping the oldest costs O(1) amortized)."""

    __slots__ = ("items", "start")

    def __init__(self) -> None:
        self.items: list[Event] = []
        self.start = 0

    def __len__(self) -> int:
        return len(self.items) - self.start

    def head(self) -> Event | None:
        return self.items[self.start] if self.start < len(self.items) else None

    def drop_head(self) -> None:
        self.start += 1
        if self.start > 1024 and self.start * 2 > len(self.items):
            del self.items[:self.start]
            self.start = 0

    def index_after(self, seq: int) -> int:
        return bisect.bisect_right(self.items, seq, lo=self.start, key=_seq)

    def index_from_time(self, t: float) -> int:
        return bisect.bisect_left(self.items, t, lo=self.start, key=_time)


def _seq(ev: Event) -> int:
    return int(ev["seq"])


def _time(ev: Event) -> float:
    return float(ev["time"])


@dataclass(frozen=True, slots=True)
class Older:
    """Stored events indexed off the loop (:meth:`EventLog.build_older`)."""

    all: _Run
    kinds: dict[str, _Run]
    upto: int


@dataclass
class EventLog:
    """The primary's events in memory, oldest first (module docstring)."""

    retention: float = EVENTS_RETENTION
    cap: int = EVENTS_MAX
    seq: int = 0  # the last seq given (or loaded)
    last_time: float = 0.0
    candidate: str = ""  # the primary recording (member events name it)
    loaded: bool = True  # False while a new primary still reads its older events
    _all: _Run = field(default_factory=_Run)
    _kinds: dict[str, _Run] = field(default_factory=lambda: {k: _Run() for k in KINDS})
    _unsaved: list[Event] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._all)

    def record(self, kind: str, now: float, **fields: Any) -> Event:
        """Add an event of ``kind`` at ``now``; it is stored with the next write."""
        if kind not in self._kinds:
            raise ValueError(f"unknown event kind {kind!r}")
        self.seq += 1
        self.last_time = max(now, self.last_time)
        ev: Event = {"seq": self.seq, "time": self.last_time, "kind": kind,
                     **{k: v for k, v in fields.items() if v is not None}}
        ev["text"] = describe(ev)
        self._append(ev)
        self._unsaved.append(ev)
        return ev

    def _append(self, ev: Event) -> None:
        self._all.items.append(ev)
        self._kinds[ev["kind"]].items.append(ev)

    @property
    def pending(self) -> bool:
        """Whether events were recorded since the last :meth:`take_unsaved` (asked after
        every change: no allocation)."""
        return bool(self._unsaved)

    def take_unsaved(self) -> list[Event]:
        """The events recorded since the last call (for the store)."""
        out, self._unsaved = self._unsaved, []
        return out

    def continue_after(self, last: Event | None) -> None:
        """A new primary: continue after ``last``, the newest stored event (None: none)."""
        if last is not None:
            self.seq = max(self.seq, int(last["seq"]))
            self.last_time = max(self.last_time, float(last["time"]))

    def base(self) -> int:
        """The seq this log continued after (events at or below it are stored ones)."""
        head = self._all.head()
        return int(head["seq"]) - 1 if head is not None else self.seq

    @staticmethod
    def build_older(older: Iterable[Event], upto: int) -> Older:
        """Stored events (oldest first) at or below seq ``upto``, indexed: the long part of
        :meth:`take_older`, for a thread (the log is not touched)."""
        runs: dict[str, _Run] = {k: _Run() for k in KINDS}
        everything = _Run()
        for ev in older:
            kind = ev.get("kind")
            if isinstance(kind, str) and kind in runs and int(ev["seq"]) <= upto:
                everything.items.append(ev)
                runs[kind].items.append(ev)
        return Older(everything, runs, upto)

    def take_older(self, older: Older | Iterable[Event]) -> None:
        """Put stored events before the ones recorded since promotion (O(those), on the
        loop, when ``older`` was built by :meth:`build_older` on a thread). Then the log is
        whole (``loaded``)."""
        if not isinstance(older, Older):
            older = self.build_older(older, self.base())
        mine = self._all.items[self._all.start:]
        self._all, self._kinds = older.all, older.kinds
        for ev in mine:
            if int(ev["seq"]) > older.upto:
                self._append(ev)
        self.loaded = True

    def expire(self, now: float, most: int = 5000) -> list[int]:
        """Drop the oldest events past the window or over the cap (at most ``most``); their
        seqs (the server deletes their rows)."""
        gone: list[int] = []
        limit = now - self.retention
        while len(gone) < most:
            ev = self._all.head()
            if ev is None or (ev["time"] >= limit and len(self._all) <= self.cap):
                break
            self._all.drop_head()
            run = self._kinds[ev["kind"]]
            if run.head() is ev:
                run.drop_head()
            gone.append(int(ev["seq"]))
        return gone

    def forget(self, seqs: Iterable[int]) -> None:
        """Events whose write was rolled back (never stored): out of the log. They are the
        newest, so this pops from the tail."""
        drop = set(seqs)
        for run in (self._all, *self._kinds.values()):
            while len(run) and int(run.items[-1]["seq"]) in drop:
                run.items.pop()

    def page(self, since_seq: int = 0, kind: str | None = None, since_time: float | None = None,
             limit: int = PAGE_DEFAULT, last: bool = False) -> dict[str, Any]:
        """One page: events with seq > ``since_seq`` (of ``kind``, at or after
        ``since_time``), the first ``limit`` of them (``last``: the newest ``limit``), oldest
        first. ``next``: the cursor for the following page (the last seq returned, or the
        newest seq when nothing more matches now); ``more``: whether more match already."""
        if since_seq > self.seq:
            raise RemoteError(ErrorCode.INVALID, f"events: argument 'since_seq': cursor {since_seq} "
                              f"is beyond the newest event ({self.seq}); use the 'next' of a page",
                              {"arg": "since_seq"})
        if kind is not None and kind not in self._kinds:
            raise RemoteError(ErrorCode.INVALID, f"events: argument 'kind': unknown kind {kind!r}; kinds: "
                              f"{', '.join(KINDS)}", {"arg": "kind"})
        run = self._all if kind is None else self._kinds[kind]
        lo = run.index_after(since_seq)
        if since_time is not None:
            lo = max(lo, run.index_from_time(since_time))
        hi = len(run.items)
        if last:
            lo = max(lo, hi - limit)
        got = run.items[lo:lo + limit]
        more = lo + limit < hi
        nxt = int(got[-1]["seq"]) if got and more else max(since_seq, self.seq)
        if got and not more:
            nxt = max(int(got[-1]["seq"]), self.seq)
        head = self._all.head()
        return {"events": got, "next": nxt, "more": more,
                "oldest": int(head["seq"]) if head is not None else self.seq + 1,
                "newest": self.seq}
