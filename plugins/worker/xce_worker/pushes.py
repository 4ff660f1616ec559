"""What the worker does with the controller's pushes: its host's jobs, their signals.

The worker subscribes to its own host and the active jobs allocated to it (:data:`SUBSCRIPTION`)
and keeps them in a :class:`xcecore.replica.Replica`. The role's ``push`` runs on the client's
event loop and must not block, so it only drops each push in the role's :class:`PushInbox`; the
worker's ``pushes`` thread feeds them, in order, to the replica (which it alone touches) and acts
on what changed:

- a job record (from the sync after every join, or a push): start a job allocated here that is
  active and not yet started (never twice: the journal's claims decide), apply its pending
  signal; report ``alive`` for one the controller shows UNKWN that runs here;
- the end of a sync (``sync_end``: the truth): kill the jobs this worker runs that the
  controller no longer lists (requeued or ended while the worker was away);
- ``signal``: kill/stop/resume the job's process group;
- a job's ``tasks`` (``xce task launch``): :class:`xce_worker.tasks.TaskRunner` starts those
  of this host and kills them when the job ends;
- the host record, ``shutdown``: logged.

Pushes that arrive before the worker has started (the sync follows the first join, before the
role's main runs) wait in the inbox.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

from loguru import logger

from xce_worker.procman import ProcessManager
from xce_worker.tasks import TaskRunner
from xcecore.bridge import Inbox
from xcecore.protocol import ACTIVE
from xcecore.replica import Record, Replica, ReplicaObserver
from xcecore.role import Subscription

PushInbox = Inbox[tuple[str, int, Any]]
"""``(event, seq, data)`` from the event loop to the ``pushes`` thread, in order."""

SUBSCRIPTION = Subscription.of(hosts="own", jobs="host")
"""The worker's own host record, and the active jobs whose allocation includes its host."""


def _hosts(job: dict[str, Any]) -> list[str]:
    return [str(a.get("host")) for a in job.get("alloc") or () if isinstance(a, dict)]


class PushHandler(ReplicaObserver):
    """Turns pushes into process-manager actions for host ``hname``."""

    def __init__(self, hname: str, procman: ProcessManager) -> None:
        self.hname = hname
        self.procman = procman
        self.tasks = TaskRunner(procman)
        self.handled = 0
        self.replica = Replica(SUBSCRIPTION, host=hname, observer=self, name=f"worker {hname}")

    def handle(self, event: str, data: Any) -> None:
        """Act on one push; bad data is logged, never raised."""
        if self.replica.apply(event, data):
            pass  # the replica called back what changed
        elif not isinstance(data, dict):
            logger.error("worker {}: push {} carries {!r}, not an object; ignored", self.hname,
                         event, type(data).__name__)
            return
        elif event == "signal":
            self._signal(data)
        elif event == "shutdown":
            logger.warning("worker {}: controller {} is shutting down; the client will move to "
                           "the next primary", self.hname, data.get("server"))
        self.handled += 1

    # ------------------------------------------------------------------ replica observer
    def changed(self, kind: str, key: Hashable, old: Record | None, new: Record | None) -> None:
        """A job allocated here (new or changed) may need starting or a signal applied."""
        if kind == "hosts" and new is not None:
            logger.debug("worker {}: host record: state {}", self.hname, new.get("state"))
        elif kind == "jobs" and new is None and isinstance(key, int):
            self.tasks.gone(key)  # ended (or requeued away): its tasks here end with it
        elif kind == "jobs" and new is not None:
            try:
                self.tasks.job(new)
                self._job(new)
            except Exception:  # one job's bad record must not keep the others from starting
                logger.opt(exception=True).error("worker {}: job {} not handled; going on",
                                                 self.hname, key)

    def sync_ended(self, mode: str) -> None:
        """The controller's whole view of this host: kill what runs here and is not in it."""
        jobs = self.replica.records("jobs")
        logger.info("worker {}: {} sync: {} active job(s) allocated here", self.hname, mode,
                    len(jobs))
        listed = {(j.get("jobid"), j.get("attempt") or 0) for j in jobs.values()}
        self.tasks.keep_only(listed)
        for rj in list(self.procman.running.values()):
            if (rj.jobid, rj.attempt) not in listed:
                logger.warning("worker {}: job {} (attempt {}) runs here but the controller no "
                               "longer lists it (requeued or ended meanwhile); killing it",
                               self.hname, rj.jobid, rj.attempt)
                self.procman.signal(rj.jobid, rj.attempt, "kill")

    # ------------------------------------------------------------------ actions
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
        if job.get("state") == "UNKWN" and isinstance(job.get("jobid"), int) and \
                self.procman.report_alive(job["jobid"], attempt):
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
        if name in ("stop", "resume"):
            self.tasks.stop_or_resume(jobid, name == "stop")  # its tasks here, any host
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
