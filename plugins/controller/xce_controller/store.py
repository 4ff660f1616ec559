"""The built-in durable store: SQLite in WAL mode with ``synchronous=FULL`` and group commit.

One writer thread owns every write. It takes *all* the writes queued since its last commit and
commits them in one transaction, so N concurrent writers cost one fsync, not N. Each write's
idempotency key (the request's ``rid``) is stored with its result in that same transaction, so
a retried write is answered from the store on whichever candidate is primary next.

**Revisions.** Every write the controller makes carries a *rev* (assigned on the event loop,
in commit order; docs/protocol.md): each row it upserts is stored with it, each record it
deletes leaves a row in ``removed`` with it, its idempotency key is stored with it, and
``meta.rev`` is the highest rev committed. Indexes on ``rev`` let a hot standby read only what
changed after the rev it holds (:meth:`SQLiteStore.changes_since`) through SQLite's
concurrent WAL readers, while the primary writes. ``meta.store_id`` names the store: a
member's ``since`` from another store is not resumable.

Rows are ``(table, key, data, spec)``: the record's JSON (bytes, encoded by the caller at the
moment of the change), or None to delete; ``spec`` is a job's submission blob (None for other
tables). A job's ``data`` is its mutable fields as a JSON array (:mod:`xce_controller.jobs`).

A commit that fails (a full disk, an I/O error) fails its whole batch and the loop goes on.
Every write queued after it was computed by the caller from a state that includes the failed
writes, so it must not be committed either: writes carry the store's *epoch* at submission,
and after a failed commit every write of that epoch (or older) is failed without an attempt,
until the caller has rolled its state back to what :meth:`SQLiteStore.committed` reads and
called :meth:`SQLiteStore.resume`, which starts a new epoch. The caller decides what to tell
clients; the store never stops by itself.

The reading side -- a new primary's load, a standby's snapshot and follow -- is in
:mod:`xce_controller.storeread`; this class offers both (the ``Store`` protocol of
:mod:`xce_controller.hookspecs`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xce_controller import storeread
from xce_controller.changes import Change
from xce_controller.jobs import JobTable
from xce_controller.storeread import Delta, Head, Images

if TYPE_CHECKING:
    import sqlite3

TABLES = ("jobs", "hosts", "queues", "revocations", "meta", "events")  # events: xce_controller.events
KINDS = ("jobs", "hosts", "queues", "revocations")  # tables of records with revs
DB_NAME = "state.db"

Row = tuple[str, Any, bytes | None, bytes | None]
"""``(table, key, data, spec)``: data None deletes; spec is a job's submission blob."""


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
    """One write to commit: rows to upsert or delete, its rev, idempotency key and result.

    ``rev`` 0: a write that changes no record (store housekeeping): it gets no rev.
    """

    rows: list[Row]
    rid: str | None = None
    result: bytes = b"null"
    rev: int = 0
    error: StorageFault | None = None  # set by the writer when the write was not committed
    # Free for the caller (the controller keeps its waiters and pushes here).
    extra: Any = None
    epoch: int = 0  # set by :meth:`SQLiteStore.submit`
    # Set by a store that files idempotency keys by time (etcd): the time it filed this
    # write's key under, which the caller remembers and passes to ``lookup``; 0: its clock.
    committed_at: float = 0.0
    # Housekeeping, in bounded batches: forget idempotency keys stored before this time, and
    # the removal records at or below this rev.
    expire_before: float | None = None
    prune_removed: int | None = None


_STOP = object()


def take_batch(q: queue.SimpleQueue[Any], first: Write, most: int | None = None,
               stop: object = _STOP) -> tuple[list[Write], bool]:
    """``first`` and every write queued behind it now (at most ``most`` in all; None: no
    bound), and whether ``stop`` came among them (the batch is then the writer's last)."""
    batch = [first]
    while most is None or len(batch) < most:
        try:
            item = q.get_nowait()
        except queue.Empty:
            break
        if item is stop:
            return batch, True
        batch.append(item)
    return batch, False


def fail_doomed(batch: list[Write], failed_epoch: int, fault: StorageFault | None,
                on_done: Callable[[list[Write]], None]) -> list[Write]:
    """Fail, without an attempt, the writes of ``batch`` queued before the last failure
    (epoch ``failed_epoch`` or older: epochs only grow along the queue, so they are a prefix)
    and report them; the rest, to commit."""
    split = 0
    while split < len(batch) and batch[split].epoch <= failed_epoch:
        split += 1
    if split:
        assert fault is not None
        doomed = batch[:split]
        for w in doomed:
            w.error = fault
        on_done(doomed)
    return batch[split:]
HOUSEKEEPING_BATCH = 5000  # the most keys, or removal records, one housekeeping write drops


class SQLiteStore:
    """SQLite state store in ``<state_dir>/state.db``."""

    def __init__(self, state_dir: str, *, max_batch: int = 20000) -> None:
        self.path = Path(state_dir) / DB_NAME
        self.max_batch = max_batch
        self._db: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None  # committed(), lookup(): any thread
        self._reader_lock = threading.Lock()
        self._follower: sqlite3.Connection | None = None  # a standby's reads (one thread)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.commits = 0  # transactions committed (for tests and benchmarks)
        self.epoch = 0  # bumped by resume(); read and written on the caller's thread only
        self.expired = 0  # idempotency keys dropped by housekeeping (tests read it)

    # -- opening -----------------------------------------------------------------------------

    def open(self) -> None:
        """Open (creating, or upgrading an older schema) for writing; call on a thread, at
        promotion."""
        import sqlite3

        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        storeread.create_schema(db)
        self._db = db
        # A second connection for :meth:`committed` and :meth:`lookup`: in WAL mode it reads
        # the last committed state while the writer may be inside a transaction. Opened now,
        # while the disk is presumably fine, rather than when it is needed (after a failure).
        self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    # -- reading (the new primary's load, a standby's follow) -----------------------------------

    def head(self) -> Head:
        """What a primary needs before it can take writes: meta, hosts, queues (no job)."""
        return storeread.read_head(self.db)

    def load_window(self, capacity: int, floor: int) -> tuple[list[Change], int]:
        """The last ``capacity`` changes (the retention window), oldest first, and the rev
        at or below which changes may be missing."""
        with self._loading() as db:
            return storeread.read_changes_window(db, capacity, floor)

    def load_jobs(self, upto: int, clean_width: float) -> JobTable:
        """Every job with an id <= ``upto``, indexed (the long part of a load: a thread)."""
        with self._loading() as db:
            return storeread.read_jobs(db, upto, clean_width)

    def load_idem(self, since: float, add: Callable[[str, float], None]) -> int:
        """Call ``add(rid, ts)`` for every idempotency key stored at or after ``since``."""
        with self._loading() as db:
            return storeread.read_idem(db, since, add)

    def load_events(self, limit: int) -> list[bytes]:
        """The newest ``limit`` cluster events (their JSON), oldest first; any thread."""
        with self._loading() as db:
            return storeread.read_events(db, limit)

    def snapshot(self, ring_capacity: int, clean_width: float, idem_since: float,
                 add_idem: Callable[[str, float], None]) -> tuple[Head, JobTable] | None:
        """A standby's whole load, in one read transaction (one consistent rev); None while
        the store does not exist yet. Opens the standby's own read connection."""
        db = self._follow_db()
        if db is None:
            return None
        return storeread.read_snapshot(db, ring_capacity, clean_width, idem_since, add_idem)

    def changes_since(self, rev: int) -> Delta | None:
        """What changed after ``rev`` (one read transaction), or None when the removal
        records below it are pruned (the caller loads a snapshot again)."""
        db = self._follow_db()
        if db is None:
            raise RuntimeError("changes_since: the store does not exist yet")
        return storeread.read_changes(db, rev)

    def wait_changed(self, timeout: float, poll: float = 0.005) -> bool:
        """Block up to ``timeout`` s until another connection commits; False on timeout."""
        db = self._follow_db()
        if db is None:
            time.sleep(min(timeout, 0.05))
            return self.path.exists()
        return storeread.wait_for_commit(db, timeout, poll)

    def committed(self, keys: Iterable[tuple[str, Any]]) -> Images:
        """The committed ``(data, spec)`` of each ``(table, key)`` (None: no such row); any
        thread. What the caller rolls its in-memory records back to after a failed commit."""
        with self._reading() as db:
            return storeread.read_images(db, keys)

    def lookup(self, rid: str, near: float | None = None) -> bytes | None:
        """The stored result (JSON) of idempotency key ``rid``, or None; any thread
        (``near``, the time the caller remembers it by, is not needed here)."""
        with self._reading() as db:
            row = db.execute("SELECT result FROM idem WHERE rid = ?", (rid,)).fetchone()
        return None if row is None else bytes(row[0])

    @contextlib.contextmanager
    def _loading(self) -> Any:
        """A read connection of its own for a cold load's long reads: the shared reader
        (``lookup``, ``committed``) stays free, so the writes a primary takes while its jobs
        load are not held behind the load."""
        if self._reader is None:
            raise RuntimeError("store is not open")
        import sqlite3

        db = sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True, isolation_level=None,
                             check_same_thread=False)
        try:
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _reading(self) -> Any:
        if self._reader is None:
            raise RuntimeError("store is not open")
        with self._reader_lock:
            yield self._reader

    def _follow_db(self) -> sqlite3.Connection | None:
        if self._follower is None:
            import sqlite3

            if not self.path.exists():
                return None
            uri = f"{self.path.as_uri()}?mode=rw"  # never creates the file: the primary does
            self._follower = sqlite3.connect(uri, uri=True, isolation_level=None,
                                             check_same_thread=False)
        return self._follower

    # -- writing -----------------------------------------------------------------------------

    def commit_now(self, writes: list[Write]) -> None:
        """Commit ``writes`` in one transaction on the calling thread."""
        db = self.db
        upserts: dict[str, list[tuple[Any, ...]]] = {}
        deletes: dict[str, list[tuple[Any]]] = {}
        removed: list[tuple[str, Any, int]] = []
        idem: list[tuple[str, bytes, float, int]] = []
        now = time.time()
        top = 0
        housekeeping: list[Write] = []
        for w in writes:
            rev = w.rev
            top = max(top, rev)
            for table, key, data, spec in w.rows:
                if table not in TABLES:
                    raise ValueError(f"unknown table {table!r}")
                if data is None:
                    deletes.setdefault(table, []).append((key,))
                    if table in KINDS:
                        removed.append((table, key, rev))
                elif table == "jobs":
                    upserts.setdefault(table, []).append((key, rev, spec, data))
                elif table == "meta":
                    upserts.setdefault(table, []).append((key, data))
                else:
                    upserts.setdefault(table, []).append((key, rev, data))
            if w.rid is not None:
                idem.append((w.rid, w.result, now, rev))
            if w.expire_before is not None or w.prune_removed is not None:
                housekeeping.append(w)
        db.execute("BEGIN IMMEDIATE")
        try:
            for table, params in upserts.items():
                db.executemany(storeread.UPSERT[table], params)
            for table, keys in deletes.items():
                db.executemany(f"DELETE FROM {table} WHERE key = ?", keys)
            if removed:
                db.executemany("INSERT INTO removed (kind, key, rev) VALUES (?, ?, ?)", removed)
            if idem:
                db.executemany("INSERT OR REPLACE INTO idem VALUES (?, ?, ?, ?)", idem)
            for w in housekeeping:
                self._housekeep(db, w)
            if top:
                db.execute("INSERT OR REPLACE INTO meta (key, data) VALUES ('rev', ?)",
                           (str(top).encode(),))
            db.execute("COMMIT")
        except BaseException:
            # On SQLITE_FULL and some I/O errors SQLite has already rolled the transaction
            # back; a second ROLLBACK would raise "no transaction is active" and hide the cause.
            if db.in_transaction:
                with contextlib.suppress(Exception):
                    db.execute("ROLLBACK")
            raise
        self.commits += 1

    def _housekeep(self, db: sqlite3.Connection, w: Write) -> None:
        if w.expire_before is not None:
            cur = db.execute(
                "DELETE FROM idem WHERE rid IN (SELECT rid FROM idem WHERE ts < ? "
                "ORDER BY ts LIMIT ?)", (w.expire_before, HOUSEKEEPING_BATCH))
            self.expired += max(0, cur.rowcount)
        if w.prune_removed is not None:
            (top,) = db.execute(
                "SELECT max(rev) FROM (SELECT rev FROM removed WHERE rev <= ? ORDER BY rev "
                "LIMIT ?)", (w.prune_removed, HOUSEKEEPING_BATCH)).fetchone()
            if top is not None:
                db.execute("DELETE FROM removed WHERE rev <= ?", (top,))
                db.execute("INSERT OR REPLACE INTO meta (key, data) VALUES ('removed_floor', ?)",
                           (str(top).encode(),))

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
            batch, stopping = take_batch(self._queue, first, self.max_batch)
            live = fail_doomed(batch, failed_epoch, fault, on_done)
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
        for db in (self._db, self._reader, self._follower):
            if db is not None:
                db.close()
        self._db = self._reader = self._follower = None
