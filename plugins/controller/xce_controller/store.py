"""The built-in durable store: SQLite in WAL mode with ``synchronous=FULL`` and group commit.

One writer thread owns every write. It takes *all* the writes queued since its last commit and
commits them in one transaction, so N concurrent writers cost one fsync, not N. Each write's
idempotency key (the request's ``rid``) is stored with its result in that same transaction, so
a retried write is answered from the store on whichever candidate is primary next.

Rows are ``(table, key, record_json)``: the record's JSON (bytes, encoded by the caller at
the moment of the change, so a later change of the same record can never leak into an
earlier commit), or None to delete. Results are stored as JSON bytes too.

A site replaces this store through the ``xce_controller_store`` hook with any object offering
:meth:`open`, :meth:`load`, :meth:`submit`, :meth:`run_writer`, :meth:`stop`, :meth:`lookup`
and :meth:`close`.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import sqlite3

TABLES = ("jobs", "hosts", "queues", "meta")
DB_NAME = "state.db"

Row = tuple[str, Any, bytes | None]


@dataclass(slots=True)
class Write:
    """One write to commit: rows to upsert or delete, and its idempotency key and result."""

    rows: list[Row]
    rid: str | None = None
    result: bytes = b"null"
    error: str | None = None  # set by the writer when the commit failed
    # Free for the caller (the controller keeps its waiters and pushes here).
    extra: Any = None


@dataclass(slots=True)
class Loaded:
    """Everything a new primary loads."""

    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    idem: dict[str, bytes] = field(default_factory=dict)  # rid -> result JSON


_STOP = object()


class SQLiteStore:
    """SQLite state store in ``<state_dir>/state.db``."""

    def __init__(self, state_dir: str, *, max_batch: int = 20000) -> None:
        self.path = Path(state_dir) / DB_NAME
        self.max_batch = max_batch
        self._db: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.commits = 0  # transactions committed (for tests and benchmarks)

    def open(self) -> None:
        """Open (creating) the database; call on a thread, at promotion."""
        import sqlite3

        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        for table in TABLES:
            kind = "INTEGER" if table == "jobs" else "TEXT"
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key {kind} PRIMARY KEY, data BLOB)")
        db.execute("CREATE TABLE IF NOT EXISTS idem (rid TEXT PRIMARY KEY, result BLOB, ts REAL)")
        self._db = db

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    def load(self, idem_ttl: float) -> Loaded:
        """Read the whole state (and prune idempotency keys older than ``idem_ttl``)."""
        db = self.db
        out = Loaded()
        loads = orjson.loads
        out.jobs = {int(k): loads(d) for k, d in db.execute("SELECT key, data FROM jobs")}
        out.hosts = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM hosts")}
        out.queues = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM queues")}
        out.meta = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM meta")}
        db.execute("DELETE FROM idem WHERE ts < ?", (time.time() - idem_ttl,))
        out.idem = {r: bytes(d) for r, d in db.execute("SELECT rid, result FROM idem")}
        return out

    def lookup(self, rid: str) -> bytes | None:
        """The stored result (JSON) of idempotency key ``rid``, or None."""
        row = self.db.execute("SELECT result FROM idem WHERE rid = ?", (rid,)).fetchone()
        return None if row is None else bytes(row[0])

    def commit_now(self, writes: list[Write]) -> None:
        """Commit ``writes`` in one transaction on the calling thread."""
        db = self.db
        upserts: dict[str, list[tuple[Any, bytes]]] = {}
        deletes: dict[str, list[tuple[Any]]] = {}
        idem: list[tuple[str, bytes, float]] = []
        now = time.time()
        for w in writes:
            for table, key, data in w.rows:
                if table not in TABLES:
                    raise ValueError(f"unknown table {table!r}")
                if data is None:
                    deletes.setdefault(table, []).append((key,))
                else:
                    upserts.setdefault(table, []).append((key, data))
            if w.rid is not None:
                idem.append((w.rid, w.result, now))
        db.execute("BEGIN IMMEDIATE")
        try:
            for table, params in upserts.items():
                db.executemany(
                    f"INSERT OR REPLACE INTO {table} (key, data) VALUES (?, ?)", params
                )
            for table, keys in deletes.items():
                db.executemany(f"DELETE FROM {table} WHERE key = ?", keys)
            if idem:
                db.executemany("INSERT OR REPLACE INTO idem VALUES (?, ?, ?)", idem)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.commits += 1

    def submit(self, write: Write) -> None:
        """Queue ``write`` for the writer thread (thread-safe, never blocks)."""
        self._queue.put(write)

    def stop(self) -> None:
        """Make :meth:`run_writer` commit what is queued and return."""
        self._queue.put(_STOP)

    def run_writer(self, on_done: Callable[[list[Write]], None]) -> None:
        """The writer loop (run it on its own thread): commit queued writes in groups.

        ``on_done(batch)`` is called after every commit with the batch, in commit order; when
        a commit fails, every write of the batch has ``error`` set, ``on_done`` is called and
        the loop ends (the caller must stop being primary).
        """
        get = self._queue.get
        while True:
            first = get()
            if first is _STOP:
                return
            batch: list[Write] = [first]
            stopping = False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            try:
                self.commit_now(batch)
            except Exception as exc:
                for w in batch:
                    w.error = f"{type(exc).__name__}: {exc}"
                on_done(batch)
                return
            on_done(batch)
            if stopping:
                return

    def close(self) -> None:
        """Close the database."""
        if self._db is not None:
            self._db.close()
            self._db = None
