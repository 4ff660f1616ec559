"""The worker's durable journal: which jobs it started, and what it still has to report.

One append-only file, ``<state_dir>/journal.jsonl``, one JSON object per line. Every record
but an ``ack`` is flushed and fsynced before the caller goes on (and before a note can be
taken for delivery); concurrent appenders share one fsync (group commit), and the fsync runs
outside the journal's lock so readers and the notifier are not held up by the disk:

- ``{"k": "claim", "job": J, "att": A}`` before job J's attempt A is started: a job whose
  attempt was claimed is never started again, also not after a worker restart;
- ``{"k": "run", "job": J, "att": A, "pid": P, "ct": create_time, "status": path}`` once its
  process runs, so a restarted worker can find it again;
- ``{"k": "note", "n": N, "args": {...}}`` a ``notify_job`` to deliver, in order of N; a
  ``finish`` or ``fail`` note also ends the job's attempt;
- ``{"k": "ack", "n": N}`` once the controller answered note N. An ack is written (so it
  survives a crash of the worker process: it is in the kernel's page cache) but not fsynced:
  losing one to a machine crash only makes the note be delivered again, which the
  controller treats as a repeat (below). This halves the fsyncs per report.

A job's ``run`` record and its ``start`` note are one write and one fsync
(:meth:`Journal.record_run` with ``note``).

So notifications made while the controller is unreachable survive a worker restart and are
delivered in order after the re-join. Redelivery after a restart is safe because the
controller answers a second ``finish``/``fail`` of a finished job with the record unchanged
(and a ``start`` of an active job just records the pid again). A torn last line (a crash
mid-append) is dropped when the journal is opened. The file is rewritten (atomically) with
only what is still live once enough acknowledged lines pile up.

A journal that cannot be written (ENOSPC, EDQUOT, EIO: a full or failing disk) does not stop
the worker: the records stay in memory, every note is handed to the notifier all the same
(a job's finish report reaches the controller while the disk is full), nothing more is
appended to the file, and a retry thread rewrites the whole file from memory (as a
compaction does) every :attr:`Journal.RETRY_INTERVAL` until that succeeds. Rewriting rather
than re-appending is deliberate: a failed write may have left a torn line, and after a failed
fsync Linux may have dropped the dirty pages, so only a fresh, fsynced file is known good.
One log line when the journal stops being writable, one when it is again. What is lost while
degraded is durability only: a worker killed before the disk recovers forgets the reports
made meanwhile (those not yet delivered are lost; delivered ones are known to the controller).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

JobKey = tuple[int, int]  # (jobid, attempt)
ENDING = frozenset({"finish", "fail"})
# Errors of the disk rather than of the journal's logic: survived, retried (module docstring).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


@dataclass(slots=True)
class JobEntry:
    """A claimed job attempt: its process once it runs, and whether it ended."""

    jobid: int
    attempt: int
    pid: int | None = None
    create_time: float | None = None
    status_file: str | None = None
    ended: bool = False


@dataclass(frozen=True, slots=True)
class Note:
    """One ``notify_job`` waiting for delivery."""

    n: int
    args: dict[str, Any] = field(default_factory=dict)


class Journal:
    """The journal file and its in-memory view; every method is thread-safe."""

    COMPACT_AFTER = 2000  # acknowledged lines tolerated before a rewrite
    RETRY_INTERVAL = 1.0  # seconds between rewrites of a journal that could not be written

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sync_lock = threading.Lock()  # one fsync at a time; taken before _lock, never after
        self.jobs: dict[JobKey, JobEntry] = {}
        self._pending: OrderedDict[int, Note] = OrderedDict()  # durable, deliverable, by n
        self._unsynced: dict[int, Note] = {}  # written, not yet durable: not deliverable yet
        self._taken: set[int] = set()  # notes being delivered right now
        self._next_n = 1
        self._dead_lines = 0
        self._written = 0  # writes made / known durable (group commit)
        self._synced = 0
        self._failed: OSError | None = None  # the disk error that stopped appends, if any
        self._failed_at = 0.0
        self._closing = threading.Event()
        self._retrier: threading.Thread | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        self._replay()
        # Unbuffered: a write that fails leaves nothing in a user-space buffer to be flushed
        # (or fail again) later; what reached the file is what os.write said.
        self._fh = open(path, "ab", buffering=0)  # held for the journal's life

    # ------------------------------------------------------------------ replay
    def _replay(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            try:
                rec = orjson.loads(line)
                if not line.endswith(b"\n"):
                    raise ValueError("torn line")
            except (orjson.JSONDecodeError, ValueError):
                logger.warning("journal {}: dropping a torn record at byte {} (crash mid-write)",
                               self.path, good)
                break
            self._apply(rec)
            good += len(line)
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)
                os.fsync(fh.fileno())

    def _apply(self, rec: dict[str, Any]) -> None:
        kind = rec.get("k")
        if kind == "claim":
            key = (rec["job"], rec["att"])
            self.jobs.setdefault(key, JobEntry(*key))
        elif kind == "run":
            entry = self.jobs.setdefault((rec["job"], rec["att"]), JobEntry(rec["job"], rec["att"]))
            entry.pid, entry.create_time = rec["pid"], rec.get("ct")
            entry.status_file = rec.get("status")
        elif kind == "note":
            n, args = rec["n"], rec["args"]
            self._pending[n] = Note(n, args)
            self._next_n = max(self._next_n, n + 1)
            self._end(args)
        elif kind == "ack":
            self._pending.pop(rec["n"], None)
            self._dead_lines += 2

    def _end(self, args: dict[str, Any]) -> None:
        if args.get("event") in ENDING:
            key = (args["jobid"], args.get("attempt", 0))
            self.jobs.setdefault(key, JobEntry(*key)).ended = True

    # ------------------------------------------------------------------ appends
    def _write(self, *recs: dict[str, Any]) -> int:
        """Write ``recs`` (one write; caller holds the lock); the number to :meth:`_sync` to.

        While the journal is degraded (a disk error) nothing is appended: the records are in
        memory and the retry rewrites the file from there.
        """
        self._written += 1
        if self._failed is not None:
            return self._written
        data = memoryview(b"".join(orjson.dumps(rec) + b"\n" for rec in recs))
        try:
            while data:
                done = self._fh.write(data)
                if not done:  # a regular file never writes nothing without an error
                    raise OSError(errno.EIO, "write wrote nothing")
                data = data[done:]
        except OSError as exc:
            self._degrade(exc, "write")
        return self._written

    def _sync(self, upto: int) -> None:
        """Make every write up to number ``upto`` durable (caller must NOT hold the lock).

        Group commit: one fsync covers every write made before it started, so appenders on
        several threads share fsyncs instead of queueing one each behind the lock.
        """
        with self._sync_lock:
            if self._synced >= upto:
                return
            with self._lock:
                if self._fh.closed or self._failed is not None:
                    return  # closed while stopping, or degraded: the retry makes it durable
                target = self._written
                fd = os.dup(self._fh.fileno())  # survives a compaction swapping the file
            try:
                os.fsync(fd)
            except OSError as exc:
                with self._lock:
                    self._degrade(exc, "fsync")
                return
            finally:
                os.close(fd)
            self._synced = max(self._synced, target)

    # ------------------------------------------------------------------ disk errors
    def _degrade(self, exc: OSError, what: str) -> None:
        """A disk error (caller holds the lock): keep going in memory, retry in the background.

        An error that is not the disk's (a closed file, a bug) is raised as before.
        """
        if exc.errno not in DISK_ERRNOS:
            raise exc
        if self._failed is not None:
            return
        self._failed, self._failed_at = exc, time.monotonic()
        logger.error("journal {}: {} failed ({}); keeping reports in memory and delivering "
                     "them, rewriting the journal every {:g} s until the disk takes it",
                     self.path, what, os.strerror(exc.errno or 0) or exc, self.RETRY_INTERVAL)
        if self._retrier is None or not self._retrier.is_alive():
            self._retrier = threading.Thread(target=self._retry, daemon=True,
                                             name="xce-journal-retry")
            self._retrier.start()

    @property
    def degraded(self) -> bool:
        """True while the journal cannot be written (records kept in memory only)."""
        return self._failed is not None

    def _retry(self) -> None:
        """Rewrite the file from memory every RETRY_INTERVAL until it works (or closing)."""
        while not self._closing.wait(self.RETRY_INTERVAL):
            if self._try_recover():
                return

    def _try_recover(self) -> bool:
        """One rewrite attempt of a degraded journal; True once the journal is whole again."""
        with self._sync_lock, self._lock:
            if self._failed is None:
                return True
            if self._fh.closed:
                return False
            try:
                self._compact()
            except OSError as exc:
                if exc.errno not in DISK_ERRNOS:
                    logger.opt(exception=True).error("journal {}: rewrite failed", self.path)
                return False
            self._failed = None
            logger.info("journal {}: writable again after {:.1f} s; rewrote it with {} "
                        "unacknowledged report(s)", self.path,
                        time.monotonic() - self._failed_at, len(self._pending))
            return True

    def claim(self, jobid: int, attempt: int) -> bool:
        """Claim ``jobid``'s ``attempt`` before starting it; False if it was ever claimed.

        Durable on return; a concurrent claim of the same attempt already sees it.
        """
        with self._lock:
            if (jobid, attempt) in self.jobs:
                return False
            seq = self._write({"k": "claim", "job": jobid, "att": attempt})
            self.jobs[(jobid, attempt)] = JobEntry(jobid, attempt)
        self._sync(seq)
        return True

    def record_run(self, jobid: int, attempt: int, pid: int, create_time: float | None,
                   status_file: str | None, note: dict[str, Any] | None = None) -> int | None:
        """Record the process a claimed attempt runs as, and spool ``note`` (its ``start``
        report) in the same write and fsync; the note's number, if one was given."""
        run = {"k": "run", "job": jobid, "att": attempt, "pid": pid, "ct": create_time,
               "status": status_file}
        with self._lock:
            if note is None:
                seq, n = self._write(run), None
            else:
                n = self._new_note(note)
                seq = self._write(run, {"k": "note", "n": n, "args": note})
            entry = self.jobs.setdefault((jobid, attempt), JobEntry(jobid, attempt))
            entry.pid, entry.create_time, entry.status_file = pid, create_time, status_file
        self._sync(seq)
        if n is not None:
            self._publish(n)  # also when degraded: delivered, kept in memory until the rewrite
        return n

    def notify(self, args: dict[str, Any]) -> int:
        """Spool one ``notify_job`` (durable on return, and only then deliverable); its
        sequence number."""
        with self._lock:
            n = self._new_note(args)
            seq = self._write({"k": "note", "n": n, "args": args})
        self._sync(seq)
        self._publish(n)
        return n

    def _new_note(self, args: dict[str, Any]) -> int:
        n = self._next_n
        self._next_n += 1
        self._unsynced[n] = Note(n, args)
        self._end(args)
        return n

    def _publish(self, n: int) -> None:
        """Note ``n`` is durable: hand it to the notifier, keeping the order of numbers."""
        with self._cond:
            note = self._unsynced.pop(n)
            late = bool(self._pending) and n < next(reversed(self._pending))
            self._pending[n] = note
            if late:  # another thread's newer note became durable first
                self._pending = OrderedDict(sorted(self._pending.items()))
            self._cond.notify_all()

    def ack(self, n: int) -> None:
        """Note ``n`` was answered by the controller; it is never sent again."""
        with self._cond:
            self._taken.discard(n)
            if self._pending.pop(n, None) is None:
                return
            self._write({"k": "ack", "n": n})  # not fsynced: see the module docstring
            self._dead_lines += 2
            if self._dead_lines >= self.COMPACT_AFTER and self._failed is None:
                try:
                    self._compact()
                except OSError as exc:  # the old file is intact; rewrite it when we can
                    self._degrade(exc, "compaction")
            self._cond.notify_all()

    # ------------------------------------------------------------------ reads
    def next_pending(self, timeout: float | None = None) -> Note | None:
        """The oldest unacknowledged note, waiting up to ``timeout`` for one."""
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            return next(iter(self._pending.values()), None)

    def take(self, timeout: float | None = None) -> Note | None:
        """A note to deliver now, waiting up to ``timeout`` for one; call :meth:`ack` or
        :meth:`release` with it afterwards.

        The oldest note that nobody is delivering and whose job has no older note waiting:
        several threads can deliver notes of different jobs at once, while each job's own
        notes (``start`` before ``finish``) go one after the other, in order.
        """
        with self._cond:
            note = self._takeable()
            if note is None:
                self._cond.wait(timeout)
                note = self._takeable()
            if note is not None:
                self._taken.add(note.n)
            return note

    def release(self, n: int) -> None:
        """Note ``n`` was not delivered: it can be taken again."""
        with self._cond:
            self._taken.discard(n)
            self._cond.notify_all()

    def _takeable(self) -> Note | None:
        busy: set[Any] = set()  # jobs with an older note still waiting or being delivered
        for note in self._pending.values():
            job = note.args.get("jobid")
            if note.n not in self._taken and job not in busy:
                return note
            busy.add(job)
        return None

    def pending(self) -> list[Note]:
        """Every unacknowledged note, oldest first."""
        with self._lock:
            return list(self._pending.values())

    def pending_count(self) -> int:
        """How many notes are unacknowledged."""
        with self._lock:
            return len(self._pending)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until every note is acknowledged; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def active(self) -> list[JobEntry]:
        """Claimed attempts that have not ended (running, or lost by a restart)."""
        with self._lock:
            return [e for e in self.jobs.values() if not e.ended]

    def known(self, jobid: int, attempt: int) -> JobEntry | None:
        """The entry of an attempt this worker claimed, if any."""
        with self._lock:
            return self.jobs.get((jobid, attempt))

    # ------------------------------------------------------------------ upkeep
    def _compact(self) -> None:
        """Rewrite the file with only live records (caller holds the lock)."""
        notes = sorted([*self._pending.values(), *self._unsynced.values()], key=lambda n: n.n)
        pending_ends = {(n.args["jobid"], n.args.get("attempt", 0))
                        for n in notes if n.args.get("event") in ENDING}
        lines: list[bytes] = []
        for e in self.jobs.values():
            # Ended attempts whose end is acknowledged are dropped from the file; they stay
            # in memory for this process, and the controller no longer lists them as active.
            if e.ended and (e.jobid, e.attempt) not in pending_ends:
                continue
            lines.append(orjson.dumps({"k": "claim", "job": e.jobid, "att": e.attempt}))
            if e.pid is not None:
                lines.append(orjson.dumps({"k": "run", "job": e.jobid, "att": e.attempt,
                                           "pid": e.pid, "ct": e.create_time,
                                           "status": e.status_file}))
        lines += [orjson.dumps({"k": "note", "n": n.n, "args": n.args})
                  for n in notes]
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(b"".join(line + b"\n" for line in lines))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:
            tmp.unlink(missing_ok=True)  # a partial copy must not hold the space it needs
            raise
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._fh.close()
        self._fh = open(self.path, "ab", buffering=0)
        self._dead_lines = 0
        self._synced = self._written  # the new file holds every record, fsynced

    def close(self) -> None:
        """Close the file (one last rewrite first if degraded); not usable afterwards."""
        self._closing.set()
        if self._retrier is not None:
            self._retrier.join(5)
        if self._failed is not None and not self._try_recover():
            logger.error("journal {}: closing while the disk refuses it ({}); {} undelivered "
                         "report(s) exist only in memory and are lost", self.path,
                         self._failed, len(self._pending) + len(self._unsynced))
        with self._lock:
            self._fh.close()
