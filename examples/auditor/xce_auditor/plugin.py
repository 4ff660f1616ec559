"""The auditor role: joins as ``auditor``, hears every job change, appends it to a log.

This is the whole of a third-party role: a role object and two hooks. Connecting to the
primary through the candidate list, following redirects, re-connecting after a failover and
re-joining are the core's work: the role has no reconnect code at all. It subscribes to jobs
only and keeps them in an :class:`xcecore.replica.Replica`, which applies the state sync after
each (re-)join -- a snapshot, or only what changed while it was away -- and tells the auditor
of each change; the auditor compares it with what it last logged, so every change is logged
once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field
from xcecore.replica import Record, Replica, ReplicaObserver
from xcecore.role import Handled, Role, RoleContext, RoleSpec, Subscription

ROLE = "auditor"


class Ledger:
    """The last state seen of each job, and the append-only log of changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[int, str] = {}
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # a restarted auditor does not log again what it logged before
            for line in path.read_text().splitlines():
                rec = orjson.loads(line)
                self.seen[rec["jobid"]] = rec["state"]

    def observe(self, jobs: Iterable[dict[str, Any]]) -> int:
        """Log each job whose state differs from the last one seen; how many were logged."""
        lines = []
        with self._lock:
            for job in jobs:
                if self.seen.get(job["jobid"]) != job["state"]:
                    self.seen[job["jobid"]] = job["state"]
                    lines.append(orjson.dumps({"time": time.time(), "jobid": job["jobid"], "state": job["state"],
                                               "user": job["user"], "queue": job["queue"]}))
            if lines:
                with self.path.open("ab") as fh:
                    fh.write(b"\n".join(lines) + b"\n")
        return len(lines)


class AuditorRole(Role, ReplicaObserver):
    """Logs job state changes; ``main`` is the base class's: serve pushes until stopped."""

    subscription = Subscription.of(jobs="all")

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.log_file = Path(ctx.section["log_file"]).resolve()
        self._ledger: Ledger | None = None  # opened at the first push: building the role does no I/O
        self.replica = Replica(self.subscription, observer=self, name=ctx.identity)

    @property
    def ledger(self) -> Ledger:
        """The ledger, read from the log file on first use."""
        if self._ledger is None:
            self._ledger = Ledger(self.log_file)
        return self._ledger

    def join_attributes(self) -> dict[str, Any]:
        """The auditor joins with its log file's path, for operators reading ``status``."""
        return {"log_file": str(self.log_file)}

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """Feed the replica: the sync after each join, then each change."""
        self.replica.apply(event, data)
        return None

    def changed(self, kind: str, key: Any, old: Record | None, new: Record | None) -> None:
        """The replica's observer: log a job whose state changed."""
        if new is not None:
            self.ledger.observe([new])


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The auditor role."""
    return [RoleSpec(ROLE, AuditorRole, "append-only JSON-lines log of every job state change")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """``[auditor] log_file``."""
    return [ConfigSection(ROLE, {"log_file": Field((str,), "xce-audit.jsonl", "where to append"),
                                 "hname": Field((str,), None, "host name in the identity")})]
