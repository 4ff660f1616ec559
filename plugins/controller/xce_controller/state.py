"""The cluster state in memory, and the transitions that change it.

Every transition checks everything first and raises :class:`~xcecore.wire.RemoteError` before
touching anything, so a refused request never changes state. A successful one mutates the
state and returns :class:`Changes`: the rows to commit, the events to push, and the result.
No I/O happens here: the server commits the rows and fans the events out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from xce_controller.settings import ClusterConf as ClusterConf  # the state's config; re-exported
from xce_controller.store import Loaded
from xcecore.jobspec import ExitReason, describe_exit
from xcecore.protocol import ACTIVE, FINISHED
from xcecore.wire import ErrorCode, RemoteError

SUBMIT_LIMITS = ("mem_limit", "run_limit", "stdout", "stderr", "stdin", "exclusive")

Record = dict[str, Any]
# (table, key, record or None to delete); a ``meta`` row's value is any JSON value.
Row = tuple[str, Any, Record | int | float | str | None]


@dataclass(slots=True)
class Event:
    """A push to fan out: non-worker members get every event; workers only ``hosts``'s."""

    name: str
    data: Any
    hosts: frozenset[str] = frozenset()
    workers_only_hosts: bool = True  # False: every worker gets it too (shutdown)


@dataclass(slots=True)
class Changes:
    """What a transition did: rows to commit, events to push, the op's result."""

    result: Any = None
    rows: list[Row] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    after: Callable[[], None] | None = None  # run by the server once the reply is queued


def conflict(message: str) -> RemoteError:
    return RemoteError(ErrorCode.CONFLICT, message)


def not_found(what: str, name: Any) -> RemoteError:
    return RemoteError(ErrorCode.NOT_FOUND, f"no such {what}: {name}", {"what": what, "name": name})


def queue_record(cfg: dict[str, Any]) -> Record:
    """A queue record from its config table."""
    q: Record = {
        "name": cfg["name"],
        "priority": int(cfg.get("priority", 30)),
        "description": str(cfg.get("description", "")),
        "open": bool(cfg.get("open", True)),
        "active": bool(cfg.get("active", True)),
    }
    return _queue_status(q)


def _queue_status(q: Record) -> Record:
    q["status"] = ("Open" if q["open"] else "Closed") + ":" + ("Active" if q["active"] else "Inact")
    return q


def _host_state(h: Record) -> Record:
    h["state"] = "unavail" if not h["available"] else "closed" if h["closed"] else "ok"
    return h


class ClusterState:
    """Jobs, hosts, queues and members of one primary."""

    def __init__(self, conf: ClusterConf) -> None:
        self.conf = conf
        self.jobs: dict[int, Record] = {}
        self.hosts: dict[str, Record] = {}
        self.queues: dict[str, Record] = {}
        self.members: dict[str, Record] = {}
        self.last_seen: dict[str, float] = {}  # host -> last worker heartbeat/join
        # host -> ids of the jobs running there: a worker's (re-)join state is built from its
        # own jobs, not a scan of every job (10,000 workers re-joining x 50,000 jobs otherwise)
        self.active_on: dict[str, set[int]] = {}
        self.next_jobid = 1
        for qcfg in conf.queues:
            self.queues[qcfg["name"]] = queue_record(qcfg)

    # -- loading -----------------------------------------------------------------------------

    def load(self, loaded: Loaded, now: float) -> None:
        """Take over the durable state; queue runtime state (open/active) survives restarts,
        priorities and descriptions come from the configuration."""
        self.jobs = dict(loaded.jobs)
        self.hosts = dict(loaded.hosts)
        for name, stored in loaded.queues.items():
            q = self.queues.get(name)
            if q is None:
                self.queues[name] = stored  # a queue removed from config keeps its jobs' home
            else:
                q["open"], q["active"] = bool(stored["open"]), bool(stored["active"])
                _queue_status(q)
        self.next_jobid = max(int(loaded.meta.get("next_jobid", 1)), max(self.jobs, default=0) + 1)
        used: dict[str, int] = {}
        self.active_on = {}
        for job in self.jobs.values():
            if job["state"] in ACTIVE:
                for a in job["alloc"]:
                    used[a["host"]] = used.get(a["host"], 0) + a["ntasks"]
                    self.active_on.setdefault(a["host"], set()).add(job["jobid"])
        for name, host in self.hosts.items():
            host["used_slots"] = used.get(name, 0)
            self.last_seen[name] = now  # every worker gets a full timeout to re-join

    # -- views ------------------------------------------------------------------------------

    def clusterconf(self) -> Record:
        c = self.conf
        return {
            "name": c.name,
            "resources": c.resources,
            "admins": sorted(c.admins),
            "default_queue": c.default_queue,
            "host_timeout": c.host_timeout,
            "host_groups": c.host_groups,
            "user_groups": c.user_groups,
            "queues": [q["name"] for q in self.sorted_queues()],
        }

    def sorted_queues(self) -> list[Record]:
        return sorted(self.queues.values(), key=lambda q: (-q["priority"], q["name"]))

    def full_state(self, server: str, worker_host: str | None = None) -> Record:
        """The ``state`` push; a worker's view holds only its host and its active jobs."""
        if worker_host is None:
            hosts = [self.hosts[n] for n in sorted(self.hosts)]
            jobs = list(self.jobs.values())
            members = list(self.members.values())
        else:
            hosts = [self.hosts[worker_host]] if worker_host in self.hosts else []
            jobs = [
                j for jobid in sorted(self.active_on.get(worker_host, ()))
                if (j := self.jobs.get(jobid)) is not None and j["state"] in ACTIVE
                and any(a["host"] == worker_host for a in j["alloc"])
            ]
            members = []
        return {
            "server": server,
            "cluster": self.clusterconf(),
            "resources": self.conf.resources,
            "queues": self.sorted_queues(),
            "hosts": hosts,
            "jobs": jobs,
            "members": members,
        }

    def job(self, jobid: int) -> Record:
        job = self.jobs.get(jobid)
        if job is None:
            raise not_found("job", jobid)
        return job

    def host(self, name: str) -> Record:
        host = self.hosts.get(name)
        if host is None:
            raise not_found("host", name)
        return host

    def queue(self, name: str) -> Record:
        q = self.queues.get(name)
        if q is None:
            raise not_found("queue", name)
        return q

    def is_admin(self, role: str, user: str | None) -> bool:
        return role == "admin" or (user is not None and user in self.conf.admins)

    # -- helpers for transitions -------------------------------------------------------------

    def _job_changed(self, ch: Changes, job: Record, extra_hosts: Iterable[str] = ()) -> None:
        hosts = frozenset(a["host"] for a in job["alloc"]) | frozenset(extra_hosts)
        ch.rows.append(("jobs", job["jobid"], job))
        ch.events.append(Event("job", job, hosts))

    def _host_changed(self, ch: Changes, host: Record) -> None:
        ch.rows.append(("hosts", host["name"], host))
        ch.events.append(Event("host", host, frozenset({host["name"]})))

    def _signal(self, ch: Changes, job: Record, signal: str) -> None:
        job["signal"] = signal
        hosts = [a["host"] for a in job["alloc"]]
        data = {"jobid": job["jobid"], "signal": signal, "hosts": hosts, "attempt": job["attempt"]}
        ch.events.append(Event("signal", data, frozenset(hosts)))

    def _release_slots(self, ch: Changes, job: Record) -> None:
        for a in job["alloc"]:
            self.active_on.get(a["host"], set()).discard(job["jobid"])
            host = self.hosts.get(a["host"])
            if host is not None:
                host["used_slots"] = max(0, host["used_slots"] - a["ntasks"])
                self._host_changed(ch, host)

    # -- members -----------------------------------------------------------------------------

    def add_member(self, identity: str, role: str, now: float, attrs: Record | None = None,
                   pushes: str = "all") -> Changes:
        """A member joined (or re-joined). ``attrs`` (its join attributes) are kept for
        ``status``; a worker's are its host's, so pass None for it."""
        member: Record = {"identity": identity, "role": role, "joined_at": now, "last_seen": now,
                          "pushes": pushes}
        if attrs is not None:
            member["attrs"] = attrs
        self.members[identity] = member
        data = {"identity": identity, "role": role, "joined": True}
        return Changes(events=[Event("member", data)])

    def member_seen(self, identity: str, now: float) -> None:
        """A joined member's heartbeat: its ``last_seen`` (shown by ``status``), any role."""
        member = self.members.get(identity)
        if member is not None:
            member["last_seen"] = now

    def remove_member(self, identity: str) -> Changes:
        member = self.members.pop(identity, None)
        if member is None:
            return Changes()
        data = {"identity": identity, "role": member["role"], "joined": False}
        return Changes(events=[Event("member", data)])

    def join_worker(self, attrs: dict[str, Any], now: float) -> Changes:
        """A worker joined: create or refresh its host and make it available."""
        name = attrs["hname"]
        ncpus = attrs.get("ncpus")
        max_slots = attrs.get("max_slots", ncpus if isinstance(ncpus, int) else 1)
        if not isinstance(max_slots, int) or isinstance(max_slots, bool) or max_slots < 1:
            raise RemoteError(ErrorCode.INVALID, "join: attrs 'max_slots'/'ncpus' must be int >= 1")
        host = self.hosts.get(name)
        if host is None:
            host = {
                "name": name, "available": True, "closed": False, "comment": "",
                "max_slots": max_slots, "used_slots": 0, "attrs": attrs, "resvals": {},
                "joined_at": now,
            }
            self.hosts[name] = host
        else:
            host.update(available=True, max_slots=max_slots, attrs=attrs, joined_at=now)
        self.last_seen[name] = now
        ch = Changes()
        self._host_changed(ch, _host_state(host))
        return ch

    def heartbeat(self, host: str, now: float) -> Changes:
        """A worker's heartbeat; an unavailable host it names becomes available again."""
        self.last_seen[host] = now
        h = self.hosts.get(host)
        ch = Changes()
        if h is not None and not h["available"]:
            h["available"] = True
            self._host_changed(ch, _host_state(h))
        return ch

    def expire_hosts(self, now: float) -> Changes:
        """Hosts whose worker was silent longer than ``host_timeout`` become unavail."""
        ch = Changes()
        limit = now - self.conf.host_timeout
        for name, host in self.hosts.items():
            if host["available"] and self.last_seen.get(name, now) < limit:
                host["available"] = False
                self._host_changed(ch, _host_state(host))
        return ch

    # -- jobs -----------------------------------------------------------------------------------

    def submit(self, args: dict[str, Any], now: float) -> Changes:
        """Add a pending job (``args`` validated by the op table)."""
        qname = args.get("queue") or self.conf.default_queue
        q = self.queue(qname)
        if not q["open"]:
            raise conflict(f"queue {qname} is closed: it accepts no new jobs")
        jobid = self.next_jobid
        self.next_jobid += 1
        job: Record = {
            "jobid": jobid, "name": args.get("name", ""), "user": args["user"],
            "project": args.get("project", "default"), "queue": qname,
            "command": args["command"], "cwd": args.get("cwd", ""), "env": args.get("env", {}),
            "resreq": args.get("resreq", ""), "ntasks": args.get("ntasks", 1),
            "state": "PEND", "submit_time": now, "start_time": None, "end_time": None,
            "alloc": [], "pid": None, "exit_status": None, "pend_reason": None, "reason": None,
            "signal": None, "attempt": 0, "forced": False, "usage": {},
        }
        for name in SUBMIT_LIMITS:  # -M, -W, -o/-e/-i, -x: kept for the worker (docs/protocol-ops.md)
            if name in args:
                job[name] = args[name]
        self.jobs[jobid] = job
        ch = Changes(result={"jobid": jobid, "queue": qname, "state": "PEND"})
        self._job_changed(ch, job)
        return ch

    def control(self, jobid: int, action: str, now: float) -> Changes:
        """``jobctrl``: kill, stop, resume, checkpoint, requeue (permission checked by caller)."""
        job = self.job(jobid)
        st = job["state"]
        ch = Changes()
        old_hosts = [a["host"] for a in job["alloc"]]
        if action == "kill" and st in ("PEND", "PSUSP"):
            job.update(state="EXIT", end_time=now, reason="killed", pend_reason=None)
        elif action == "kill" and st in ACTIVE:
            self._signal(ch, job, "kill")
        elif action == "stop" and st == "PEND":
            job["state"] = "PSUSP"
        elif action == "stop" and st in ("RUN", "SSUSP"):
            job["state"] = "USUSP"
            self._signal(ch, job, "stop")
        elif action == "resume" and st == "PSUSP":
            job["state"] = "PEND"
        elif action == "resume" and st in ("USUSP", "SSUSP"):
            job["state"] = "RUN"
            self._signal(ch, job, "resume")
        elif action == "checkpoint" and st == "RUN":
            self._signal(ch, job, "checkpoint")
        elif action == "requeue" and st in ACTIVE:
            self._signal(ch, job, "kill")
            self._release_slots(ch, job)
            job.update(state="PEND", alloc=[], pid=None, start_time=None, end_time=None,
                       exit_status=None, reason=None, signal=None, forced=False,
                       attempt=job["attempt"] + 1)
        elif action == "requeue" and st in FINISHED:
            job.update(state="PEND", alloc=[], pid=None, start_time=None, end_time=None,
                       exit_status=None, reason=None, signal=None, forced=False,
                       attempt=job["attempt"] + 1)
        else:
            raise conflict(f"job {jobid} is {st}: cannot {action} it")
        self._job_changed(ch, job, old_hosts)
        ch.result = job
        return ch

    def dispatch(self, jobid: int, alloc: list[dict[str, Any]], force: bool) -> Changes:
        """``jobdispatch``: run a pending job on ``alloc`` (validated shape)."""
        job = self.job(jobid)
        if job["state"] != "PEND":
            raise conflict(f"job {jobid} is {job['state']}, not PEND: cannot dispatch it")
        q = self.queues.get(job["queue"])
        if q is not None and not q["active"]:
            raise conflict(f"queue {job['queue']} is inactive: it dispatches no jobs")
        total = sum(a["ntasks"] for a in alloc)
        if total != job["ntasks"]:
            raise RemoteError(
                ErrorCode.INVALID,
                f"jobdispatch: alloc gives {total} tasks, job {jobid} needs {job['ntasks']}",
            )
        for a in alloc:
            host = self.hosts.get(a["host"])
            if host is None:
                raise conflict(f"host {a['host']} is unknown: cannot dispatch job {jobid} to it")
            if not host["available"]:
                raise conflict(f"host {a['host']} is unavail: cannot dispatch job {jobid} to it")
            if force:
                continue
            if host["closed"]:
                raise conflict(f"host {a['host']} is closed: cannot dispatch job {jobid} to it")
            free = host["max_slots"] - host["used_slots"]
            if a["ntasks"] > free:
                raise conflict(
                    f"host {a['host']} has {free} free slots, job {jobid} needs {a['ntasks']}"
                )
        ch = Changes()
        job.update(state="RUN", alloc=[{"host": a["host"], "ntasks": a["ntasks"]} for a in alloc],
                   pend_reason=None, forced=force, signal=None)
        for a in alloc:
            host = self.hosts[a["host"]]
            host["used_slots"] += a["ntasks"]
            self.active_on.setdefault(a["host"], set()).add(jobid)
            self._host_changed(ch, host)
        self._job_changed(ch, job)
        ch.result = {"jobid": jobid, "state": "RUN", "alloc": job["alloc"]}
        return ch

    def notify(self, host: str, args: dict[str, Any], now: float) -> Changes:
        """``notify_job`` from the worker of ``host``."""
        jobid, event = args["jobid"], args["event"]
        job = self.job(jobid)
        if not any(a["host"] == host for a in job["alloc"]):
            raise RemoteError(ErrorCode.DENIED, f"job {jobid} does not run on host {host}")
        attempt = args.get("attempt")
        if attempt is not None and attempt != job["attempt"]:
            raise conflict(f"job {jobid} report is for attempt {attempt}, job is at {job['attempt']}")
        st = job["state"]
        ch = Changes()
        if event in ("finish", "fail") and st in FINISHED:
            ch.result = job
            return ch
        when = args.get("time", now)  # the worker's clock at the event, if it says
        if event == "start" and st in ACTIVE:
            job.update(pid=args["pid"], start_time=when)
        elif event == "finish" and st in ACTIVE:
            code, why = args["exit_status"], args.get("exit_reason")
            done = code == 0 and why in (None, "done")
            reason = (describe_exit(cast(ExitReason, why), code) if why not in (None, "done")
                      else f"exit status {code}")
            job.update(state="DONE" if done else "EXIT", exit_status=code, end_time=when,
                       signal=None, reason=None if done else reason)
            if "usage" in args:  # the final figures
                job["usage"] = args["usage"]
            self._release_slots(ch, job)
        elif event == "fail" and st in ACTIVE:
            job.update(state="EXIT", exit_status=args.get("exit_status"), end_time=when,
                       signal=None, reason="failed: " + args.get("reason", "failed"))
            if "usage" in args:
                job["usage"] = args["usage"]
            self._release_slots(ch, job)
        elif event == "stop" and st in ACTIVE:
            if st == "RUN":
                job["state"] = "SSUSP"
        elif event == "resume" and st in ("USUSP", "SSUSP"):
            job["state"] = "RUN"
        else:
            raise conflict(f"job {jobid} is {st}: cannot record {event!r}")
        self._job_changed(ch, job)
        ch.result = job
        return ch

    def set_reasons(self, reasons: dict[int, str | None]) -> Changes:
        """Set (or clear, with None) pend reasons of pending jobs; volatile."""
        changed: dict[str, str | None] = {}
        for jobid, reason in reasons.items():
            job = self.jobs.get(jobid)
            if job is not None and job["state"] in ("PEND", "PSUSP") and job["pend_reason"] != reason:
                job["pend_reason"] = reason
                changed[str(jobid)] = reason
        ch = Changes(result=len(changed))
        if changed:
            ch.events.append(Event("pend_reasons", {"reasons": changed}))
        return ch

    def clean_finished(self, now: float, older_than: float, limit: int) -> Changes:
        """Purge at most ``limit`` DONE/EXIT jobs that ended more than ``older_than`` s ago.

        The rows delete the jobs and record ``next_jobid`` in ``meta``, so purging the highest
        ids never lets a later primary hand them out again. Pushes ``job_removed`` to every
        member but workers (a worker holds only its active jobs). Result: the ids removed.
        """
        limit_time = now - older_than
        gone: list[int] = []
        for jobid, job in self.jobs.items():
            end = job.get("end_time")
            if job["state"] in FINISHED and end is not None and end < limit_time:
                gone.append(jobid)
                if len(gone) >= limit:
                    break
        ch = Changes(result=gone)
        if not gone:
            return ch
        for jobid in gone:
            del self.jobs[jobid]
            ch.rows.append(("jobs", jobid, None))
        ch.rows.append(("meta", "next_jobid", self.next_jobid))
        ch.events.append(Event("job_removed", {"jobids": gone}))
        return ch

    def queue_control(self, name: str, action: str) -> Changes:
        q = self.queue(name)
        key, value = {"open": ("open", True), "close": ("open", False),
                      "activate": ("active", True), "inactivate": ("active", False)}[action]
        q[key] = value
        _queue_status(q)
        return Changes(result=q, rows=[("queues", name, q)], events=[Event("queue", q)])

    def host_control(self, name: str, action: str, comment: str) -> Changes:
        host = self.host(name)
        host["closed"] = action == "close"
        host["comment"] = comment
        ch = Changes(result=host)
        self._host_changed(ch, _host_state(host))
        return ch

    def set_resvals(self, name: str, values: dict[str, Any]) -> Changes:
        host = self.host(name)
        host["resvals"] = values
        return Changes(result={"host": name}, events=[Event("resvals", {"host": name, "values": values})])

    def set_jusage(self, host: str, jobid: int, usage: dict[str, Any]) -> Changes:
        job = self.job(jobid)
        if not any(a["host"] == host for a in job["alloc"]):
            raise RemoteError(ErrorCode.DENIED, f"job {jobid} does not run on host {host}")
        job["usage"] = usage
        return Changes(result={"jobid": jobid}, events=[Event("jusage", {"jobid": jobid, "usage": usage})])

    # -- rolling back -----------------------------------------------------------------------

    def restore(self, images: Mapping[tuple[str, Any], Any], keep_volatile: bool = True) -> None:
        """Roll records back to what the store committed, after writes failed to commit.

        ``images`` maps each ``(table, key)`` the failed writes touched to the record the
        store holds, or None where it holds none (a job or host those writes created).
        Queues keep their configured priority and description, as at :meth:`load`. With
        ``keep_volatile``, a host's resource values and a job's usage and pend reason keep
        their values in memory: they are volatile (never stored on their own) and members were
        told of them (without it, those come from the store too). Job ids given
        out stay given out (``next_jobid`` only grows). Slot counts and the host-to-jobs index
        are recomputed for every host involved, as :meth:`load` computes them.
        """
        hosts_touched: set[str] = set()
        for (table, key), image in images.items():
            if table == "jobs":
                self._restore_job(key, image, hosts_touched, keep_volatile)
            elif table == "hosts":
                self._restore_host(key, image, keep_volatile)
                hosts_touched.add(key)
            elif table == "queues":
                self._restore_queue(key, image)
        for name in hosts_touched:
            host = self.hosts.get(name)
            if host is not None:
                host["used_slots"] = sum(
                    a["ntasks"] for jobid in self.active_on.get(name, ())
                    if (job := self.jobs.get(jobid)) is not None
                    for a in job["alloc"] if a["host"] == name
                )
                _host_state(host)

    def _restore_job(self, jobid: int, image: Record | None, hosts_touched: set[str],
                     keep_volatile: bool) -> None:
        old = self.jobs.get(jobid)
        if old is not None:
            for a in old["alloc"]:
                self.active_on.get(a["host"], set()).discard(jobid)
                hosts_touched.add(a["host"])
        if image is None:
            self.jobs.pop(jobid, None)
            return
        if old is not None and keep_volatile:
            image["usage"], image["pend_reason"] = old["usage"], old["pend_reason"]
        self.jobs[jobid] = image
        if image["state"] in ACTIVE:
            for a in image["alloc"]:
                self.active_on.setdefault(a["host"], set()).add(jobid)
                hosts_touched.add(a["host"])

    def _restore_host(self, name: str, image: Record | None, keep_volatile: bool) -> None:
        old = self.hosts.get(name)
        if image is None:
            self.hosts.pop(name, None)
            self.last_seen.pop(name, None)
            return
        if old is not None and keep_volatile:
            image["resvals"] = old["resvals"]
        self.hosts[name] = image

    def _restore_queue(self, name: str, image: Record | None) -> None:
        cfg = next((q for q in self.conf.queues if q["name"] == name), None)
        if cfg is None:
            if image is None:
                self.queues.pop(name, None)
            else:
                self.queues[name] = image
            return
        q = self.queues.setdefault(name, queue_record(cfg))
        base = queue_record(cfg) if image is None else image
        q["open"], q["active"] = bool(base["open"]), bool(base["active"])
        _queue_status(q)
