"""The API server's view of the cluster, fed only by the controller's pushes.

Every push goes to a :class:`xcecore.replica.Replica` of everything (the sync after each join,
then the changes); as its observer, :class:`Store` keeps what the routes read: queues by
priority, hosts with their latest load values, the members, and the jobs with indexes for
paging (:class:`JobIndex`). Nothing here asks the controller: reads are served from this view.
Every change bumps ``version`` (and ``hosts_version`` for host/resval changes, and
``resources_version`` for the resource definitions) so derived views can be cached.

The replica and the job index are changed and read on the event loop only (pushes and the
async routes run there, and a page is computed without awaiting: it is a consistent read);
host, queue and resource snapshots are taken under a lock, because host selection runs on a
thread.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from loguru import logger
from sortedcontainers import SortedList

from xce_apiserver.revocations import RevocationList
from xce_apiserver.stream import ChangeHub
from xcecore.protocol import pend_reason
from xcecore.replica import CLUSTER_KEY, Record, Replica, ReplicaObserver
from xcecore.role import ALL_PUSHES

SCAN_BUDGET = 20_000
"""Jobs one page may look at before it returns short (with a cursor to go on): a filter that
matches one job in a million costs every request the same bounded work."""


def _queue_order(queue: dict[str, Any]) -> tuple[int, str]:
    return (-int(queue.get("priority") or 0), str(queue.get("name")))


class Page:
    """One page of jobs: the records, and the cursor after them (None: nothing more)."""

    __slots__ = ("jobs", "next", "scanned")

    def __init__(self, jobs: list[Record], next_after: int | None, scanned: int) -> None:
        self.jobs = jobs
        self.next = next_after
        self.scanned = scanned


def _key(rec: Record, name: str) -> Any:
    """What ``rec`` is indexed by under ``name`` (``array``: the array an element is of)."""
    if name == "array":
        a = rec.get("array")
        return a.get("of") if isinstance(a, dict) else None
    return rec.get(name)


class JobIndex:
    """Job ids in order, overall and per state, owner, queue and array (sorted lists; an
    array's are its element records, plain jobs are in none).

    Paging goes in job id order from a cursor (the last id a page looked at), so a page is a
    range of the smallest index the filters name, checked against the other filters: a job
    that matches throughout a listing appears in exactly one page, whatever changes meanwhile.
    """

    FIELDS = ("state", "user", "queue", "array")

    def __init__(self) -> None:
        self.ids: Any = SortedList()
        self.by: dict[str, dict[Any, Any]] = {f: {} for f in self.FIELDS}

    def __len__(self) -> int:
        return len(self.ids)

    def clear(self) -> None:
        self.ids = SortedList()
        self.by = {f: {} for f in self.FIELDS}

    def put(self, jobid: int, old: Record | None, new: Record) -> None:
        """Index ``new`` (replacing ``old``, if the job was indexed)."""
        if old is None:
            self.ids.add(jobid)
        for name in self.FIELDS:
            value = _key(new, name)
            if old is not None:
                before = _key(old, name)
                if before == value:
                    continue
                self._drop(name, before, jobid)
            if value is None and name == "array":
                continue
            index = self.by[name].get(value)
            if index is None:
                index = self.by[name][value] = SortedList()
            index.add(jobid)

    def remove(self, jobid: int, old: Record) -> None:
        """Forget a job that was indexed with record ``old``."""
        self.ids.discard(jobid)
        for name in self.FIELDS:
            self._drop(name, _key(old, name), jobid)

    def _drop(self, name: str, value: Any, jobid: int) -> None:
        index = self.by[name].get(value)
        if index is not None:
            index.discard(jobid)
            if not index:
                del self.by[name][value]

    def candidates(self, after: int, states: Iterable[str] | None, user: str | None,
                   queue: str | None, array: int | None = None) -> Iterator[int]:
        """Job ids above ``after``, in order, from the smallest index the filters name (the
        caller still checks every filter on the record)."""
        choices: list[tuple[int, list[Any]]] = []
        if states is not None:
            lists = [self.by["state"].get(s) for s in states]
            found = [sl for sl in lists if sl is not None]
            choices.append((sum(len(sl) for sl in found), found))
        for name, value in (("user", user), ("queue", queue), ("array", array)):
            if value is not None:
                sl = self.by[name].get(value)
                choices.append((0 if sl is None else len(sl), [] if sl is None else [sl]))
        if not choices:
            return iter(self.ids.irange(minimum=after, inclusive=(False, True)))
        _, lists = min(choices, key=lambda c: c[0])
        ranges = [sl.irange(minimum=after, inclusive=(False, True)) for sl in lists]
        if len(ranges) == 1:
            return iter(ranges[0])
        return heapq.merge(*ranges)


class Store(ReplicaObserver):
    """Cluster config, resources, queues, hosts, jobs, members and resource values."""

    def __init__(self, name: str = "apiserver") -> None:
        self.replica = Replica(ALL_PUSHES, observer=self, name=name)
        self.revocations = RevocationList(self.replica)  # revoked tokens, for every request
        self._lock = threading.Lock()
        self.server: str | None = None
        self.cluster: dict[str, Any] = {}
        self.resources: list[dict[str, Any]] = []
        self.queues: dict[str, dict[str, Any]] = {}
        self.hosts: dict[str, dict[str, Any]] = {}  # host records with their latest load values
        self.members: dict[str, dict[str, Any]] = {}
        self.index = JobIndex()
        self.version = 0
        self.hosts_version = 0
        self.resources_version = 0
        self.pushes = 0
        self.hub = ChangeHub()  # the live event streams (GET /xce/v1/stream), told every change

    def joined(self, server: str) -> None:
        """The replica is (again) fed by controller ``server`` (a join or a re-join)."""
        self.server = server
        self.hub.joined(server)

    # ------------------------------------------------------------------ feeding
    @property
    def ready(self) -> bool:
        """A sync has completed and no snapshot is streaming: the view is whole."""
        rep = self.replica
        return rep.syncs > 0 and not (rep.syncing and rep.mode == "snapshot")

    @property
    def syncing(self) -> bool:
        """A sync is streaming."""
        return self.replica.syncing

    def apply(self, event: str, data: Any) -> bool:
        """Feed one push (on the event loop); False for pushes that carry no records."""
        self.pushes += 1
        handled = self.replica.apply(event, data)
        if not handled and event == "shutdown":
            logger.info("apiserver: controller {} is shutting down; the client will reconnect",
                        (data or {}).get("server") if isinstance(data, dict) else None)
        return handled

    def sync_begun(self, mode: str, kinds: frozenset[str]) -> None:
        self.revocations.sync_begun(mode, kinds)
        with self._lock:
            if "jobs" in kinds:
                self.index.clear()
            if "queues" in kinds:
                self.queues = {}
            if "hosts" in kinds or "resvals" in kinds:
                self._rebuild_hosts()
            if "members" in kinds:
                self.members = {}
            if "cluster" in kinds:
                self.cluster, self.resources = {}, []
                self.resources_version += 1
            self.version += 1

    def sync_ended(self, mode: str) -> None:
        if mode == "snapshot":
            self.hub.replaced(f"snapshot sync from {self.server}")
        self.revocations.sync_ended()
        counts = {k: self.replica.count(k) for k in ("jobs", "hosts", "queues", "revocations")}
        logger.info("apiserver: {} sync from {} complete: {} jobs, {} hosts, {} queues, {} "
                    "revoked tokens; serving it", mode, self.server, counts["jobs"],
                    counts["hosts"], counts["queues"], counts["revocations"])

    def changed(self, kind: str, key: Hashable, old: Record | None, new: Record | None) -> None:
        rep = self.replica
        if not (rep.syncing and rep.mode == "snapshot"):  # a snapshot ends in one resync instead
            self.hub.changed(kind, key)
        if kind == "jobs":
            assert isinstance(key, int)
            if new is None:
                if old is not None:
                    self.index.remove(key, old)
            else:
                self.index.put(key, old, new)
            self.version += 1
            return
        if kind == "revocations":  # read by every request's token check, not by the views
            self.revocations.changed(key, new)
            return
        with self._lock:
            self.version += 1
            if kind in ("hosts", "resvals"):
                self._host(str(key))
            elif kind == "queues":
                if new is None:
                    self.queues.pop(str(key), None)
                else:
                    self.queues[str(key)] = new
                self.queues = dict(sorted(self.queues.items(), key=lambda kv: _queue_order(kv[1])))
            elif kind == "members":
                if new is None:
                    self.members.pop(str(key), None)
                else:
                    self.members[str(key)] = new
            elif kind == "cluster" and key == CLUSTER_KEY:
                self.cluster = dict(new or {})
                self.resources = list(self.cluster.get("resources") or [])
                self.resources_version += 1

    def _host(self, name: str) -> None:
        host = self.replica.get("hosts", name)
        if host is None:
            self.hosts.pop(name, None)
        else:
            values = self.replica.get("resvals", name)
            self.hosts[name] = host if values is None else {**host, "resvals": values.get("values") or {}}
        self.hosts_version += 1

    def _rebuild_hosts(self) -> None:
        self.hosts = {}
        for name in self.replica.records("hosts"):
            self._host(str(name))
        self.hosts_version += 1

    # ------------------------------------------------------------------ reads
    def get_job(self, jobid: int) -> dict[str, Any] | None:
        """One job as the REST API shows it (its record with the latest pend reason and
        usage), or None."""
        job = self.replica.get("jobs", jobid)
        return None if job is None else self.view(jobid, job)

    def view(self, jobid: int, job: Record) -> Record:
        """``job`` with its volatile values (pend reason, usage) as last pushed."""
        reason = self.replica.get("pend_reasons", jobid)
        usage = self.replica.get("jusage", jobid)
        parked = job.get("state") == "PEND" and not self._queue_active(job.get("queue"))
        if reason is None and usage is None and not parked:
            return job
        out = dict(job)
        if reason is not None:
            out["pend_reason"] = reason.get("reason")
        if parked:  # derived from the queue (xcecore.protocol.pend_reason), never pushed
            out["pend_reason"] = pend_reason(job.get("state"), out.get("pend_reason"), False)
        if usage is not None:
            out["usage"] = dict(usage.get("usage") or {})
        return out

    def _queue_active(self, name: Any) -> bool:
        """Whether queue ``name`` dispatches (an unknown queue: as if it did)."""
        queue = self.replica.get("queues", name) if isinstance(name, str) else None
        return queue is None or bool(queue.get("active", True))

    def page_jobs(self, *, after: int = 0, limit: int = 100, states: Iterable[str] | None = None,
                  user: str | None = None, queue: str | None = None,
                  array: int | None = None, budget: int = SCAN_BUDGET) -> Page:
        """Up to ``limit`` jobs with ids above ``after`` that match every filter, in id order.

        At most ``budget`` jobs are looked at: a page can come back short with a cursor to go
        on. ``next`` is None once nothing matching is left.
        """
        wanted = None if states is None else frozenset(states)
        held = self.replica.records("jobs")
        found: list[Record] = []
        scanned = 0
        last = after
        for jobid in self.index.candidates(after, wanted, user, queue, array):
            if len(found) >= limit or scanned >= budget:
                return Page(found, last, scanned)
            scanned += 1
            last = jobid
            job = held.get(jobid)
            if job is None:
                continue
            if (wanted is not None and job.get("state") not in wanted) or \
                    (user is not None and job.get("user") != user) or \
                    (queue is not None and job.get("queue") != queue) or \
                    (array is not None and _key(job, "array") != array):
                continue
            found.append(self.view(jobid, job))
        return Page(found, None, scanned)

    def snapshot_hosts(self) -> tuple[int, list[dict[str, Any]]]:
        """(hosts_version, every host record by name, with its latest load values)."""
        with self._lock:
            return self.hosts_version, [self.hosts[k] for k in sorted(self.hosts)]

    def snapshot_queues(self) -> list[dict[str, Any]]:
        """Every queue record, highest priority first."""
        with self._lock:
            return list(self.queues.values())

    def site_resources(self) -> tuple[int, list[dict[str, Any]]]:
        """(resources_version, the site resource definitions)."""
        with self._lock:
            return self.resources_version, list(self.resources)
