"""What the worker does with the controller's pushes (``state``, ``job``, ``signal``...).

The role's ``push`` runs on the client's event loop and must not block, so it only drops each
push in the role's :class:`PushInbox`; the worker's ``pushes`` thread takes them in order and acts:

- ``state`` (after every join and re-join: the truth): start each job allocated here that is
  active and not yet started (never twice: the journal's claims decide), apply its pending
  signal, and kill jobs this worker runs that the controller no longer lists (requeued or
  ended while the worker was away);
- ``job``: start a newly dispatched job;
- ``signal``: kill/stop/resume the job's process group;
- ``host``, ``shutdown``: logged.

Pushes that arrive before the worker has started (the ``state`` push follows the first join,
before the role's main runs) wait in the inbox.
"""

from __future__ import annotations

import threading
from typing import Any

from loguru import logger

from xce_worker.procman import ProcessManager
from xcecore.bridge import Inbox
from xcecore.protocol import ACTIVE

PushInbox = Inbox[tuple[str, int, Any]]
"""``(event, seq, data)`` from the event loop to the ``pushes`` thread, in order."""


def _hosts(job: dict[str, Any]) -> list[str]:
    return [str(a.get("host")) for a in job.get("alloc") or () if isinstance(a, dict)]


class PushHandler:
    """Turns pushes into process-manager actions for host ``hname``."""

    def __init__(self, hname: str, procman: ProcessManager) -> None:
        self.hname = hname
        self.procman = procman
        self.handled = 0

    def handle(self, event: str, data: Any) -> None:
        """Act on one push; bad data is logged, never raised."""
        if not isinstance(data, dict):
            logger.error("worker {}: push {} carries {!r}, not an object; ignored", self.hname,
                         event, type(data).__name__)
            return
        if event == "state":
            self._state(data)
        elif event == "job":
            self._job(data)
        elif event == "signal":
            self._signal(data)
        elif event == "host":
            logger.debug("worker {}: host record: state {}", self.hname, data.get("state"))
        elif event == "shutdown":
            logger.warning("worker {}: controller {} is shutting down; the client will move to "
                           "the next primary", self.hname, data.get("server"))
        self.handled += 1

    def _state(self, data: dict[str, Any]) -> None:
        jobs = [j for j in data.get("jobs") or () if isinstance(j, dict)]
        logger.info("worker {}: state from {}: {} active job(s) allocated here", self.hname,
                    data.get("server"), len(jobs))
        listed = {(j.get("jobid"), j.get("attempt") or 0) for j in jobs}
        for rj in list(self.procman.running.values()):
            if (rj.jobid, rj.attempt) not in listed:
                logger.warning("worker {}: job {} (attempt {}) runs here but the controller no "
                               "longer lists it (requeued or ended meanwhile); killing it",
                               self.hname, rj.jobid, rj.attempt)
                self.procman.signal(rj.jobid, rj.attempt, "kill")
        for job in jobs:  # one job's bad record must not keep the others from starting
            try:
                self._job(job)
            except Exception:
                logger.opt(exception=True).error("worker {}: job {} of the state push not "
                                                 "handled; going on", self.hname,
                                                 job.get("jobid"))

    def _job(self, job: dict[str, Any]) -> None:
        hosts = _hosts(job)
        if job.get("state") not in ACTIVE or self.hname not in hosts:
            return
        if hosts[0] != self.hname:
            logger.debug("worker {}: job {} runs on its first host {}", self.hname,
                         job.get("jobid"), hosts[0])
            return
        sig = job.get("signal")
        attempt = job.get("attempt") or 0
        if sig == "kill" and isinstance(job.get("jobid"), int):
            self.procman.signal(job["jobid"], attempt, "kill")  # also: killed before start
            return
        started = self.procman.start(job)
        if not started and sig in ("stop", "resume") and isinstance(job.get("jobid"), int):
            self.procman.signal(job["jobid"], attempt, sig)  # re-apply after a missed push

    def _signal(self, data: dict[str, Any]) -> None:
        jobid, name = data.get("jobid"), data.get("signal")
        if not isinstance(jobid, int) or not isinstance(name, str):
            logger.error("worker {}: malformed signal push {!r}; ignored", self.hname, data)
            return
        hosts = data.get("hosts") or []
        if hosts and hosts[0] != self.hname:
            return
        self.procman.signal(jobid, data.get("attempt"), name)

    def run(self, inbox: PushInbox, stop: threading.Event) -> None:
        """The ``pushes`` thread: handle pushes in order until ``stop``."""
        while not stop.is_set():
            item = inbox.get(0.2)
            if item is None:
                continue
            event, seq, data = item
            try:
                self.handle(event, data)
            except Exception:
                logger.opt(exception=True).error("worker {}: handling push {} (seq {}) failed; "
                                                 "going on", self.hname, event, seq)
