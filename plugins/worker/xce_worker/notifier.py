"""Delivers the journal's ``notify_job`` notes to the controller, each once, each job's in order.

Delivery threads ("lanes", ``lanes`` of them) each take a note from the journal
(:meth:`Journal.take <xce_worker.spool.Journal.take>`: the oldest one nobody is delivering
whose job has no older note waiting) and call ``notify_job`` through the blocking client
facade. So reports of different jobs are in flight together (the controller commits them in
one group), while a job's own reports (``start`` before ``finish``) stay in order: one
``notify_job`` round trip per report instead of a queue of them behind each other. With one
lane every note goes in journal order.

A call carries one idempotency key for all its retries, waits through any reconnect (the
client owns recovery; a ``NOT_JOINED`` reply makes it re-join and retry), and returns once a
primary answered. An answer is final: a result or a refusal (CONFLICT for a report about a
requeued attempt, NOT_FOUND, DENIED, INVALID) acknowledges the note, a refusal with a log
line. Only a failure to reach any primary, or an INTERNAL error, keeps the note for another
try. A note delivered just before a crash but not yet acknowledged is sent again after the
restart, which the controller treats as a repeat (see :mod:`xce_worker.spool`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from xce_worker.spool import Journal, Note
from xcecore.wire import RemoteError

CallFn = Callable[[str, dict[str, Any]], Any]
FINAL_REFUSALS = frozenset({"CONFLICT", "NOT_FOUND", "DENIED", "INVALID"})


class Notifier:
    """The delivery lanes over a :class:`Journal`."""

    def __init__(self, hname: str, journal: Journal, call: CallFn, retry_delay: float = 0.5,
                 lanes: int = 1) -> None:
        self.hname = hname
        self.journal = journal
        self.call = call
        self.retry_delay = retry_delay
        self.lanes = max(1, lanes)
        self._count_lock = threading.Lock()
        self.delivered = 0
        self.refused = 0

    def deliver(self, note: Note) -> bool:
        """Try one note; True once it is acknowledged (delivered or refused for good)."""
        args = note.args
        started = time.perf_counter()
        try:
            self.call("notify_job", args)
        except RemoteError as exc:
            if exc.code not in FINAL_REFUSALS:
                logger.warning("worker {}: notify_job {} of job {} failed ({}); retrying",
                               self.hname, args.get("event"), args.get("jobid"), exc)
                return False
            logger.warning("worker {}: controller refused notify_job {} of job {} (attempt "
                           "{}): {}; dropped", self.hname, args.get("event"), args.get("jobid"),
                           args.get("attempt"), exc)
            with self._count_lock:
                self.refused += 1
        else:
            with self._count_lock:
                self.delivered += 1
            logger.info("worker {}: reported job {} {}{} in {:.1f} ms", self.hname,
                        args.get("jobid"), args.get("event"),
                        f" (exit status {args['exit_status']})" if "exit_status" in args else "",
                        (time.perf_counter() - started) * 1e3)
        self.journal.ack(note.n)
        return True

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` on ``lanes`` threads (this one included); undelivered notes
        stay in the journal for the next start."""
        others = [threading.Thread(target=self._lane, args=(stop,), daemon=True,
                                   name=f"xce-notify-{i}") for i in range(1, self.lanes)]
        for t in others:
            t.start()
        self._lane(stop)
        for t in others:
            t.join()
        left = len(self.journal.pending())
        if left:
            logger.info("worker {}: {} job report(s) stay spooled in {} for the next start",
                        self.hname, left, self.journal.path)

    def _lane(self, stop: threading.Event) -> None:
        while not stop.is_set():
            note = self.journal.take(timeout=0.2)
            if note is None:
                continue
            try:
                done = self.deliver(note)
            except Exception as exc:
                done = False
                if not stop.is_set():
                    logger.warning("worker {}: notify_job of job {} not delivered ({}: {}); "
                                   "retrying", self.hname, note.args.get("jobid"),
                                   type(exc).__name__, exc)
            if not done:
                self.journal.release(note.n)
                stop.wait(self.retry_delay)
