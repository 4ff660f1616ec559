"""What the role knows between pushes, and the rows each push produces (no I/O).

:class:`Tracker` holds the view of every job the controller still has (until its
``job_removed``), the last recorded state of each host and member, and the primary last seen.
Each ``on_*`` method takes one push's data and returns a :class:`Batch` to commit; the job
rows come from the pure :func:`xce_accounting.record.observe`. What the store already holds
for jobs first seen after a restart is asked through ``lookup`` (one query per chunk of ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from xce_accounting.record import EventRow, View, observe
from xce_accounting.store import Batch, ClusterEvent
from xcecore.protocol import FINISHED

Lookup = Callable[[Sequence[int]], dict[int, View]]
GAP_RANGES_MAX = 20
"""Ranges of never-seen job ids listed in one ``gap`` cluster event."""


class Tracker:
    """The role's memory of the cluster, fed push by push."""

    def __init__(self, marks: dict[str, Any] | None = None) -> None:
        marks = marks or {}
        self.views: dict[int, View] = {}
        self.users: dict[int, str] = {}
        self.primary: str | None = marks.get("primary")
        self.hosts: dict[str, str] = dict(marks.get("hosts") or {})
        self.members: dict[str, str] = dict(marks.get("members") or {})
        self.max_jobid: int = int(marks.get("max_jobid") or 0)
        self.syncing, self.sync_mode, self.sync_before = False, "snapshot", 0
        self.seen: set[int] = set()
        self.seen_members: set[str] = set()

    # -- jobs -----------------------------------------------------------------------------

    def _observe(self, batch: Batch, prev: View | None, job: dict[str, Any], now: float,
                 synced: bool) -> None:
        out = observe(prev, job, now, synced=synced)
        jobid = job["jobid"]
        if out.view is not None:
            self.views[jobid] = out.view
        self.users[jobid] = job.get("user") or ""
        batch.events.extend(out.events)
        batch.attempts.extend(out.attempts)
        if jobid > self.max_jobid:
            self.max_jobid = jobid
            batch.marks["max_jobid"] = jobid

    def on_job(self, job: dict[str, Any], now: float, lookup: Lookup, *, synced: bool = False) -> Batch:
        """A job's new version: live, or (``synced``) one a sync brought."""
        batch = Batch()
        jobid = job["jobid"]
        if self.syncing:
            self.seen.add(jobid)
        prev = self.views.get(jobid)
        if prev is None and jobid <= self.max_jobid:  # known before a restart, perhaps
            prev = lookup([jobid]).get(jobid)
        self._observe(batch, prev, job, now, synced=synced)
        return batch

    def sync_begin(self, mode: str) -> None:
        """A sync starts (after a join or re-join): what it brings was not seen live."""
        self.syncing, self.sync_mode = True, mode
        self.seen, self.seen_members = set(), set()
        self.sync_before = self.max_jobid

    def sync_end(self, now: float) -> Batch:
        """The sync is complete. After a snapshot, what it did not bring is gone: jobs removed
        while the role was away (a gap if their end was not seen), job ids never seen at all,
        members that left."""
        batch = Batch()
        if not self.syncing:
            return batch
        self.syncing = False
        if self.sync_mode != "snapshot":
            return batch
        for jobid in [j for j in self.views if j not in self.seen]:
            view = self.views.pop(jobid)
            user = self.users.pop(jobid, "")
            if view.state not in FINISHED:
                nv = View(view.attempt, view.state, view.reason, view.hosts, view.start_time, view.seq + 1)
                batch.events.append(EventRow(jobid, nv.seq, nv.attempt, "gap", now, user, {
                    "text": "the controller removed this job while accounting was disconnected; "
                            "its end was not seen"}, nv))
        missing = _missing(self.sync_before, self.max_jobid, self.seen)
        if missing:
            ranges = [f"{a}-{b}" if a != b else str(a) for a, b in missing[:GAP_RANGES_MAX]]
            batch.cluster.append(ClusterEvent(now, "gap", "jobs", {
                "text": "jobs submitted and cleaned while accounting was away were never seen",
                "jobids": ranges, "count": sum(b - a + 1 for a, b in missing)}))
        for identity in [i for i, st in self.members.items() if st == "joined" and i not in self.seen_members]:
            self._member(identity, "", False, now, batch)
        return batch

    def on_sync(self, state: dict[str, Any], now: float, lookup: Lookup) -> Batch:
        """A whole state at once (a snapshot in one piece: tests and tools)."""
        self.sync_begin("snapshot")
        batch = Batch()
        self.on_primary(state.get("server"), now, batch)
        for job in state.get("jobs") or []:
            batch.extend(self.on_job(job, now, lookup, synced=True))
        self.on_hosts(state.get("hosts") or [], now, batch)
        for m in state.get("members") or []:
            batch.extend(self.on_member({**m, "joined": True}, now))
        batch.extend(self.sync_end(now))
        return batch

    def on_removed(self, jobids: Iterable[int], now: float) -> Batch:
        """``job_removed``: forget them (a job removed unfinished gets a gap event)."""
        batch = Batch()
        for jobid in jobids:
            view = self.views.pop(jobid, None)
            user = self.users.pop(jobid, "")
            if view is not None and view.state not in FINISHED:
                nv = View(view.attempt, view.state, view.reason, view.hosts, view.start_time, view.seq + 1)
                batch.events.append(EventRow(jobid, nv.seq, nv.attempt, "gap", now, user, {
                    "text": "the controller removed this job before accounting saw it end"}, nv))
        return batch

    def on_pend_reasons(self, reasons: dict[str, str | None], now: float) -> Batch:
        """Pending reasons changed (a volatile push)."""
        batch = Batch()
        for key, reason in reasons.items():
            jobid = int(key)
            view = self.views.get(jobid)
            if view is None or view.state not in ("PEND", "PSUSP"):
                continue
            job = {"jobid": jobid, "attempt": view.attempt, "state": view.state,
                   "pend_reason": reason, "user": self.users.get(jobid, ""), "alloc": []}
            self._observe(batch, view, job, now, synced=False)
        return batch

    # -- the cluster ------------------------------------------------------------------------

    def on_primary(self, server: Any, now: float, batch: Batch) -> None:
        """The primary a sync came from: a promotion if it is another one."""
        if not isinstance(server, str) or server == self.primary:
            return
        if self.primary is not None:
            batch.cluster.append(ClusterEvent(now, "promotion", server, {"old": self.primary,
                                                                         "new": server}))
        self.primary = server
        batch.marks["primary"] = server

    def on_hosts(self, hosts: Iterable[dict[str, Any]], now: float, batch: Batch) -> None:
        """Hosts' states (``ok``, ``closed``, ``unavail``): an event for each change."""
        changed = False
        for h in hosts:
            name, state = h.get("name"), h.get("state")
            if not isinstance(name, str) or not isinstance(state, str) or self.hosts.get(name) == state:
                continue
            detail: dict[str, Any] = {"state": state, "old": self.hosts.get(name)}
            if h.get("comment"):
                detail["comment"] = h["comment"]
            batch.cluster.append(ClusterEvent(now, "host", name, detail))
            self.hosts[name] = state
            changed = True
        if changed:
            batch.marks["hosts"] = dict(self.hosts)

    def on_member(self, data: dict[str, Any], now: float) -> Batch:
        """A member joined or left."""
        batch = Batch()
        self._member(str(data.get("identity")), str(data.get("role") or ""), bool(data.get("joined")),
                     now, batch)
        return batch

    def _member(self, identity: str, role: str, joined: bool, now: float, batch: Batch) -> None:
        if joined and self.syncing:
            self.seen_members.add(identity)
        state = "joined" if joined else "left"
        if self.members.get(identity, "left") == state:
            return
        self.members[identity] = state
        batch.cluster.append(ClusterEvent(now, "member", identity, {"joined": joined, "role": role}))
        batch.marks["members"] = dict(self.members)


def _missing(before: int, after: int, seen: set[int]) -> list[tuple[int, int]]:
    """Ranges of ids in (before, after] not in ``seen``: jobs submitted and removed unseen."""
    out: list[tuple[int, int]] = []
    start = None
    for jobid in range(before + 1, after + 1):
        if jobid in seen:
            if start is not None:
                out.append((start, jobid - 1))
                start = None
        elif start is None:
            start = jobid
    if start is not None:
        out.append((start, after))
    return out
