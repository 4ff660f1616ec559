"""Delivers the journal's ``notify_job`` notes to the controller, in order, each once.

One thread takes the oldest unacknowledged note and calls ``notify_job`` through the blocking
client facade. That call carries one idempotency key for all its retries, waits through any
reconnect (the client owns recovery; a ``NOT_JOINED`` reply makes it re-join and retry), and
returns once a primary answered. An answer is final: a result or a refusal (CONFLICT for a
report about a requeued attempt, NOT_FOUND, DENIED, INVALID) acknowledges the note, a refusal
with a log line. Only a failure to reach any primary, or an INTERNAL error, keeps the note for
another try. A note delivered just before a crash but not yet acknowledged is sent again after
the restart, which the controller treats as a repeat (see :mod:`xce_worker.spool`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from loguru import logger

from xce_worker.spool import Journal, Note
from xcecore.wire import RemoteError

CallFn = Callable[[str, dict[str, Any]], Any]
FINAL_REFUSALS = frozenset({"CONFLICT", "NOT_FOUND", "DENIED", "INVALID"})


class Notifier:
    """The delivery loop over a :class:`Journal`."""

    def __init__(self, hname: str, journal: Journal, call: CallFn, retry_delay: float = 0.5) -> None:
        self.hname = hname
        self.journal = journal
        self.call = call
        self.retry_delay = retry_delay
        self.delivered = 0
        self.refused = 0

    def deliver(self, note: Note) -> bool:
        """Try one note; True once it is acknowledged (delivered or refused for good)."""
        args = note.args
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
            self.refused += 1
        else:
            self.delivered += 1
            logger.info("worker {}: reported job {} {}{}", self.hname, args.get("jobid"),
                        args.get("event"),
                        f" (exit status {args['exit_status']})" if "exit_status" in args else "")
        self.journal.ack(note.n)
        return True

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop``; undelivered notes stay in the journal for the next start."""
        while not stop.is_set():
            note = self.journal.next_pending(timeout=0.2)
            if note is None:
                continue
            try:
                done = self.deliver(note)
            except Exception as exc:
                if stop.is_set():
                    break
                logger.warning("worker {}: notify_job of job {} not delivered ({}: {}); "
                               "retrying", self.hname, note.args.get("jobid"),
                               type(exc).__name__, exc)
                done = False
            if not done:
                stop.wait(self.retry_delay)
        left = len(self.journal.pending())
        if left:
            logger.info("worker {}: {} job report(s) stay spooled in {} for the next start",
                        self.hname, left, self.journal.path)
