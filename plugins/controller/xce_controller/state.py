"""The cluster state in memory, and the transitions that change it.

Every transition checks everything first and raises :class:`~xcecore.wire.RemoteError` before
touching anything, so a refused request never changes state. A successful one mutates the
state and returns :class:`Changes`: the rows to commit, the events to push, and the result.
No I/O happens here: the server commits the rows (giving them a rev) and fans the events out.

Jobs live in a :class:`~xce_controller.jobs.JobTable`; every transition that changes a job
takes its index keys first and reindexes it after, so queries, the cleaner and the fan-out
always see a consistent table. Nothing here walks every job or every host: the cleaner takes
what is due from the end-time buckets, host expiry from the last-seen buckets, the lost-job
timer from the buckets of the time each job went UNKWN.

Lost hosts (LSF's UNKWN). A host whose worker is silent for ``host_timeout`` becomes unavail
and the active jobs that run on it (its first host) become UNKWN, keeping their slots:

    RUN | USUSP | SSUSP --host unavail--> UNKWN
    UNKWN --worker reports ``alive`` (re-adopted) or ``start``--> the state it had
    UNKWN --worker reports ``finish``/``fail``--> DONE | EXIT (it ended meanwhile)
    UNKWN --``lost_job_timeout`` passed--> EXIT "host lost" | PEND (requeued, attempt + 1)
    UNKWN --``jobctrl`` kill / requeue--> as for any active job (stop/resume are refused)
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from xce_controller import arrays, depends, tasks
from xce_controller.buckets import TimeBuckets
from xce_controller.events import EventLog
from xce_controller.jobs import EMPTY, Job, JobTable, is_exclusive, make_alloc, new_spec, reported_time
from xce_controller.revocations import EXPIRE_BATCH as REVOKE_BATCH
from xce_controller.revocations import TABLE as REVOCATIONS
from xce_controller.revocations import Revocations
from xce_controller.settings import ClusterConf as ClusterConf  # the state's config; re-exported
from xcecore.jobspec import ExitReason, describe_exit
from xcecore.protocol import ACTIVE, FINISHED, PENDING, UNFINISHED
from xcecore.wire import ErrorCode, RemoteError

Record = dict[str, Any]
# (table, key, record or None to delete); a ``meta`` row's value is any JSON value.
Row = tuple[str, Any, Job | Record | int | float | str | None]
EXPIRE_BATCH = 100  # hosts one expiry pass may look at (one loop pass: a storm's expiries in steps)
NO_HOSTS: frozenset[str] = frozenset()


@dataclass(slots=True)
class Event:
    """A push to fan out (who gets it: :class:`xce_controller.pushes.Fanout`).

    ``hosts``: the hosts it concerns (a worker of one of them gets it if it subscribed to
    its host's records or jobs). ``unfinished``: a job event that members subscribed to
    unfinished jobs get (the job is unfinished, or has just finished).
    """

    name: str
    data: Any
    hosts: frozenset[str] = frozenset()
    unfinished: bool = True


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
        "name": sys.intern(str(cfg["name"])),
        "priority": int(cfg.get("priority", 30)),
        "description": str(cfg.get("description", "")),
        "open": bool(cfg.get("open", True)),
        "active": bool(cfg.get("active", True)),
        "rev": 0,
    }
    return _queue_status(q)


def _queue_status(q: Record) -> Record:
    q["status"] = ("Open" if q["open"] else "Closed") + ":" + ("Active" if q["active"] else "Inact")
    return q


def _killed(by: str | None) -> str:
    """A kill's reason: ``killed by owner alice``, ``killed by administrator root``."""
    return "killed" if not by else f"killed by {by}"


def _host_state(h: Record) -> Record:
    h["state"] = "unavail" if not h["available"] else "closed" if h["closed"] else "ok"
    return h


class ClusterState:
    """Jobs, hosts, queues and members of one primary (or of a standby that follows)."""

    def __init__(self, conf: ClusterConf, clean_width: float = 60.0) -> None:
        self.conf = conf
        self.jobs = JobTable(clean_width)
        self.hosts: dict[str, Record] = {}
        self.host_names: list[str] = []  # sorted: host listings page by name
        self.queues: dict[str, Record] = {}
        self.members: dict[str, Record] = {}
        self.member_ids: list[str] = []  # sorted: status pages members by identity
        self.roles: dict[str, int] = {}  # role -> members
        self.last_seen: dict[str, float] = {}  # host -> last worker heartbeat/join
        self.seen = TimeBuckets[str](max(0.01, conf.host_timeout / 8))
        self.expiry_more = False  # the last expire_hosts looked at a full batch
        self.lost = TimeBuckets[int](max(0.01, (conf.lost_job_timeout or 60.0) / 8))
        self.next_jobid = 1
        self.array_batch: set[int] | None = None  # arrays whose record one write settles once
        self.deps = depends.Deps()  # jobs waiting on a dependency, and what they wait on
        self.events = EventLog()  # cluster events (the primary's: xce_controller.events)
        self.revocations = Revocations()  # revoked bearer tokens (xce_controller.revocations)
        for qcfg in conf.queues:
            q = queue_record(qcfg)
            self.queues[q["name"]] = q

    # -- loading -----------------------------------------------------------------------------

    @property
    def kill_unsatisfiable(self) -> bool:
        """``[controller] kill_unsatisfiable`` as configured now (a reconfiguration applies it)."""
        return self.conf.kill_unsatisfiable

    def take_head(self, hosts: Mapping[str, Record], queues: Mapping[str, Record],
                  next_jobid: int, now: float,
                  revocations: Mapping[str, Record] | None = None) -> None:
        """Take over the durable hosts, queues and revocations (the jobs come with
        :meth:`take_jobs`).

        Queue runtime state (open/active) survives restarts, priorities and descriptions
        come from the configuration. Every host gets a full timeout to re-join.
        """
        self.hosts = {}
        self.host_names = []
        for name, host in hosts.items():
            self._put_host(name, host)
            host["used_slots"] = 0
            self.touch(name, now, force=True)
        for name, stored in queues.items():
            self._take_queue(name, stored)
        self.revocations = Revocations()
        self.revocations.take(revocations or {})
        self.next_jobid = max(self.next_jobid, next_jobid)

    def take_jobs(self, table: JobTable, used: Mapping[str, int] | None = None) -> None:
        """Take over ``table`` (loaded from the store) and every job added meanwhile: the
        jobs this state holds now are newer than the table's and win. ``used``: the slots
        the table's active jobs take per host, if already counted (off the loop)."""
        for job in list(self.jobs.values()):
            table.remove(job.jobid)
            table.add(job)
        self.jobs = table
        for jobid in table.by_state["UNKWN"]:  # their lost-job timers (jobs of one state only)
            self._file_lost(table[jobid])
        for jid in sorted(table.waiting):  # what waits on a dependency (its index: no scan)
            self.deps.follow(table[jid])
        if used is None:
            used = table.used_slots()
        for name, host in self.hosts.items():
            host["used_slots"] = used.get(name, 0)
        self.next_jobid = max(self.next_jobid, table.highest() + 1)

    def _take_queue(self, name: str, stored: Record) -> None:
        q = self.queues.get(name)
        if q is None:
            self.queues[name] = stored  # a queue removed from config keeps its jobs' home
        else:
            q["open"], q["active"] = bool(stored["open"]), bool(stored["active"])
            q["rev"] = int(stored.get("rev", 0))
            _queue_status(q)

    def _put_host(self, name: str, host: Record) -> None:
        if name not in self.hosts:
            bisect.insort(self.host_names, name)
        host.setdefault("rev", 0)
        self.hosts[name] = host

    def _drop_host(self, name: str) -> None:
        if self.hosts.pop(name, None) is not None:
            i = bisect.bisect_left(self.host_names, name)
            if i < len(self.host_names) and self.host_names[i] == name:
                del self.host_names[i]
        self.last_seen.pop(name, None)

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

    def job(self, jobid: int) -> Job:
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

    def hosts_from(self, start: str, limit: int) -> tuple[list[str], str | None]:
        """Up to ``limit`` host names >= ``start``, by name, and the next one (or None)."""
        names = self.host_names
        i = bisect.bisect_left(names, start)
        page = names[i:i + limit]
        nxt = names[i + limit] if i + limit < len(names) else None
        return page, nxt

    # -- helpers for transitions -------------------------------------------------------------

    def _job_changed(self, ch: Changes, job: Job, was: str, extra_hosts: Iterable[str] = ()) -> None:
        """A changed job: its row, and its push to those who see it (``was``: its state
        before the change)."""
        # (No host, no extra host -- a submission, a pending job's change: the shared empty set.)
        hosts = (job.hosts() | frozenset(extra_hosts)) if job.alloc or extra_hosts else NO_HOSTS
        ch.rows.append(("jobs", job.jobid, job))
        ch.events.append(Event("job", job, hosts, job.state in UNFINISHED or was in UNFINISHED))
        if job.array is not None and "of" in job.array:  # an array's element: its array follows
            arrays.element_changed(self, ch, job, was)
        if job.jobid in self.deps.watchers:  # jobs waiting on this one look again
            depends.job_changed(self, ch, job)

    job_changed = _job_changed  # for xce_controller.arrays

    def _host_changed(self, ch: Changes, host: Record) -> None:
        ch.rows.append(("hosts", host["name"], host))
        ch.events.append(Event("host", host, frozenset({host["name"]})))

    def _signal(self, ch: Changes, job: Job, signal: str) -> None:
        job.signal = signal
        hosts = [s.host for s in job.alloc]
        data = {"jobid": job.jobid, "signal": signal, "hosts": hosts, "attempt": job.attempt}
        ch.events.append(Event("signal", data, frozenset(hosts)))

    signal_job = _signal  # for xce_controller.tasks

    def _release_slots(self, ch: Changes, job: Job) -> None:
        for s in job.alloc:
            host = self.hosts.get(s.host)
            if host is not None:
                host["used_slots"] = max(0, host["used_slots"] - s.ntasks)
                self._host_changed(ch, host)

    # -- members -----------------------------------------------------------------------------

    def add_member(self, identity: str, role: str, now: float, attrs: Record | None = None,
                   subscribe: Record | None = None) -> Changes:
        """A member joined (or re-joined). ``attrs`` (its join attributes) are kept for
        ``status``; a worker's are its host's, so pass None for it. ``subscribe``: what it
        receives (its subscription's wire form; ``pushes``: "none" when it is empty, else "all")."""
        scopes = subscribe if subscribe is not None else {}
        member: Record = {"identity": identity, "role": role, "joined_at": now, "last_seen": now,
                          "pushes": "none" if not scopes else "all", "subscribe": scopes}
        if attrs is not None:
            member["attrs"] = attrs
        old = self.members.get(identity)
        if old is None:
            bisect.insort(self.member_ids, identity)
            self.events.record("member_join", now, identity=identity, role=role,
                               candidate=self.events.candidate)
        else:
            self._count_role(old["role"], -1)
        self._count_role(role, 1)
        self.members[identity] = member
        data = {"identity": identity, "role": role, "joined": True}
        return Changes(events=[Event("member", data)])

    def _count_role(self, role: str, n: int) -> None:
        left = self.roles.get(role, 0) + n
        if left > 0:
            self.roles[role] = left
        else:
            self.roles.pop(role, None)

    def member_seen(self, identity: str, now: float) -> None:
        """A joined member's heartbeat: its ``last_seen`` (shown by ``status``), any role."""
        member = self.members.get(identity)
        if member is not None:
            member["last_seen"] = now

    def remove_member(self, identity: str, now: float = 0.0) -> Changes:
        member = self.members.pop(identity, None)
        if member is None:
            return Changes()
        i = bisect.bisect_left(self.member_ids, identity)
        if i < len(self.member_ids) and self.member_ids[i] == identity:
            del self.member_ids[i]
        self._count_role(member["role"], -1)
        self.events.record("member_leave", now, identity=identity, role=member["role"],
                           candidate=self.events.candidate)
        data = {"identity": identity, "role": member["role"], "joined": False}
        return Changes(events=[Event("member", data)])

    def members_from(self, start: str, limit: int) -> tuple[list[str], str | None]:
        """Up to ``limit`` member identities >= ``start``, and the next one (or None)."""
        ids = self.member_ids
        i = bisect.bisect_left(ids, start)
        return ids[i:i + limit], ids[i + limit] if i + limit < len(ids) else None

    def join_worker(self, attrs: dict[str, Any], now: float) -> Changes:
        """A worker joined: create or refresh its host and make it available."""
        name = sys.intern(attrs["hname"])
        ncpus = attrs.get("ncpus")
        max_slots = attrs.get("max_slots", ncpus if isinstance(ncpus, int) else 1)
        if not isinstance(max_slots, int) or isinstance(max_slots, bool) or max_slots < 1:
            raise RemoteError(ErrorCode.INVALID, "join: attrs 'max_slots'/'ncpus' must be int >= 1")
        host = self.hosts.get(name)
        if host is None:
            host = {
                "name": name, "available": True, "closed": False, "comment": "",
                "max_slots": max_slots, "used_slots": 0, "attrs": attrs, "resvals": {},
                "joined_at": now, "rev": 0,
            }
            self._put_host(name, host)
            self.events.record("host_state", now, host=name, state="added",
                               comment="its worker joined")
        else:
            if not host["available"]:
                self.events.record("host_state", now, host=name, state="back",
                                   comment="its worker re-joined")
            host.update(available=True, max_slots=max_slots, attrs=attrs, joined_at=now)
        self.touch(name, now)
        ch = Changes()
        self._host_changed(ch, _host_state(host))
        return ch

    def seen_all(self, now: float) -> None:
        """Every host gets a full timeout to re-join (a new primary: O(hosts), once)."""
        for name in self.hosts:
            self.touch(name, now, force=True)

    def touch(self, host: str, now: float, force: bool = False) -> None:
        """A sign of life from ``host``'s worker: filed anew only when its bucket changes."""
        old = self.last_seen.get(host)
        self.last_seen[host] = now
        seen = self.seen
        if force or old is None or seen.bucket_of(old) != seen.bucket_of(now):
            seen.file(host, now)

    def heartbeat(self, host: str, now: float) -> Changes:
        """A worker's heartbeat; an unavailable host it names becomes available again."""
        self.touch(host, now)
        h = self.hosts.get(host)
        ch = Changes()
        if h is not None and not h["available"]:
            h["available"] = True
            self.events.record("host_state", now, host=host, state="back",
                               comment="its worker's heartbeat came")
            self._host_changed(ch, _host_state(h))
        return ch

    def expire_hosts(self, now: float, most: int = EXPIRE_BATCH) -> Changes:
        """Hosts whose worker was silent longer than ``host_timeout`` become unavail; only
        hosts filed in buckets older than that are looked at."""
        ch = Changes()
        limit = now - self.conf.host_timeout
        due = self.seen.due(limit, most)
        self.expiry_more = len(due) >= most  # a full batch: more may be due (the caller steps)
        for name in due:
            host = self.hosts.get(name)
            seen = self.last_seen.get(name)
            if host is None or seen is None:
                continue  # gone
            if seen >= limit:  # it beat since (filed anew), or is not due yet
                self.seen.refile(name, seen, limit)
                continue
            if host["available"]:
                host["available"] = False
                self.events.record("host_state", now, host=name, state="unavail",
                                   comment=f"no heartbeat for {self.conf.host_timeout:g} s")
                self._host_changed(ch, _host_state(host))
                self._lose_jobs(ch, name, now)
        return ch

    # -- lost hosts --------------------------------------------------------------------------

    def _lose_jobs(self, ch: Changes, host: str, now: float) -> None:
        """The jobs running on ``host`` (their first host) become UNKWN: whether they still
        run is not known until its worker re-joins; a job with a task there (not its first
        host) is killed (:func:`xce_controller.tasks.host_lost`). Costs the host's active
        jobs."""
        for job in self.jobs.active_jobs(host):
            if job.state == "UNKWN" or not job.alloc:
                continue
            if job.alloc[0].host != host:  # a task of a parallel job may run there
                tasks.host_lost(self, ch, job, host)
                continue
            keys = self.jobs.keys(job)
            was = job.state
            job.state, job.lost_at, job.lost_from = "UNKWN", now, was
            self.jobs.reindex(job, keys)
            self._file_lost(job)
            self._job_changed(ch, job, was)

    def _file_lost(self, job: Job) -> None:
        # Filed also while the timeout is 0 (off): a reconfiguration may turn it on.
        if job.lost_at is not None:
            self.lost.file(job.jobid, job.lost_at)

    def _found(self, job: Job) -> None:
        """An UNKWN job its worker reported on: back to the state it had (before reindex)."""
        job.state = job.lost_from or "RUN"
        job.lost_at = job.lost_from = None

    def expire_lost(self, now: float, most: int = EXPIRE_BATCH) -> Changes:
        """Jobs UNKWN for longer than ``lost_job_timeout``: EXIT, or requeued
        (``lost_job_action``); only the jobs filed in buckets older than that are looked at.
        ``result``: the ``(jobid, what became of it)`` pairs."""
        ch = Changes(result=[])
        timeout = self.conf.lost_job_timeout
        if timeout <= 0:
            return ch
        limit = now - timeout
        for jobid in self.lost.due(limit, most):
            job = self.jobs.get(jobid)
            if job is None or job.state != "UNKWN" or job.lost_at is None:
                continue  # found, ended or gone since it was filed
            if job.lost_at >= limit:
                self.lost.refile(jobid, job.lost_at, limit)
                continue
            host = job.alloc[0].host if job.alloc else "?"
            why = f"host {host} lost: unavail for {now - job.lost_at:.0f} s"
            keys = self.jobs.keys(job)
            old_hosts = [s.host for s in job.alloc]
            self._signal(ch, job, "kill")  # a worker that comes back ends what it still runs
            self._release_slots(ch, job)
            job.lost_at = job.lost_from = None
            if self.conf.lost_job_action == "requeue":
                self._requeue(job)
                job.reason = "requeued: " + why
                ch.result.append((jobid, "requeued"))
            else:
                job.state, job.end_time, job.signal, job.reason = "EXIT", now, None, why
                ch.result.append((jobid, "exit"))
            self.jobs.reindex(job, keys)
            self._job_changed(ch, job, "UNKWN", old_hosts)
        return ch

    # -- jobs -----------------------------------------------------------------------------------

    def submit(self, args: dict[str, Any], now: float) -> Changes:
        """Add a pending job (``args`` validated by the op table)."""
        qname = args.get("queue") or self.conf.default_queue
        q = self.queue(qname)
        if not q["open"]:
            raise conflict(f"queue {qname} is closed: it accepts no new jobs")
        array = arrays.new_array(args["array"]) if "array" in args else None
        if "depend" in args:  # stored as the canonical text, names resolved to ids
            args = {**args, "depend": depends.compile_submitted(self.jobs, args["user"], args["depend"])}
        jobid = self.next_jobid
        self.next_jobid += 1
        intern = sys.intern
        job = Job(new_spec(args), jobid, intern(args["user"]), q["name"],
                  intern(args.get("name", "")), args.get("ntasks", 1), "PEND", now, usage=EMPTY,
                  array=array)
        self.jobs.add(job)
        if "depend" in args:
            self.deps.watch(jobid, args["depend"])
            depends.settle(self, Changes(), job)  # its row and push are the submission's
        ch = Changes(result={"jobid": jobid, "queue": q["name"], "state": job.state})
        if array is not None:
            ch.result.update(array=array["spec"], size=array["size"])
        self._job_changed(ch, job, "PEND")
        return ch

    def control(self, jobid: int, action: str, now: float, by: str | None = None,
                index: int | None = None) -> Changes:
        """``jobctrl``: kill, stop, resume, checkpoint, requeue (permission checked by caller);
        of an array (``index``: one of its elements), :func:`xce_controller.arrays.control`.

        ``by``: who asked, for a kill's reason (``owner alice``, ``administrator root``): a
        pending job's at once, a running job's when its worker reports it killed."""
        job = self.job(jobid)
        if arrays.is_array(job):
            return cast(Changes, arrays.control(self, Changes(), job, index, action, now, by,
                                                _killed(by)))
        if index is not None:
            raise RemoteError(ErrorCode.INVALID, f"jobctrl: job {jobid} is not an array: it has "
                              "no element index", {"arg": "index"})
        st = job.state
        keys = self.jobs.keys(job)
        ch = Changes()
        old_hosts = [s.host for s in job.alloc]
        if action == "kill" and st in PENDING:
            job.state, job.end_time, job.reason, job.pend_reason = "EXIT", now, _killed(by), None
        elif action == "kill" and st in ACTIVE:
            self._signal(ch, job, "kill")
            job.reason = _killed(by)  # the reason its end report will have, if killed
        elif action == "stop" and st == "PEND":
            job.state = "PSUSP"
        elif action == "stop" and st in ("RUN", "SSUSP"):
            job.state = "USUSP"
            self._signal(ch, job, "stop")
        elif action == "resume" and st == "PSUSP":
            job.state = "PEND"
        elif action == "resume" and st in ("USUSP", "SSUSP"):
            job.state = "RUN"
            self._signal(ch, job, "resume")
        elif action == "checkpoint" and st == "RUN":
            self._signal(ch, job, "checkpoint")
        elif action == "requeue" and st in ACTIVE:
            self._signal(ch, job, "kill")
            self._release_slots(ch, job)
            self._requeue(job)
        elif action == "requeue" and st in FINISHED:
            self._requeue(job)
        else:
            raise conflict(f"job {jobid} is {st}: cannot {action} it")
        self.jobs.reindex(job, keys)
        self._job_changed(ch, job, st, old_hosts)
        ch.result = job
        return ch

    @staticmethod
    def _requeue(job: Job) -> None:
        job.state, job.alloc, job.pid, job.start_time, job.end_time = "PEND", (), None, None, None
        job.exit_status = job.reason = job.signal = None
        job.lost_at = job.lost_from = None
        job.forced = False
        job.tasks = None  # a new attempt gets a new task secret
        job.attempt += 1

    def dispatch(self, jobid: int, alloc: list[dict[str, Any]], force: bool,
                 more: list[list[dict[str, Any]]] | None = None) -> Changes:
        """``jobdispatch``: run a pending job on ``alloc`` (validated shape); an array: its
        next pending element on ``alloc`` and one more on each of ``more``."""
        job = self.job(jobid)
        if job.state != "PEND":
            raise conflict(f"job {jobid} is {job.state}, not PEND: cannot dispatch it")
        q = self.queues.get(job.queue)
        if q is not None and not q["active"]:
            raise conflict(f"queue {job.queue} is inactive: it dispatches no jobs")
        if job.waiting is not None and not force:
            raise conflict(f"job {jobid} waits: {job.waiting}")
        allocs = [alloc, *(more or ())]
        if len(allocs) > 1 and not arrays.is_array(job):
            raise RemoteError(ErrorCode.INVALID, f"jobdispatch: job {jobid} is not an array: "
                              "'more' allocations are for arrays", {"arg": "more"})
        need: dict[str, int] = {}
        for each in allocs:
            total = sum(a["ntasks"] for a in each)
            if total != job.ntasks:
                raise RemoteError(
                    ErrorCode.INVALID,
                    f"jobdispatch: alloc gives {total} tasks, job {jobid} needs {job.ntasks}",
                )
            for a in each:
                need[a["host"]] = need.get(a["host"], 0) + a["ntasks"]
        self._check_hosts(jobid, need, force)
        self._check_exclusive(job, allocs)
        ch = Changes()
        if arrays.is_array(job):
            elements = arrays.dispatch(self, job, allocs, force, ch)
            ch.result = {"jobid": jobid, "state": "RUN", "alloc": elements[0].alloc,
                         "elements": [{"jobid": e.jobid, "index": (e.array or {})["index"],
                                       "alloc": e.alloc} for e in elements]}
            return ch
        if job.array is not None:
            arrays.check_element(self, job)
        self.take_slots(ch, job, alloc, force)
        ch.result = {"jobid": jobid, "state": "RUN", "alloc": job.alloc}
        return ch

    def _check_hosts(self, jobid: int, need: Mapping[str, int], force: bool) -> None:
        """CONFLICT unless every host can take the tasks ``need`` puts on it."""
        for name, ntasks in need.items():
            host = self.hosts.get(name)
            if host is None:
                raise conflict(f"host {name} is unknown: cannot dispatch job {jobid} to it")
            if not host["available"]:
                raise conflict(f"host {name} is unavail: cannot dispatch job {jobid} to it")
            if force:
                continue
            if host["closed"]:
                raise conflict(f"host {name} is closed: cannot dispatch job {jobid} to it")
            free = host["max_slots"] - host["used_slots"]
            if ntasks > free:
                raise conflict(f"host {name} has {free} free slots, job {jobid} needs {ntasks}")

    def _check_exclusive(self, job: Job, allocs: list[list[dict[str, Any]]]) -> None:
        """CONFLICT, naming the other job, unless ``-x`` holds on every host of ``allocs``:
        an exclusive job gets hosts no active job runs on (nor another element of its own
        dispatch), and no job goes to a host an active exclusive job holds. Forced dispatches
        too: LSF's ``brun`` overrides scheduling policy (closed hosts, slot limits, resource
        reservations), never another job's exclusive hold. A job that is not exclusive costs
        a look-up per host (the index of active exclusive jobs), not a look at every job the
        host runs (a 128-slot host filled one job at a time was quadratic)."""
        mine = is_exclusive(job)
        seen: set[str] = set()
        jobid, table = job.jobid, self.jobs
        for each in allocs:
            for a in each:
                name = a["host"]
                if mine and name in seen:
                    raise conflict(f"job {jobid} is exclusive (-x): two of its elements "
                                   f"cannot share host {name}")
                seen.add(name)
                held = table.active_on.get(name) if mine else table.exclusive_on.get(name)
                if not held:
                    continue
                others = [other for other in held if other != jobid]
                if others and mine:
                    raise conflict(f"host {name} runs job {min(others)}: exclusive job "
                                   f"{jobid} (-x) needs its hosts to itself")
                if others:
                    raise conflict(f"host {name} is held by exclusive job {min(others)} (-x): "
                                   f"cannot dispatch job {jobid} to it")

    def take_slots(self, ch: Changes, job: Job, alloc: list[dict[str, Any]], force: bool) -> None:
        """A pending job (hosts checked) runs on ``alloc``: its slots are taken."""
        keys = self.jobs.keys(job)
        job.state, job.alloc = "RUN", make_alloc((a["host"], a["ntasks"]) for a in alloc)
        job.pend_reason, job.forced, job.signal = None, force, None
        self.jobs.reindex(job, keys)
        for s in job.alloc:
            host = self.hosts[s.host]
            host["used_slots"] += s.ntasks
            self._host_changed(ch, host)
        self._job_changed(ch, job, "PEND")

    def notify(self, host: str, args: dict[str, Any], now: float) -> Changes:
        """``notify_job`` from the worker of ``host``."""
        jobid, event = args["jobid"], args["event"]
        job = self.job(jobid)
        if not job.runs_on(host):
            raise RemoteError(ErrorCode.DENIED, f"job {jobid} does not run on host {host}")
        attempt = args.get("attempt")
        if attempt is not None and attempt != job.attempt:
            raise conflict(f"job {jobid} report is for attempt {attempt}, job is at {job.attempt}")
        if event.startswith("task_"):
            ch = Changes()
            tasks.notify(self, ch, host, job, args, now)
            return ch
        st = job.state
        ch = Changes()
        if event in ("finish", "fail") and st in FINISHED:
            ch.result = job
            return ch
        keys = self.jobs.keys(job)
        # the worker's clock at the event, if it says, within what the controller knows
        when = reported_time(args.get("time"), job.start_time if event in ("finish", "fail")
                             and job.start_time is not None else job.submit_time, now)
        if event == "alive" and st in ACTIVE:  # re-adopted by its worker; once is enough
            if st != "UNKWN":
                ch.result = job
                return ch
            self._found(job)
        elif event == "start" and st in ACTIVE:
            job.pid, job.start_time = args["pid"], when
            if "task_key" in args:
                tasks.set_key(job, args["task_key"])
            if st == "UNKWN":
                self._found(job)
        elif event == "finish" and st in ACTIVE:
            code, why = args["exit_status"], args.get("exit_reason")
            done = code == 0 and why in (None, "done")
            reason = (describe_exit(cast(ExitReason, why), code) if why not in (None, "done")
                      else f"exit status {code}")
            if why == "killed" and job.reason is not None and job.reason.startswith("killed"):
                reason = job.reason  # who asked (control)
            job.state, job.exit_status, job.end_time = ("DONE" if done else "EXIT"), code, when
            job.signal, job.reason = None, None if done else reason
            job.lost_at = job.lost_from = None
            if "usage" in args:  # the final figures (with its ended tasks')
                job.usage = tasks.total_usage(job, args["usage"])
            self._release_slots(ch, job)
        elif event == "fail" and st in ACTIVE:
            job.state, job.exit_status, job.end_time = "EXIT", args.get("exit_status"), when
            text = args.get("reason", "failed")
            killed = job.signal == "kill" and job.reason is not None and job.reason.startswith("killed")
            job.reason = (job.reason if killed else "could not start: " + text
                          if args.get("exit_reason") == "no_start" else "failed: " + text)
            job.signal = None
            job.lost_at = job.lost_from = None
            if "usage" in args:
                job.usage = tasks.total_usage(job, args["usage"])
            self._release_slots(ch, job)
        elif event == "stop" and st in ACTIVE:
            if st == "RUN":
                job.state = "SSUSP"
        elif event == "resume" and st in ("USUSP", "SSUSP"):
            job.state = "RUN"
        else:
            raise conflict(f"job {jobid} is {st}: cannot record {event!r}")
        self.jobs.reindex(job, keys)
        self._job_changed(ch, job, st)
        ch.result = job
        return ch

    def set_reasons(self, reasons: Mapping[int, str | None]) -> Changes:
        """Set (or clear, with None) pend reasons of pending jobs; volatile."""
        changed: dict[str, str | None] = {}
        tbl, intern = self.jobs, sys.intern
        for jobid, reason in reasons.items():
            job = tbl.get(jobid)
            if job is not None and job.state in PENDING and job.pend_reason != reason:
                keys = tbl.keys(job)
                job.pend_reason = None if reason is None else intern(reason)
                tbl.reindex(job, keys)
                changed[str(jobid)] = reason
        ch = Changes(result=len(changed))
        if changed:
            ch.events.append(Event("pend_reasons", {"reasons": changed}))
        return ch

    def clean_finished(self, now: float, older_than: float, limit: int) -> Changes:
        """Purge at most ``limit`` DONE/EXIT jobs that ended more than ``older_than`` s ago
        (taken from the end-time buckets: only what is due is looked at).

        The rows delete the jobs and record ``next_jobid`` in ``meta``, so purging the highest
        ids never lets a later primary hand them out again. Pushes ``job_removed`` to the
        members that see all or unfinished jobs. Result: the ids removed.
        """
        gone = self.jobs.due_finished(now - older_than, limit)
        ch = Changes(result=gone)
        if not gone:
            return ch
        for jobid in gone:
            self.jobs.remove(jobid)
            ch.rows.append(("jobs", jobid, None))
        ch.rows.append(("meta", "next_jobid", self.next_jobid))
        ch.events.append(Event("job_removed", {"jobids": gone}))
        return ch

    def reconfigure(self, conf: ClusterConf, now: float = 0.0, by: str = "") -> Changes:
        """Take a new configuration (``xce admin reconfig``, SIGHUP) at once.

        A queue new to the configuration is created, a configured one takes its new priority
        and description (whether it is open and active is its own state: kept); a queue no
        longer configured keeps its record and its jobs, as at a restart. The default queue,
        host timeout and groups are not records: they apply to what comes next. The result
        lists the queues added and changed.
        """
        before = {q["name"] for q in self.conf.queues}
        self.conf = conf
        added: list[str] = []
        changed: list[str] = []
        ch = Changes()
        for qcfg in conf.queues:
            fresh = queue_record(qcfg)
            name = fresh["name"]
            q = self.queues.get(name)
            if q is None:
                self.queues[name] = q = fresh
                added.append(name)
            elif (q["priority"], q["description"]) != (fresh["priority"], fresh["description"]):
                q["priority"], q["description"] = fresh["priority"], fresh["description"]
                changed.append(name)
            else:
                continue
            ch.rows.append(("queues", name, q))
            ch.events.append(Event("queue", q))
        for name in added:
            self.events.record("queue_state", now, queue=name, state="created", by=by)
        removed = sorted(before - {q["name"] for q in conf.queues})
        for name in removed:  # its record stays (its jobs keep their home), as at a restart
            self.events.record("queue_state", now, queue=name, state="removed", by=by)
        self.events.record("reconfig", now, by=by, queues_added=added, queues_changed=changed,
                           queues_removed=removed)
        ch.result = {"queues_added": added, "queues_changed": changed}
        return ch

    def revoked(self, rec: Record | None) -> Changes:
        """A revocation record just held (:mod:`xce_controller.revocations`; None: its token
        had expired already): its row and its push."""
        if rec is None:
            return Changes(result={"revoked": False, "why": "the token has expired already"})
        return Changes(result={"key": rec["key"], "revoked": True, "record": rec},
                       rows=[(REVOCATIONS, rec["key"], rec)], events=[Event("revocation", rec)])

    def expire_revocations(self, now: float, limit: int = REVOKE_BATCH) -> Changes:
        """Drop the revocations whose tokens have all expired (a bounded batch, from the
        expiry heap): their rows deleted, ``revocations_removed`` pushed. Result: the keys."""
        gone = self.revocations.expire(now, limit)
        ch = Changes(result=gone, rows=[(REVOCATIONS, key, None) for key in gone])
        if gone:
            ch.events.append(Event("revocations_removed", {"keys": gone}))
        return ch

    def queue_control(self, name: str, action: str, now: float = 0.0, by: str = "") -> Changes:
        q = self.queue(name)
        key, value = {"open": ("open", True), "close": ("open", False),
                      "activate": ("active", True), "inactivate": ("active", False)}[action]
        q[key] = value
        _queue_status(q)
        state = {"open": "opened", "close": "closed", "activate": "active",
                 "inactivate": "inactive"}[action]
        self.events.record("queue_state", now, queue=name, state=state, by=by)
        return Changes(result=q, rows=[("queues", name, q)], events=[Event("queue", q)])

    def host_control(self, name: str, action: str, comment: str, now: float = 0.0,
                     by: str = "") -> Changes:
        host = self.host(name)
        host["closed"] = action == "close"
        host["comment"] = comment
        self.events.record("host_state", now, host=name,
                           state="closed" if host["closed"] else "opened", by=by, comment=comment)
        ch = Changes(result=host)
        self._host_changed(ch, _host_state(host))
        return ch

    def set_resvals(self, name: str, values: dict[str, Any]) -> Changes:
        host = self.host(name)
        host["resvals"] = values
        return Changes(result={"host": name},
                       events=[Event("resvals", {"host": name, "values": values}, frozenset({name}))])

    def set_jusage(self, host: str, jobid: int, usage: dict[str, Any],
                   task: int | None = None) -> Changes:
        """A running job's usage sample from ``host``: its first task's, or launched
        ``task``'s; the job's figure becomes the sum over its tasks (:func:`tasks.live_usage`)."""
        job = self.job(jobid)
        if not job.runs_on(host):
            raise RemoteError(ErrorCode.DENIED, f"job {jobid} does not run on host {host}")
        live = tasks.live_usage(job, host, task, usage)
        if live is None:  # a task's sample that does not change the figure (see live_usage)
            return Changes(result={"jobid": jobid})
        job.usage = usage = live or EMPTY
        return Changes(result={"jobid": jobid},
                       events=[Event("jusage", {"jobid": jobid, "usage": usage}, job.hosts())])

    # -- rolling back, and following ------------------------------------------------------------

    def restore(self, images: Mapping[tuple[str, Any], Any], keep_volatile: bool = True) -> None:
        """Roll records back to what the store committed, after writes failed to commit.

        ``images`` maps each ``(table, key)`` the failed writes touched to the record the
        store holds (a :class:`Job` for jobs, a dict otherwise), or None where it holds none
        (a job or host those writes created). Queues keep their configured priority and
        description, as at load. With ``keep_volatile``, a host's resource values and a
        job's usage and pend reason keep their values in memory: they are volatile (never
        stored on their own) and members were told of them (without it, those come from the
        store too). Job ids given out stay given out (``next_jobid`` only grows). Slot counts
        are recomputed for every host involved.
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
            elif table == "events" and image is None:  # an event that was never stored
                self.events.forget([int(key)])
            elif table == "revocations":
                self.revocations.restore(key, image)
        self._recount(hosts_touched)

    def _recount(self, names: Iterable[str]) -> None:
        tbl = self.jobs
        for name in names:
            host = self.hosts.get(name)
            if host is not None:
                host["used_slots"] = sum(
                    s.ntasks for jobid in tbl.active_on.get(name, ())
                    for s in tbl[jobid].alloc if s.host == name
                )
                _host_state(host)

    def _restore_job(self, jobid: int, image: Job | None, hosts_touched: set[str],
                     keep_volatile: bool) -> None:
        old = self.jobs.remove(jobid)
        if old is not None:
            hosts_touched.update(s.host for s in old.alloc)
        if image is None:
            self.deps.drop(jobid)
            return
        self.deps.follow(image)
        if old is not None and keep_volatile:
            image.usage, image.pend_reason = old.usage, old.pend_reason
        self.jobs.add(image)
        if image.state == "UNKWN":
            self._file_lost(image)
        hosts_touched.update(s.host for s in image.alloc)

    def _restore_host(self, name: str, image: Record | None, keep_volatile: bool) -> None:
        old = self.hosts.get(name)
        if image is None:
            self._drop_host(name)
            return
        if old is not None and keep_volatile:
            image["resvals"] = old["resvals"]
        self._put_host(name, image)

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
        q["rev"] = int(base.get("rev", 0))
        _queue_status(q)

    def follow(self, jobs: Iterable[Job], hosts: Mapping[str, Record],
               queues: Mapping[str, Record], removed: Iterable[tuple[str, Any, int]],
               next_jobid: int, now: float,
               revocations: Mapping[str, Record] | None = None) -> None:
        """A hot standby applies what the primary committed (newer versions of records, and
        removals), as :meth:`restore` applies committed images: only what changed is touched."""
        touched: set[str] = set()
        jobs_seen = list(jobs)
        for job in jobs_seen:
            self._restore_job(job.jobid, job, touched, keep_volatile=False)
        for name, host in hosts.items():
            if name not in self.hosts:
                self.touch(name, now, force=True)
            self._put_host(name, host)
            touched.add(name)
        for name, q in queues.items():
            self._restore_queue(name, q)
        current = {("jobs", j.jobid) for j in jobs_seen} | {("hosts", h) for h in hosts} | {
            ("queues", q) for q in queues}
        removed = list(removed)
        self.revocations.follow(revocations or {},
                                [str(k) for kind, k, _ in removed if kind == "revocations"])
        for kind, key, _rev in removed:
            if (kind, key) in current:
                continue  # removed, then made again: the record is the newer change
            if kind == "jobs":
                self._restore_job(int(key), None, touched, False)
            elif kind == "hosts":
                self._drop_host(str(key))
            elif kind == "queues":
                self._restore_queue(str(key), None)
        self._recount(touched)
        self.next_jobid = max(self.next_jobid, next_jobid)
