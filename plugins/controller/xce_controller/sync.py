"""A member's sync: its subscription's snapshot, or what changed since its rev, in chunks.

After a join the controller sends ``sync_begin``, then ``sync_records`` / ``sync_removed``
frames, then ``sync_end`` (docs/protocol.md, "Pushes that carry the sync"). The frames are
made here, a chunk at a time, by a generator (:func:`chunks`): each step looks at a bounded
number of records (:data:`SCAN`) and returns frames of at most :data:`MAX_RECORDS` records
or about :data:`MAX_BYTES` of JSON. Between two steps the state may change: every phase
resumes from a cursor (a job id, a host name, a rev) and not from a position in a container,
and the member is already in the fan-out, so a change made meanwhile reaches it as an
ordinary push, newer than (or equal to) what the sync sends. The streaming task
(:func:`stream`) makes the next chunk only once the member's outbox has room, so a slow member
slows only its own sync and holds at most a few chunks of memory.

A ``delta`` sync sends the records of the retention window's changes after ``since`` (their
current versions: a change that was overtaken by a newer one is skipped, the newer one sent)
and the removals. The kinds without revs (members, resource values, pend reasons, usage) are
sent whole in a snapshot; in a delta too, unless ``since`` carries this primary's volatile
position (``since["volatile"]``, :class:`~xce_controller.changes.VolatileLog`) and its ring
still covers it: then only the volatile keys that changed after it are sent (their current
values, or removed). ``sync_begin``'s ``volatile`` says which (``mode`` ``delta`` or ``whole``)
and where the member stands once the sync ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio
import orjson
from loguru import logger

from xce_controller.changes import ChangeRing, VolatileLog
from xce_controller.jobs import Query
from xce_controller.state import ClusterState
from xce_controller.subscribe import Subscription
from xcecore.protocol import ACTIVE, UNFINISHED

if TYPE_CHECKING:
    from xce_controller.pushes import Gate, Outbox

MAX_RECORDS: Final = 1000
MAX_BYTES: Final = 1 << 20
SCAN: Final = 5000  # records (or changes) one step may look at
HIGH_WATER: Final = 2 << 20  # bytes unsent in the member's outbox before the next chunk waits

Frame = tuple[str, bytes]  # (push name, its data's JSON)


class Source(Protocol):
    """What a sync reads (the controller): its state, window and revs."""

    state: ClusterState
    ring: ChangeRing
    volatile: VolatileLog
    store_id: str
    rev: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What one sync sends: its mode, the store, the rev it brings the member to (S), and
    for a delta the rev it starts after."""

    mode: str  # "snapshot" | "delta"
    store: str
    rev: int
    since: int | None
    volatile_since: int | None = None  # a delta of the volatile kinds after this seq; None: whole

    def reply(self) -> dict[str, Any]:
        """The ``sync`` field of the join's reply."""
        return {"mode": self.mode, "store": self.store, "rev": self.rev}


def plan(src: Source, sub: Subscription, since: dict[str, Any] | None, rev: int) -> Plan:
    """Delta when ``since`` names this store and a rev the window covers (and the member is
    not a host-scoped one, whose snapshot is a handful of records); else a snapshot."""
    if (since is not None and since.get("store") == src.store_id and not sub.hosted()
            and isinstance(since.get("rev"), int) and src.ring.covers(since["rev"])
            and since["rev"] <= rev):
        return Plan("delta", src.store_id, rev, since["rev"], src.volatile.resumable(since))
    return Plan("snapshot", src.store_id, rev, None)


def begin(src: Source, sub: Subscription, p: Plan) -> bytes:
    """The ``sync_begin`` push's data."""
    data: dict[str, Any] = {"mode": p.mode, "store": p.store, "rev": p.rev, "since": p.since,
                            "volatile": src.volatile.wire("whole" if p.volatile_since is None
                                                          else "delta")}
    if p.mode == "snapshot":
        data["counts"] = counts(src.state, sub)
    return orjson.dumps(data)


def counts(st: ClusterState, sub: Subscription) -> dict[str, int]:
    """How many records of each kind a snapshot sends (informative: it may change)."""
    out: dict[str, int] = {}
    tbl = st.jobs
    for kind, scope in sub.scopes:
        if kind == "jobs":
            out[kind] = (len(tbl) if scope == "all"
                         else sum(len(tbl.by_state[s]) for s in UNFINISHED) if scope == "unfinished"
                         else len(tbl.active_on.get(sub.host or "", ())))
        elif kind == "hosts":
            out[kind] = len(st.hosts) if scope == "all" else int((sub.host or "") in st.hosts)
        elif kind == "queues":
            out[kind] = len(st.queues)
        elif kind == "members":
            out[kind] = len(st.members)
        elif kind == "revocations":
            out[kind] = len(st.revocations)
    return out


def _records(kind: str, items: list[bytes]) -> Frame:
    return ("sync_records", b'{"kind":"' + kind.encode() + b'","items":[' + b",".join(items) + b"]}")


def _removed(kind: str, keys: list[Any]) -> Frame:
    return ("sync_removed", orjson.dumps({"kind": kind, "keys": keys}))


class _Batch:
    """Items of one kind gathered into frames of bounded size."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.items: list[bytes] = []
        self.size = 0

    def add(self, data: bytes, out: list[Frame]) -> None:
        if self.items and (len(self.items) >= MAX_RECORDS or self.size + len(data) > MAX_BYTES):
            self.flush(out)
        self.items.append(data)
        self.size += len(data)

    def flush(self, out: list[Frame]) -> None:
        if self.items:
            out.append(_records(self.kind, self.items))
            self.items, self.size = [], 0


def chunks(src: Source, sub: Subscription, p: Plan) -> Iterator[list[Frame]]:
    """The frames after ``sync_begin``, one bounded step at a time (the last: ``sync_end``)."""
    st = src.state
    kinds = sub.kinds()
    delta = p.mode == "delta"
    if "cluster" in kinds:
        conf = {**st.clusterconf(), "rev": p.rev}
        yield [_records("cluster", [orjson.dumps(conf)])]
    whole = p.volatile_since is None
    if "members" in kinds and whole:
        yield from _members(st)
    if delta:
        assert p.since is not None
        yield from _changes(src, sub, p.since, p.rev)
    else:
        if "queues" in kinds:
            yield [_records("queues", [orjson.dumps(q) for q in st.sorted_queues()])]
        if "hosts" in kinds:
            yield from _hosts(st, sub, lambda h: orjson.dumps(h))
        if "jobs" in kinds:
            yield from _jobs(st, sub, kinds["jobs"])
        if "revocations" in kinds:
            yield from _revocations(st)
    # The kinds without revs come whole unless this primary can say what changed since the
    # member's volatile position: the member replaces what it held of them at sync_begin
    # (docs/protocol.md), even where a host or job record it is also sent carries the same
    # values.
    if not whole:
        assert p.volatile_since is not None
        yield from _volatile_changes(src, sub, p.volatile_since)
        yield [("sync_end", orjson.dumps({"rev": p.rev}))]
        return
    if "resvals" in kinds:
        yield from _hosts(st, sub, lambda h: orjson.dumps({"host": h["name"], "values": h["resvals"]}),
                          kind="resvals")
    if "pend_reasons" in kinds:
        yield from _reasons(st)
    if "jusage" in kinds:
        yield from _usage(st)
    yield [("sync_end", orjson.dumps({"rev": p.rev}))]


def _revocations(st: ClusterState) -> Iterator[list[Frame]]:
    # Bounded per user (xce_controller.revocations.MAX_PER_USER): a list of pointers, each
    # chunk encodes a slice.
    records = list(st.revocations.records.values())
    for i in range(0, len(records), MAX_RECORDS):
        yield [_records("revocations", [orjson.dumps(r) for r in records[i:i + MAX_RECORDS]])]


def _members(st: ClusterState) -> Iterator[list[Frame]]:
    members = list(st.members.values())  # pointers only; each chunk encodes a slice
    for i in range(0, len(members), MAX_RECORDS):
        yield [_records("members", [orjson.dumps(m) for m in members[i:i + MAX_RECORDS]])]


def _hosts(st: ClusterState, sub: Subscription, enc: Callable[[dict[str, Any]], bytes],
           kind: str = "hosts") -> Iterator[list[Frame]]:
    scope = sub.scope(kind)
    if scope == "own":
        host = st.hosts.get(sub.host or "")
        if host is not None:
            yield [_records(kind, [enc(host)])]
        return
    start = ""
    while True:
        names, nxt = st.hosts_from(start, MAX_RECORDS)
        items = [enc(st.hosts[n]) for n in names if n in st.hosts]
        if items:
            batch = _Batch(kind)
            out: list[Frame] = []
            for data in items:
                batch.add(data, out)
            batch.flush(out)
            yield out
        if nxt is None:
            return
        start = nxt


def _jobs(st: ClusterState, sub: Subscription, scope: str) -> Iterator[list[Frame]]:
    if scope == "host":
        q = Query(states=ACTIVE, host=sub.host or "")
    elif scope == "unfinished":
        q = Query(states=UNFINISHED)
    else:
        q = Query()
    start: int | None = 1
    while start is not None:
        page = st.jobs.page(q, start, MAX_RECORDS, MAX_BYTES, SCAN)
        if page.jobs:
            yield [_records("jobs", page.jobs)]
        elif page.next is not None:
            yield []  # nothing matched in this step's scan: give the loop its turn
        start = page.next


def _reasons(st: ClusterState) -> Iterator[list[Frame]]:
    start = 0
    while True:
        tbl = st.jobs
        items: list[bytes] = []
        nxt: int | None = None
        for jid in tbl.reasons.iter_from(start):
            if len(items) >= MAX_RECORDS:
                nxt = jid
                break
            job = tbl.get(jid)
            if job is not None and job.pend_reason is not None:
                items.append(orjson.dumps({"jobid": jid, "reason": job.pend_reason}))
        if items:
            yield [_records("pend_reasons", items)]
        if nxt is None:
            return
        start = nxt


def _usage(st: ClusterState) -> Iterator[list[Frame]]:
    q = Query(states=ACTIVE)
    start: int | None = 1
    while start is not None:
        tbl = st.jobs
        items: list[bytes] = []
        nxt: int | None = None
        for scanned, jid in enumerate(tbl.candidates(q, start)):
            if len(items) >= MAX_RECORDS or scanned >= SCAN:
                nxt = jid
                break
            job = tbl[jid]
            if job.usage:
                items.append(orjson.dumps({"jobid": jid, "usage": job.usage}))
        if items:
            yield [_records("jusage", items)]
        elif nxt is not None:
            yield []
        start = nxt


class BehindWindow(Exception):
    """A delta sync fell behind the retention window (the ring dropped what it had not sent)."""


def _changes(src: Source, sub: Subscription, since: int, upto: int) -> Iterator[list[Frame]]:
    """The records changed, and the keys removed, after ``since`` up to ``upto``."""
    kinds = sub.kinds()
    rev, skip = since + 1, 0  # every change before ``rev``, and ``skip`` at ``rev``, are sent
    while True:
        ring = src.ring
        if not ring.covers(rev - 1):
            raise BehindWindow(f"changes after rev {rev - 1} are no longer in the window "
                               f"(it starts after {ring.floor})")
        got = ring.after(rev - 1, SCAN + skip, upto)[skip:]
        if not got:
            break
        st = src.state
        out: list[Frame] = []
        batches = {k: _Batch(k) for k in ("jobs", "hosts", "queues", "revocations")}
        removed: dict[str, list[Any]] = {}
        for c in got:
            if c.kind not in kinds:
                continue
            if c.kind == "hosts" and kinds["hosts"] == "own" and c.key != sub.host:
                continue
            record = _current(st, c.kind, c.key)
            if c.removed:
                if record is None:
                    removed.setdefault(c.kind, []).append(c.key)
            elif record is not None and record[0] == c.rev:
                batches[c.kind].add(record[1], out)
        for b in batches.values():
            b.flush(out)
        out.extend(_removed(kind, keys) for kind, keys in removed.items())
        yield out
        last = got[-1].rev
        run = sum(1 for c in got if c.rev == last)
        rev, skip = (last, skip + run) if last == rev else (last, run)


def _volatile_changes(src: Source, sub: Subscription, since: int) -> Iterator[list[Frame]]:
    """The current values of the volatile keys changed after ``since`` (or their removal).

    The keys of a step are taken from the ring before it is encoded, and the cursor is the
    ring's own seq: a change made between two steps is sent by a later step (or was pushed).
    """
    kinds = sub.kinds()
    seq = since
    while True:
        log = src.volatile
        if not log.ring.covers(seq):
            raise BehindWindow(f"volatile changes after seq {seq} are no longer in the window "
                               f"(it starts after {log.ring.floor})")
        got = log.ring.after(seq, SCAN)
        if not got:
            return
        seq = got[-1].rev  # each volatile change has a seq of its own: no run to skip
        st = src.state
        out: list[Frame] = []
        batches: dict[str, _Batch] = {}
        removed: dict[str, list[Any]] = {}
        seen: set[tuple[str, Any]] = set()
        for c in got:
            if c.kind not in kinds or (c.kind, c.key) in seen:
                continue
            seen.add((c.kind, c.key))
            if c.kind == "resvals" and kinds["resvals"] == "own" and c.key != sub.host:
                continue
            data = _volatile_value(st, c.kind, c.key)
            if data is None:
                removed.setdefault(c.kind, []).append(c.key)
            else:
                batches.setdefault(c.kind, _Batch(c.kind)).add(data, out)
        for b in batches.values():
            b.flush(out)
        out.extend(_removed(kind, keys) for kind, keys in removed.items())
        yield out


def _volatile_value(st: ClusterState, kind: str, key: Any) -> bytes | None:
    """The current item of a volatile record (as a whole sync sends it), or None: gone."""
    if kind == "pend_reasons":
        job = st.jobs.get(key)
        reason = None if job is None else job.pend_reason
        return None if reason is None else orjson.dumps({"jobid": key, "reason": reason})
    if kind == "jusage":
        job = st.jobs.get(key)
        if job is None or not job.usage or job.state not in ACTIVE:
            return None
        return orjson.dumps({"jobid": key, "usage": job.usage})
    if kind == "resvals":
        host = st.hosts.get(key)
        return None if host is None else orjson.dumps({"host": key, "values": host["resvals"]})
    member = st.members.get(key)
    return None if member is None else orjson.dumps(member)


def _current(st: ClusterState, kind: str, key: Any) -> tuple[int, bytes] | None:
    """The current (rev, JSON) of a record, or None."""
    if kind == "jobs":
        job = st.jobs.get(key)
        return None if job is None else (job.rev, job.json())
    rec = (st.hosts if kind == "hosts" else st.revocations.records if kind == "revocations"
           else st.queues).get(key)
    return None if rec is None else (int(rec.get("rev", 0)), orjson.dumps(rec))


async def stream(steps: Iterator[list[Frame]], outbox: Outbox,
                 send: Callable[[str, bytes, Gate | None], bool],
                 gate: Callable[[], Gate | None], drop: Callable[[], None], who: str) -> None:
    """Send ``steps``' frames as the member's outbox makes room (a task of its connection).

    ``send(name, data, gate)`` queues a push (False: the member was dropped); every frame
    waits behind the last uncommitted write (``gate()``), as every push does. A sync that
    cannot go on drops the member (``drop()``), which re-joins; nothing is raised.
    """
    try:
        while True:
            await outbox.wait_below(HIGH_WATER)
            try:
                frames = next(steps)
            except StopIteration:
                return
            g = gate()
            for name, data in frames:
                if not send(name, data, g):
                    return
            await anyio.lowlevel.checkpoint()
    except BehindWindow as exc:
        logger.warning("controller: the sync of {} is slower than the cluster changes: {}; "
                       "dropping the member (its re-join gets a snapshot)", who, exc)
        drop()
    except Exception:
        logger.opt(exception=True).error("controller: the sync of {} failed; dropping the "
                                         "member (it re-joins)", who)
        drop()
