"""The worker's durable journal: which jobs it started, and what it still has to report.

One append-only file, ``<state_dir>/journal.jsonl``, one JSON object per line, each append
flushed and fsynced before the caller goes on:

- ``{"k": "claim", "job": J, "att": A}`` before job J's attempt A is started: a job whose
  attempt was claimed is never started again, also not after a worker restart;
- ``{"k": "run", "job": J, "att": A, "pid": P, "ct": create_time, "status": path}`` once its
  process runs, so a restarted worker can find it again;
- ``{"k": "note", "n": N, "args": {...}}`` a ``notify_job`` to deliver, in order of N; a
  ``finish`` or ``fail`` note also ends the job's attempt;
- ``{"k": "ack", "n": N}`` once the controller answered note N.

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
        self.jobs: dict[JobKey, JobEntry] = {}
        self._pending: OrderedDict[int, Note] = OrderedDict()
        self._next_n = 1
        self._dead_lines = 0
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
    def _append(self, rec: dict[str, Any]) -> None:
        # Caller holds the lock. One write + fsync per record: it is durable on return.
        self._fh.write(orjson.dumps(rec) + b"\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def claim(self, jobid: int, attempt: int) -> bool:
        """Claim ``jobid``'s ``attempt`` before starting it; False if it was ever claimed."""
        with self._lock:
            if (jobid, attempt) in self.jobs:
                return False
            self._append({"k": "claim", "job": jobid, "att": attempt})
            self.jobs[(jobid, attempt)] = JobEntry(jobid, attempt)
            return True

    def record_run(self, jobid: int, attempt: int, pid: int, create_time: float | None,
                   status_file: str | None) -> None:
        """Record the process a claimed attempt runs as."""
        with self._lock:
            self._append({"k": "run", "job": jobid, "att": attempt, "pid": pid,
                          "ct": create_time, "status": status_file})
            entry = self.jobs.setdefault((jobid, attempt), JobEntry(jobid, attempt))
            entry.pid, entry.create_time, entry.status_file = pid, create_time, status_file

    def notify(self, args: dict[str, Any]) -> int:
        """Spool one ``notify_job`` (durable on return); its sequence number."""
        with self._cond:
            n = self._next_n
            self._next_n += 1
            self._append({"k": "note", "n": n, "args": args})
            self._pending[n] = Note(n, args)
            self._end(args)
            self._cond.notify_all()
            return n

    def ack(self, n: int) -> None:
        """Note ``n`` was answered by the controller; it is never sent again."""
        with self._cond:
            if self._pending.pop(n, None) is None:
                return
            self._append({"k": "ack", "n": n})
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
        pending_ends = {(n.args["jobid"], n.args.get("attempt", 0))
                        for n in self._pending.values() if n.args.get("event") in ENDING}
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
                  for n in self._pending.values()]
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

    def close(self) -> None:
        """Close the file; the journal is not usable afterwards."""
        with self._lock:
            self._fh.close()
