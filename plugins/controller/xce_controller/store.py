"""The built-in durable store: SQLite in WAL mode with ``synchronous=FULL`` and group commit.

One writer thread owns every write. It takes *all* the writes queued since its last commit and
commits them in one transaction, so N concurrent writers cost one fsync, not N. Each write's
idempotency key (the request's ``rid``) is stored with its result in that same transaction, so
a retried write is answered from the store on whichever candidate is primary next.

Rows are ``(table, key, record_json)``: the record's JSON (bytes, encoded by the caller at
the moment of the change, so a later change of the same record can never leak into an
earlier commit), or None to delete. Results are stored as JSON bytes too.

A commit that fails (a full disk, an I/O error) fails its whole batch and the loop goes on.
Every write queued after it was computed by the caller from a state that includes the failed
writes, so it must not be committed either: writes carry the store's *epoch* at submission,
and after a failed commit every write of that epoch (or older) is failed without an attempt,
until the caller has rolled its state back to what :meth:`SQLiteStore.committed` reads and
called :meth:`SQLiteStore.resume`, which starts a new epoch. The caller decides what to tell
clients; the store never stops by itself.

A site replaces this store through the ``xce_controller_store`` hook with any object offering
:meth:`open`, :meth:`load`, :meth:`submit`, :meth:`run_writer`, :meth:`stop`, :meth:`resume`,
:meth:`committed`, :meth:`lookup` and :meth:`close`.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import sqlite3

TABLES = ("jobs", "hosts", "queues", "meta")
DB_NAME = "state.db"

Row = tuple[str, Any, bytes | None]


@dataclass(frozen=True, slots=True)
class StorageFault:
    """Why writes could not be committed: what failed, in words an operator can act on."""

    cause: str  # e.g. "no space left on the device (SQLITE_FULL: database or disk is full)"
    path: str  # the database file
    code: str = ""  # the SQLite error name or errno name, when there is one

    def __str__(self) -> str:
        return f"{self.cause} ({self.path})"


def describe_failure(exc: BaseException, path: Path) -> StorageFault:
    """A :class:`StorageFault` naming what ``exc`` (raised by a commit) means."""
    import errno as errnos

    text = str(exc) or type(exc).__name__
    code = str(getattr(exc, "sqlite_errorname", "") or "")
    number = getattr(exc, "errno", None)
    if isinstance(number, int) and number in errnos.errorcode:
        code = code or errnos.errorcode[number]
    if code in ("SQLITE_FULL", "ENOSPC", "EDQUOT"):
        cause = f"no space left on the device ({code}: {text})"
    elif code.startswith("SQLITE_IOERR") or code == "EIO":
        cause = f"I/O error ({code}: {text})"
    else:
        cause = f"{type(exc).__name__}{f' {code}' if code else ''}: {text}"
    return StorageFault(cause, str(path), code)


@dataclass(slots=True)
class Write:
    """One write to commit: rows to upsert or delete, and its idempotency key and result."""

    rows: list[Row]
    rid: str | None = None
    result: bytes = b"null"
    error: StorageFault | None = None  # set by the writer when the write was not committed
    # Free for the caller (the controller keeps its waiters and pushes here).
    extra: Any = None
    epoch: int = 0  # set by :meth:`SQLiteStore.submit`


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
        self._reader: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.commits = 0  # transactions committed (for tests and benchmarks)
        self.epoch = 0  # bumped by resume(); read and written on the caller's thread only

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
        # A second connection for :meth:`committed`: in WAL mode it reads the last committed
        # state while the writer's connection may be inside a transaction. Opened now, while
        # the disk is presumably fine, rather than when it is needed (after a failure).
        self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    def load(self, idem_ttl: float) -> Loaded:
        """Read the whole state (and prune idempotency keys older than ``idem_ttl``)."""
        import sqlite3

        db = self.db
        out = Loaded()
        loads = orjson.loads
        out.jobs = {int(k): loads(d) for k, d in db.execute("SELECT key, data FROM jobs")}
        out.hosts = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM hosts")}
        out.queues = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM queues")}
        out.meta = {str(k): loads(d) for k, d in db.execute("SELECT key, data FROM meta")}
        try:
            db.execute("DELETE FROM idem WHERE ts < ?", (time.time() - idem_ttl,))
        except sqlite3.Error as exc:
            # A full disk must not stop a promotion: the old keys go at the next one.
            from loguru import logger

            logger.warning("store {}: cannot prune old idempotency keys ({}); kept for now",
                           self.path, describe_failure(exc, self.path).cause)
        out.idem = {r: bytes(d) for r, d in db.execute("SELECT rid, result FROM idem")}
        return out

    def committed(self, keys: Iterable[tuple[str, Any]]) -> dict[tuple[str, Any], bytes | None]:
        """The committed JSON of each ``(table, key)`` (None: no such row); any thread.

        What the caller rolls its in-memory records back to after a failed commit.
        """
        if self._reader is None:
            raise RuntimeError("store is not open")
        out: dict[tuple[str, Any], bytes | None] = {}
        for table, key in keys:
            if table not in TABLES:
                raise ValueError(f"unknown table {table!r}")
            row = self._reader.execute(f"SELECT data FROM {table} WHERE key = ?", (key,)).fetchone()
            out[(table, key)] = None if row is None else bytes(row[0])
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
            # On SQLITE_FULL and some I/O errors SQLite has already rolled the transaction
            # back; a second ROLLBACK would raise "no transaction is active" and hide the cause.
            if db.in_transaction:
                with contextlib.suppress(Exception):
                    db.execute("ROLLBACK")
            raise
        self.commits += 1

    def submit(self, write: Write) -> None:
        """Queue ``write`` for the writer thread (never blocks), stamped with the epoch.

        Call it from one thread (the controller's event loop), the one that calls
        :meth:`resume`.
        """
        write.epoch = self.epoch
        self._queue.put(write)

    def resume(self) -> None:
        """After a failed commit: the caller's state is rolled back to :meth:`committed`, so
        writes submitted from now on are attempted again (a new epoch)."""
        self.epoch += 1

    def stop(self) -> None:
        """Make :meth:`run_writer` commit what is queued and return."""
        self._queue.put(_STOP)

    def run_writer(self, on_done: Callable[[list[Write]], None]) -> None:
        """The writer loop (run it on its own thread): commit queued writes in groups.

        ``on_done(batch)`` is called after every commit with the batch, in commit order. When
        a commit fails, every write of the batch has ``error`` set and ``on_done`` is called
        with it; so is every later write of the same epoch (without an attempt: see the
        module docstring). Each call's batch is either all committed or all failed.
        """
        get = self._queue.get
        failed_epoch = -1
        fault: StorageFault | None = None
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
            # Epochs only grow along the queue: the doomed writes are a prefix of the batch.
            split = 0
            while split < len(batch) and batch[split].epoch <= failed_epoch:
                split += 1
            if split:
                assert fault is not None
                doomed = batch[:split]
                for w in doomed:
                    w.error = fault
                on_done(doomed)
            live = batch[split:]
            if live:
                try:
                    self.commit_now(live)
                except Exception as exc:
                    fault = describe_failure(exc, self.path)
                    failed_epoch = max(w.epoch for w in live)
                    for w in live:
                        w.error = fault
                on_done(live)
            if stopping:
                return

    def close(self) -> None:
        """Close the database."""
        for db in (self._db, self._reader):
            if db is not None:
                db.close()
        self._db = self._reader = None
