"""The reading side of the SQLite store: schema, a new primary's load, a standby's follow.

A new primary reads the small part first (:func:`read_head`: meta, hosts, queues) and starts
taking writes; the jobs (:func:`read_jobs`), the idempotency keys (:func:`read_idem`) and the
retention window (:func:`read_changes_window`) load on a thread meanwhile. A hot standby
reads everything in one read transaction (:func:`read_snapshot`), then follows
(:func:`wait_for_commit`, :func:`read_changes`): every row with a rev above the one it
holds, through the rev indexes, while the primary writes (SQLite's WAL lets readers on the
same host read the last commit without blocking the writer).

Every function takes a connection and runs on the caller's thread; none is called on the
controller's event loop.
"""

from __future__ import annotations

import heapq
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

import orjson

from xce_controller.changes import Change
from xce_controller.jobs import (
    RECORD_FIELDS,
    STORED,
    Job,
    JobTable,
    job_from_row,
    make_alloc,
    normalise,
)

if TYPE_CHECKING:
    import sqlite3

SCHEMA = 2
Images = dict[tuple[str, Any], tuple[bytes, bytes | None] | None]
"""What :func:`read_images` returns: each ``(table, key)``'s ``(data, spec)``, or None."""

_DDL = (
    "CREATE TABLE IF NOT EXISTS jobs (key INTEGER PRIMARY KEY, rev INTEGER NOT NULL, "
    "spec BLOB NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS jobs_rev ON jobs (rev)",
    "CREATE TABLE IF NOT EXISTS hosts (key TEXT PRIMARY KEY, rev INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS hosts_rev ON hosts (rev)",
    "CREATE TABLE IF NOT EXISTS queues (key TEXT PRIMARY KEY, rev INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS queues_rev ON queues (rev)",
    # Revoked bearer tokens (xce_controller.revocations): created on an older store too.
    "CREATE TABLE IF NOT EXISTS revocations (key TEXT PRIMARY KEY, rev INTEGER NOT NULL, "
    "data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS revocations_rev ON revocations (rev)",
    # meta, idem and events are keyed by text and rewritten by (almost) every commit: as
    # WITHOUT ROWID tables their rows live in the key's b-tree, so a commit touches one page
    # per table instead of two (the table's and its key index's) -- 3 of the ~10 pages a
    # keyed submit wrote. Stores created before keep their rowid tables (same SQL for both).
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, data BLOB) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS removed (kind TEXT NOT NULL, key NOT NULL, rev INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS removed_rev ON removed (rev)",
    "CREATE TABLE IF NOT EXISTS idem (rid TEXT PRIMARY KEY, result BLOB, ts REAL, "
    "rev INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS idem_ts ON idem (ts)",
    "CREATE INDEX IF NOT EXISTS idem_rev ON idem (rev)",
    # Cluster events (xce_controller.events), keyed by their zero-padded seq; added to schema
    # 2 in place (a table of its own: an older controller never reads it).
    "CREATE TABLE IF NOT EXISTS events (key TEXT PRIMARY KEY, rev INTEGER NOT NULL, "
    "data BLOB NOT NULL) WITHOUT ROWID",
)
UPSERT = {
    "jobs": "INSERT INTO jobs (key, rev, spec, data) VALUES (?, ?, ?, ?) ON CONFLICT (key) "
            "DO UPDATE SET rev = excluded.rev, data = excluded.data",
    "hosts": "INSERT OR REPLACE INTO hosts (key, rev, data) VALUES (?, ?, ?)",
    "queues": "INSERT OR REPLACE INTO queues (key, rev, data) VALUES (?, ?, ?)",
    "revocations": "INSERT OR REPLACE INTO revocations (key, rev, data) VALUES (?, ?, ?)",
    "meta": "INSERT OR REPLACE INTO meta (key, data) VALUES (?, ?)",
    "events": "INSERT OR REPLACE INTO events (key, rev, data) VALUES (?, ?, ?)",
}


@dataclass(slots=True)
class Head:
    """The small part of the state, read before a primary takes writes."""

    store_id: str
    rev: int
    next_jobid: int
    max_jobid: int
    hosts: dict[str, dict[str, Any]]
    queues: dict[str, dict[str, Any]]
    meta: dict[str, Any]
    changes: list[Change] = field(default_factory=list)  # the retention window, oldest first
    floor: int = 0  # changes at or below this rev may be missing from ``changes``
    revocations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class Delta:
    """What changed in the store after a rev (a standby applies it in rev order)."""

    since: int
    rev: int
    next_jobid: int
    jobs: list[Job]
    hosts: dict[str, dict[str, Any]]
    queues: dict[str, dict[str, Any]]
    removed: list[tuple[str, Any, int]]  # (kind, key, rev)
    idem: list[tuple[str, float]]  # committed idempotency keys and when
    changes: list[Change]  # all of the above as ring entries, by rev
    revocations: dict[str, dict[str, Any]] = field(default_factory=dict)


# -- schema ----------------------------------------------------------------------------------


def create_schema(db: sqlite3.Connection) -> None:
    """Create the tables (or upgrade a schema-1 store in place, once); name the store."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
    db.execute("BEGIN IMMEDIATE")
    try:
        if cols and "rev" not in cols:
            _upgrade_from_1(db)
        for stmt in _DDL:
            db.execute(stmt)
        meta = dict(db.execute("SELECT key, data FROM meta WHERE key IN ('store_id', 'schema')"))
        if "store_id" not in meta:
            db.execute("INSERT INTO meta VALUES ('store_id', ?)",
                       (orjson.dumps(secrets.token_hex(8)),))
        if "schema" not in meta:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (orjson.dumps(SCHEMA),))
        elif orjson.loads(meta["schema"]) != SCHEMA:
            raise RuntimeError(f"state.db has schema {orjson.loads(meta['schema'])}; this "
                               f"controller reads schema {SCHEMA} (upgrade the controller)")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _upgrade_from_1(db: sqlite3.Connection) -> None:
    """Schema 1 (one JSON object per row, no revs) -> 2: jobs split into their submission
    and their mutable fields; every record at rev 0."""
    for t in ("jobs", "hosts", "queues"):
        db.execute(f"ALTER TABLE {t} RENAME TO {t}_v1")
    db.execute("ALTER TABLE idem ADD COLUMN rev INTEGER NOT NULL DEFAULT 0")
    for stmt in _DDL:
        db.execute(stmt)
    rows = []
    for key, data in db.execute("SELECT key, data FROM jobs_v1"):
        job = job_from_v1(orjson.loads(data))
        rows.append((int(key), 0, job._spec, job.row()))
    db.executemany(UPSERT["jobs"], rows)
    for t in ("hosts", "queues"):
        db.executemany(UPSERT[t], [(k, 0, d) for k, d in db.execute(f"SELECT key, data FROM {t}_v1")])
        db.execute(f"DROP TABLE {t}_v1")
    db.execute("DROP TABLE jobs_v1")


def job_from_v1(rec: dict[str, Any]) -> Job:
    """A schema-1 job record (one dict) as a :class:`Job`."""
    spec = {k: v for k, v in rec.items() if k not in RECORD_FIELDS}
    fields = {k: rec[k] for k in STORED if k in rec}
    fields["alloc"] = make_alloc((a["host"], a["ntasks"]) for a in rec.get("alloc") or ())
    return Job(bytes(memoryview(orjson.dumps(spec))), **fields)


# -- a new primary's load ----------------------------------------------------------------------


def read_head(db: sqlite3.Connection) -> Head:
    """Meta, hosts and queues (no jobs): enough to take writes that need no job."""
    loads = orjson.loads
    meta = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM meta")}
    hosts = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM hosts")}
    queues = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM queues")}
    revocations = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM revocations")}
    (max_jobid,) = db.execute("SELECT max(key) FROM jobs").fetchone()
    max_jobid = int(max_jobid or 0)
    return Head(store_id=str(meta.get("store_id", "")), rev=int(meta.get("rev", 0)),
                next_jobid=max(int(meta.get("next_jobid", 1)), max_jobid + 1),
                max_jobid=max_jobid, hosts=hosts, queues=queues, meta=meta,
                floor=int(meta.get("removed_floor", 0)), revocations=revocations)


def read_jobs(db: sqlite3.Connection, upto: int, clean_width: float) -> JobTable:
    """Every job with id <= ``upto``, indexed (:meth:`JobTable.load`: collector off, the
    result frozen)."""
    cur = db.execute("SELECT spec, data FROM jobs WHERE key <= ? ORDER BY key", (upto,))
    return JobTable.load(_jobs(cur), clean_width)


def _jobs(rows: Iterable[tuple[bytes, bytes]]) -> Iterator[Job]:
    loads, make, norm = orjson.loads, Job, normalise  # the load's inner loop: local names
    for spec, data in rows:
        job = make(spec, *loads(data))
        norm(job)
        yield job


def read_idem(db: sqlite3.Connection, since: float, add: Callable[[str, float], None]) -> int:
    """Give every idempotency key stored at or after ``since`` to ``add``; how many."""
    n = 0
    for rid, ts in db.execute("SELECT rid, ts FROM idem WHERE ts >= ?", (since,)):
        add(rid, ts)
        n += 1
    return n


def read_events(db: sqlite3.Connection, limit: int) -> list[bytes]:
    """The newest ``limit`` cluster events' JSON, oldest first (through the key's index)."""
    rows = db.execute("SELECT data FROM events ORDER BY key DESC LIMIT ?", (limit,)).fetchall()
    return [bytes(r[0]) for r in reversed(rows)]


def read_changes_window(db: sqlite3.Connection, capacity: int, floor: int) -> tuple[list[Change], int]:
    """The last ``capacity`` changes in the store (through the rev indexes), oldest first,
    and the floor below which changes may be missing."""
    per: list[list[Change]] = []
    queries = [(f"SELECT rev, '{t}', key FROM {t} ORDER BY rev DESC LIMIT ?", False)
               for t in ("jobs", "hosts", "queues", "revocations")]
    queries.append(("SELECT rev, kind, key FROM removed ORDER BY rev DESC LIMIT ?", True))
    for sql, removed in queries:
        got = [Change(rev, kind, key, removed) for rev, kind, key in db.execute(sql, (capacity + 1,))]
        if len(got) > capacity:  # more are below: the window starts after the first left out
            floor = max(floor, got[capacity].rev)
            del got[capacity:]
        per.append(got)
    newest = list(islice(heapq.merge(*per, key=lambda c: c.rev, reverse=True), capacity + 1))
    if len(newest) > capacity:
        floor = max(floor, newest[capacity].rev)
    window = [c for c in reversed(newest[:capacity]) if c.rev > floor]
    return window, floor


def read_snapshot(db: sqlite3.Connection, ring_capacity: int, clean_width: float,
                  idem_since: float, add_idem: Callable[[str, float], None]
                  ) -> tuple[Head, JobTable] | None:
    """A standby's load: head, window, jobs and keys at one rev (one read transaction);
    None while the primary has not created the tables yet."""
    db.execute("BEGIN")
    try:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'idem_rev'").fetchone() is None:
            return None
        head = read_head(db)
        head.changes, head.floor = read_changes_window(db, ring_capacity, head.floor)
        table = read_jobs(db, head.max_jobid, clean_width)
        read_idem(db, idem_since, add_idem)
        return head, table
    finally:
        db.execute("COMMIT")


# -- a standby's follow ------------------------------------------------------------------------


def wait_for_commit(db: sqlite3.Connection, timeout: float, poll: float) -> bool:
    """Block until another connection commits (``PRAGMA data_version`` moves) or
    ``timeout`` s pass; True if it committed."""
    first = db.execute("PRAGMA data_version").fetchone()[0]
    deadline = time.monotonic() + timeout
    while True:
        if db.execute("PRAGMA data_version").fetchone()[0] != first:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll, left))


def read_changes(db: sqlite3.Connection, since: int) -> Delta | None:
    """Everything committed after rev ``since``, in one read transaction; None when removal
    records above ``since`` were pruned (the reader must load a snapshot again)."""
    loads = orjson.loads
    db.execute("BEGIN")
    try:
        meta = {str(k): loads(d) for k, d in db.execute(
            "SELECT key, data FROM meta WHERE key IN ('rev', 'next_jobid', 'removed_floor')")}
        if since < int(meta.get("removed_floor", 0)):
            return None
        rev = int(meta.get("rev", 0))
        changes: list[Change] = []
        jobs: list[Job] = []
        for key, jrev, spec, data in db.execute(
                "SELECT key, rev, spec, data FROM jobs WHERE rev > ?", (since,)):
            jobs.append(job_from_row(spec, data))
            changes.append(Change(jrev, "jobs", key, False))
        records: dict[str, dict[str, dict[str, Any]]] = {"hosts": {}, "queues": {},
                                                         "revocations": {}}
        for table, out in records.items():
            for key, krev, data in db.execute(
                    f"SELECT key, rev, data FROM {table} WHERE rev > ?", (since,)):
                out[key] = loads(data)
                changes.append(Change(krev, table, key, False))
        removed = [(kind, key, krev) for kind, key, krev in db.execute(
            "SELECT kind, key, rev FROM removed WHERE rev > ?", (since,))]
        changes.extend(Change(krev, kind, key, True) for kind, key, krev in removed)
        idem = [(rid, ts) for rid, ts in db.execute(
            "SELECT rid, ts FROM idem WHERE rev > ?", (since,))]
        (max_jobid,) = db.execute("SELECT max(key) FROM jobs").fetchone()
    finally:
        db.execute("COMMIT")
    changes.sort(key=lambda c: c.rev)
    next_jobid = max(int(meta.get("next_jobid", 1)), int(max_jobid or 0) + 1)
    return Delta(since, max(rev, since), next_jobid, jobs, records["hosts"], records["queues"],
                 removed, idem, changes, records["revocations"])


def read_images(db: sqlite3.Connection, keys: Iterable[tuple[str, Any]]) -> Images:
    """The committed ``(data, spec)`` of each ``(table, key)`` (None: no such row)."""
    out: Images = {}
    for table, key in keys:
        if table == "jobs":
            row = db.execute("SELECT data, spec FROM jobs WHERE key = ?", (key,)).fetchone()
            out[(table, key)] = None if row is None else (bytes(row[0]), bytes(row[1]))
        elif table in ("hosts", "queues", "revocations", "meta", "events"):
            row = db.execute(f"SELECT data FROM {table} WHERE key = ?", (key,)).fetchone()
            out[(table, key)] = None if row is None else (bytes(row[0]), None)
        else:
            raise ValueError(f"unknown table {table!r}")
    return out
