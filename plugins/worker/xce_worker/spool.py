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
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

JobKey = tuple[int, int]  # (jobid, attempt)
ENDING = frozenset({"finish", "fail"})


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
        path.parent.mkdir(parents=True, exist_ok=True)
        self._replay()
        self._fh = open(path, "ab")  # held for the journal's life

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
        """Write ``recs`` (one write; caller holds the lock); the number to :meth:`_sync` to."""
        self._fh.write(b"".join(orjson.dumps(rec) + b"\n" for rec in recs))
        self._fh.flush()
        self._written += 1
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
                if self._fh.closed:
                    return  # closed while stopping; nothing more can be made durable
                target = self._written
                fd = os.dup(self._fh.fileno())  # survives a compaction swapping the file
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._synced = max(self._synced, target)

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
            self._publish(n)
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
            if self._dead_lines >= self.COMPACT_AFTER:
                self._compact()
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
        with open(tmp, "wb") as fh:
            fh.write(b"".join(line + b"\n" for line in lines))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._fh.close()
        self._fh = open(self.path, "ab")
        self._dead_lines = 0
        self._synced = self._written  # the new file holds every record, fsynced

    def close(self) -> None:
        """Close the file; the journal is not usable afterwards."""
        with self._lock:
            self._fh.close()
