"""The API server's in-memory view of the cluster, fed only by the controller's pushes.

``state`` (the first push after every join or re-join) replaces everything; the other events
update one record. Nothing here ever asks the controller: reads are served from this view.
Every change bumps ``version`` (and ``hosts_version`` for host/resval changes, and
``resources_version`` for the resource definitions) so derived views can be cached.
"""

from __future__ import annotations

import threading
from typing import Any

from loguru import logger


def _queue_order(queue: dict[str, Any]) -> tuple[int, str]:
    return (-int(queue.get("priority") or 0), str(queue.get("name")))


class Store:
    """Cluster config, resources, queues, hosts, jobs, members and resource values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ready = False
        self.server: str | None = None
        self.cluster: dict[str, Any] = {}
        self.resources: list[dict[str, Any]] = []
        self.queues: dict[str, dict[str, Any]] = {}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.jobs: dict[int, dict[str, Any]] = {}
        self.members: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.hosts_version = 0
        self.resources_version = 0
        self.pushes = 0

    # ------------------------------------------------------------------ pushes
    def apply(self, event: str, data: Any) -> None:
        """Apply one push; unknown events and malformed data are logged and ignored."""
        handler = _HANDLERS.get(event)
        if handler is None:
            logger.debug("apiserver: ignoring push {!r}", event)
            return
        try:
            with self._lock:
                handler(self, data)
                self.version += 1
                self.pushes += 1
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            logger.warning("apiserver: malformed {!r} push ignored: {}: {}",
                           event, type(exc).__name__, exc)

    def _state(self, data: dict[str, Any]) -> None:
        # Build everything first so a malformed state changes nothing.
        cluster = dict(data.get("cluster") or {})
        resources = data.get("resources")
        resources = list(cluster.get("resources") or [] if resources is None else resources)
        queues = {q["name"]: q for q in sorted(data.get("queues") or [], key=_queue_order)}
        hosts = {h["name"]: h for h in data.get("hosts") or []}
        jobs = {int(j["jobid"]): j for j in data.get("jobs") or []}
        members = {m["identity"]: m for m in data.get("members") or []}
        self.server = data.get("server")
        self.cluster, self.resources, self.queues = cluster, resources, queues
        self.hosts, self.jobs, self.members = hosts, jobs, members
        self.hosts_version += 1
        self.resources_version += 1
        self.ready = True

    def _job(self, data: dict[str, Any]) -> None:
        self.jobs[int(data["jobid"])] = data

    def _job_removed(self, data: dict[str, Any]) -> None:
        # The controller purged finished jobs (its clean_period): they are gone for good.
        for jobid in [int(j) for j in data["jobids"]]:
            self.jobs.pop(jobid, None)

    def _host(self, data: dict[str, Any]) -> None:
        self.hosts[data["name"]] = data
        self.hosts_version += 1

    def _queue(self, data: dict[str, Any]) -> None:
        self.queues[data["name"]] = data
        self.queues = dict(sorted(self.queues.items(), key=lambda kv: _queue_order(kv[1])))

    def _resvals(self, data: dict[str, Any]) -> None:
        host = self.hosts.get(data["host"])
        if host is not None:
            self.hosts[data["host"]] = {**host, "resvals": dict(data.get("values") or {})}
            self.hosts_version += 1

    def _jusage(self, data: dict[str, Any]) -> None:
        jobid = int(data["jobid"])
        job = self.jobs.get(jobid)
        if job is not None:
            self.jobs[jobid] = {**job, "usage": dict(data.get("usage") or {})}

    def _pend_reasons(self, data: dict[str, Any]) -> None:
        for key, reason in (data.get("reasons") or {}).items():
            job = self.jobs.get(int(key))
            if job is not None:
                self.jobs[int(key)] = {**job, "pend_reason": reason}

    def _member(self, data: dict[str, Any]) -> None:
        if data.get("joined", True):
            self.members[data["identity"]] = {k: v for k, v in data.items() if k != "joined"}
        else:
            self.members.pop(data["identity"], None)

    def _signal(self, data: dict[str, Any]) -> None:
        jobid = int(data["jobid"])
        job = self.jobs.get(jobid)
        if job is not None:
            self.jobs[jobid] = {**job, "signal": data.get("signal")}

    def _shutdown(self, data: dict[str, Any]) -> None:
        logger.info("apiserver: controller {} is shutting down; the client will reconnect",
                    (data or {}).get("server"))

    # ------------------------------------------------------------------ reads
    def snapshot_jobs(self) -> list[dict[str, Any]]:
        """Every job record, in job id order."""
        with self._lock:
            jobs = self.jobs
            return [jobs[k] for k in sorted(jobs)]

    def get_job(self, jobid: int) -> dict[str, Any] | None:
        """One job record, or None."""
        return self.jobs.get(jobid)

    def snapshot_hosts(self) -> tuple[int, list[dict[str, Any]]]:
        """(hosts_version, every host record by name)."""
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


_HANDLERS = {
    "state": Store._state,
    "job": Store._job,
    "job_removed": Store._job_removed,
    "host": Store._host,
    "queue": Store._queue,
    "resvals": Store._resvals,
    "jusage": Store._jusage,
    "pend_reasons": Store._pend_reasons,
    "member": Store._member,
    "signal": Store._signal,
    "shutdown": Store._shutdown,
}
