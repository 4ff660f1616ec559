"""Every controller op: one handler each, and ONE table (:data:`OPS`) that says who may call it.

The table gives, per op: its handler, the daemon roles that may call it and whether users'
clients may (``users``), whether it is a durable write, a volatile update or a read,
which roles must have joined first, and whether the user a request acts for must be an
administrator (or its role hold a grant of the op). Its arguments are the op's typed schema
in :data:`xcecore.schema.ops.OP_ARGS` (types, limits, required and allowed arguments).
:func:`check_call` enforces all of that before the handler runs -- with the caller's
authenticated identity (``Caller.who``) and the cluster's :class:`~xce_controller.authz.Policy`
-- so handlers only see valid arguments, ``args["user"]`` is whom the request acts for, and
a refused request never reaches the state. docs/protocol-ops.md is generated from the table
and the schemas (``docs/gen_protocol_ops.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from xce_controller import batch, events, queries, subscribe, tasks
from xce_controller.authz import FRONT_ENDS, MEMBER_DAEMONS, Policy, describe, via
from xce_controller.revocations import MAX_LIFETIME
from xce_controller.state import Changes, ClusterState
from xce_controller.subscribe import NONE, Subscription
from xcecore.auth import Identity
from xcecore.schema.ops import ArgsSchema, check_host_attrs, compile_all
from xcecore.wire import ErrorCode, RemoteError

WORKER = "worker"
SCHEDULER = "scheduler"
# Every role but the member daemons (the API server, ``cli``, a third party's) is a users'
# client: it calls the ops marked ``users`` for a user.


@dataclass(slots=True)
class Caller:
    """Who is calling: the handshake's ``role@host``, its authenticated identity (``who``),
    and what its join made of it."""

    identity: str
    role: str
    who: Identity
    joined: bool = False
    worker_host: str | None = None  # a joined worker's host name
    cid: int = 0  # the server's connection id
    sub: Subscription = NONE  # what its join subscribed to
    plan: Any = None  # how its sync goes (a sync.Plan); None: a join of the older form

    def label(self) -> str:
        """How logs name the caller: ``alice (uid 1001) as cli@h1``."""
        return self.who.label()


class ServerView(Protocol):
    """What handlers may ask of the server besides the state."""

    state: ClusterState
    address: str
    policy: Policy

    def status(self, limit: int = ..., after: str = ...) -> dict[str, Any]: ...

    def plan_sync(self, caller: Caller, sub: Subscription, since: dict[str, Any] | None,
                  writes: bool) -> Any: ...

    def subscribe(self, caller: Caller) -> None: ...

    def replace_worker(self, caller: Caller, host: str) -> None: ...

    def request_shutdown(self, by: str) -> None: ...

    def reconfigured(self, by: str) -> Changes: ...

    def outcome(self, rid: str) -> dict[str, Any]: ...


Handler = Callable[[ServerView, Caller, dict[str, Any], float], Changes]
Kind = Literal["read", "write", "volatile"]
SCHEMAS: dict[str, ArgsSchema] = compile_all()
"""Each op's argument schema; each builds its validator on first use, or when
:func:`build_validators` reaches it."""

FIRST_NEEDED = ("hello", "heartbeat", "jobsubmit", "join", "status", "jobinfo", "outcome")
"""The ops a new primary is called with first (clients, members re-joining): built first."""


def build_validators(*more: dict[str, ArgsSchema]) -> None:
    """Build every op's validator now (blocking: a standby runs it on a thread while it stands
    by, so a promotion's first requests do not pay for pydantic's schema building, 0.1-0.4 s
    in all); ``more``: other schema tables (the delegated ops')."""
    tables = (SCHEMAS, *more)
    order = [SCHEMAS[op] for op in FIRST_NEEDED if op in SCHEMAS]
    order += [s for table in tables for s in table.values()]
    for schema in order:
        _ = schema.required  # builds the adapter, then its required set


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One row of the op table (its arguments: :data:`SCHEMAS`).

    ``roles``: the member daemons that may call it (None: every caller); ``users``: whether
    users' clients may; ``admin``: a user's client must act for an administrator (or its
    role hold a grant of the op); ``acts``: the op acts for a user, whom a front end must
    name.
    """

    handler: Handler
    roles: frozenset[str] | None  # None: any role
    kind: Kind
    member_roles: frozenset[str] | None = frozenset()  # None: every role must have joined
    users: bool = False
    admin: bool = False
    acts: bool = False
    dedupe: bool = True  # store the result under the request's rid
    needs_jobs: bool = True  # waits while a new primary loads its jobs

    def needs_join(self, role: str) -> bool:
        return self.member_roles is None or role in self.member_roles


def check_call(op: str, caller: Caller, args: dict[str, Any], state: ClusterState,
               policy: Policy) -> tuple[OpSpec, dict[str, Any]]:
    """Everything before the handler: known op, role, join, arguments, whom it acts for,
    administrator rights. ``args["user"]`` of the result is the user the request acts for
    (for ops that act for one, or when a user was named)."""
    spec = OPS.get(op)
    if spec is None:
        raise RemoteError(ErrorCode.INVALID, f"unknown op {op!r}")
    daemon = caller.role in MEMBER_DAEMONS
    if spec.roles is not None and not (caller.role in spec.roles or (spec.users and not daemon)):
        raise RemoteError(ErrorCode.DENIED, f"{op}: role {caller.role!r} may not call it")
    if spec.needs_join(caller.role) and not caller.joined:
        raise RemoteError(ErrorCode.NOT_JOINED, f"{op}: join first")
    checked = SCHEMAS[op].check(args)
    if spec.acts or "user" in checked:
        who = caller.who
        user = policy.acting_for(op, who, checked.get("user"), must_name=spec.acts and not daemon)
        checked["user"] = user
        if spec.admin and not daemon and not policy.may_administer(caller.role, op, user):
            raise RemoteError(ErrorCode.DENIED, f"{op}: {describe(user, who)} is not a cluster "
                                                "administrator")
    return spec, checked


# -- handlers -----------------------------------------------------------------------------


def op_join(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    role, attrs = args["role"], args.get("attrs", {})
    if role != caller.role:
        raise RemoteError(ErrorCode.DENIED, f"join: handshake says role {caller.role!r}, not {role!r}")
    hname = check_host_attrs("join", attrs)["hname"] if role == WORKER else None
    sub = subscribe.parse(args.get("subscribe"), role, hname)
    ch = Changes()
    if hname is not None:
        ch = srv.state.join_worker(attrs, now)
        srv.replace_worker(caller, hname)
    caller.worker_host = hname
    caller.joined, caller.sub = True, sub
    plan = None
    if sub.scopes:  # every member streams its sync (``since`` absent: it holds nothing)
        plan = srv.plan_sync(caller, sub, args.get("since"), bool(ch.rows))
    caller.plan = plan
    member = srv.state.add_member(caller.identity, role, now, None if role == WORKER else attrs,
                                  sub.to_wire())
    ch.events.extend(member.events)
    ch.result = {"member": caller.identity, "server": srv.address, "role": role,
                 "sync": None if plan is None else plan.reply()}
    ch.after = lambda: srv.subscribe(caller)
    return ch


def op_hello(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return Changes(result={"server": srv.address, "state": "primary", "time": now, "joined": caller.joined})


def op_heartbeat(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    ch = srv.state.heartbeat(caller.worker_host, now) if caller.worker_host else Changes()
    if caller.joined:
        srv.state.member_seen(caller.identity, now)
    ch.result = {"time": now}
    return ch


def op_jobsubmit(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    # The job runs as its submitter: the authenticated uid of a direct caller. A front end's
    # user has no uid here (the worker looks the name up, and never runs it as root).
    who = caller.who
    front = caller.role in FRONT_ENDS
    return srv.state.submit({**args, "uid": None if front else who.uid,
                             "gid": None if front else who.gid, "via": via(who)}, now)


def op_jobctrl(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    job = srv.state.job(args["jobid"])
    user = args["user"]
    if job.user != user and not srv.policy.may_administer(caller.role, "jobctrl", user):
        raise RemoteError(ErrorCode.DENIED, f"jobctrl: job {job.jobid} belongs to "
                                            f"{job.user}, not {describe(user, caller.who)}")
    by = f"owner {user}" if job.user == user else f"administrator {user}"
    return srv.state.control(args["jobid"], args["action"], now, by, args.get("index"))


def op_revoke_token(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    # The record names whom the request acts for: it revokes only a token of that user.
    st = srv.state
    return st.revoked(st.revocations.revoke_token(args["jti"], args["user"], args["expires"],
                                                  describe(args["user"], caller.who), now))


def op_revoke_tokens(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    user, target = args["user"], args["target"]
    if target != user and not srv.policy.may_administer(caller.role, "revoke_tokens", user):
        raise RemoteError(ErrorCode.DENIED, f"revoke_tokens: {describe(user, caller.who)} may "
                                            f"revoke only their own tokens, not {target}'s (an "
                                            "administrator may revoke anyone's)")
    until = args.get("until", now + MAX_LIFETIME)
    st = srv.state
    return st.revoked(st.revocations.revoke_user(target, until, describe(user, caller.who), now))


def op_queuectrl(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return srv.state.queue_control(args["queue"], args["action"], now,
                                   describe(args["user"], caller.who))


def op_hostctrl(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return srv.state.host_control(args["host"], args["action"], args.get("comment", ""), now,
                                  describe(args["user"], caller.who))


def op_jobdispatch(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    alloc = args["alloc"]
    force = bool(args.get("force", False))
    if force and not srv.policy.may_administer(caller.role, "jobdispatch", args["user"]):
        raise RemoteError(ErrorCode.DENIED, "jobdispatch: only an administrator may force a "
                                            f"dispatch, not {describe(args['user'], caller.who)}")
    return srv.state.dispatch(args["jobid"], alloc, force, args.get("more"))


def op_jobdispatch_many(srv: ServerView, caller: Caller, args: dict[str, Any],
                        now: float) -> Changes:
    return batch.dispatch_many(srv.state, args["dispatches"])


def op_set_pend_reason(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    reasons: dict[int, str | None] = {int(key): reason for key, reason in args["reasons"].items()}
    ch = srv.state.set_reasons(reasons)
    ch.result = {"updated": ch.result}
    return ch


def op_clear_reason(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    ids = args.get("jobids")
    more = False
    if ids is None:  # from the index of jobs that have one, a bounded batch at a time
        ids = []
        for jid in srv.state.jobs.reasons:
            if len(ids) >= queries.CLEAR_BATCH:
                more = True
                break
            ids.append(jid)
    ch = srv.state.set_reasons(dict.fromkeys(ids))
    ch.result = {"cleared": ch.result, "more": more}
    return ch


def op_update_resvals(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    host = args.get("host")
    if caller.role == WORKER:
        if host is not None and host != caller.worker_host:
            raise RemoteError(ErrorCode.DENIED, f"update_resvals: a worker of {caller.worker_host} may not set {host}")
        host = caller.worker_host
    if host is None:
        raise RemoteError(ErrorCode.INVALID, "update_resvals: argument 'host' is required", {"arg": "host"})
    return srv.state.set_resvals(host, args["values"])


def op_notify_job(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    assert caller.worker_host is not None
    return srv.state.notify(caller.worker_host, args, now)


def op_update_jusage(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    assert caller.worker_host is not None
    return srv.state.set_jusage(caller.worker_host, args["jobid"], args["usage"], args.get("task"))


def _own_job(srv: ServerView, caller: Caller, op: str, jobid: int, user: str) -> Any:
    job = srv.state.job(jobid)
    if job.user != user:
        raise RemoteError(ErrorCode.DENIED, f"{op}: job {jobid} belongs to {job.user}, not "
                                            f"{describe(user, caller.who)}")
    return job


def op_task_launch(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    # Only the job itself: its owner (no administrator override) holding its task secret.
    job = _own_job(srv, caller, "task_launch", args["jobid"], args["user"])
    ch = Changes()
    tasks.launch(srv.state, ch, job, args["hosts"], args["command"], args["secret"], now)
    return ch


def op_task_block(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    user = args["user"]
    job = srv.state.job(args["jobid"])
    if job.user != user and not srv.policy.may_administer(caller.role, "task_block", user):
        _own_job(srv, caller, "task_block", args["jobid"], user)
    ch = Changes()
    tasks.block(srv.state, ch, job, args["action"] == "block")
    return ch


def op_resval(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    nxt: str | None = None
    if "host" in args:
        names = [args["host"]]
    else:
        start = queries.name_start("resval", args.get("cursor"))
        names, more = st.hosts_from(start, int(args.get("limit", queries.LIST_LIMIT)))
        nxt = queries.name_cursor(more)
    wanted = args.get("names")
    out: dict[str, Any] = {}
    for name in names:
        vals = st.host(name)["resvals"]
        out[name] = {k: v for k, v in vals.items() if k in wanted} if wanted is not None else vals
    return Changes(result={"hosts": out, "next": nxt})


def op_clusterconf(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return Changes(result=srv.state.clusterconf())


def op_jobinfo(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    owner = args.get("owner")
    if owner is None and caller.role not in FRONT_ENDS:
        owner = args.get("user")
    return Changes(result=queries.jobs_page(srv.state, args, owner))


def op_hostinfo(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    names, nxt = queries.hosts_page(st, args)
    return Changes(result={"hosts": [st.host(n) for n in names], "next": nxt})


def op_queueinfo(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    if "queues" in args:
        qs = [st.queue(n) for n in args["queues"]]
        qs.sort(key=lambda q: (-q["priority"], q["name"]))
    else:
        qs = st.sorted_queues()
    names = {q["name"] for q in qs}
    counts: dict[str, dict[str, int]] = {}
    for (queue, state), n in st.jobs.counts.items():  # queues x states entries, not jobs
        if queue in names:
            counts.setdefault(queue, {})[state] = n
    return Changes(result={"queues": qs, "counts": counts})


def op_status(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    start = queries.name_start("status", args.get("cursor"))
    return Changes(result=srv.status(int(args.get("limit", queries.LIST_LIMIT)), start))


def op_outcome(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    """What became of the keyed write ``rid``; "not applied" is made final (a tombstone)."""
    return Changes(result=srv.outcome(args["rid"]))


def op_events(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    """A page of cluster events (:meth:`xce_controller.events.EventLog.page`)."""
    log = srv.state.events
    if not log.loaded:
        raise RemoteError(ErrorCode.UNAVAILABLE, "events: this primary is still reading its "
                          "stored events (it was just promoted); retry in a moment")
    return Changes(result=log.page(int(args.get("since_seq", 0)), args.get("kind"),
                                   args.get("since_time"),
                                   int(args.get("limit", events.PAGE_DEFAULT)),
                                   bool(args.get("last", False))))


def op_shutdown(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    who = describe(args["user"], caller.who)
    ch = Changes(result={"server": srv.address})
    ch.after = lambda: srv.request_shutdown(who)
    return ch


def op_reconfig(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return srv.reconfigured(describe(args["user"], caller.who))


ANY = None
SCHED_ONLY = frozenset({SCHEDULER})
WORKER_ONLY = frozenset({WORKER})
NOBODY: frozenset[str] = frozenset()  # no daemon: users' clients only (with users=True)

OPS: dict[str, OpSpec] = {
    "join": OpSpec(op_join, ANY, "write", dedupe=False),
    "hello": OpSpec(op_hello, ANY, "read", needs_jobs=False),
    "heartbeat": OpSpec(op_heartbeat, ANY, "volatile", member_roles=None, dedupe=False,
                        needs_jobs=False),
    "jobsubmit": OpSpec(op_jobsubmit, NOBODY, "write", users=True, acts=True, needs_jobs=False),
    "jobctrl": OpSpec(op_jobctrl, NOBODY, "write", users=True, acts=True),
    "queuectrl": OpSpec(op_queuectrl, NOBODY, "write", users=True, admin=True, acts=True,
                        needs_jobs=False),
    "hostctrl": OpSpec(op_hostctrl, NOBODY, "write", users=True, admin=True, acts=True),
    "jobdispatch": OpSpec(op_jobdispatch, SCHED_ONLY, "write", member_roles=SCHED_ONLY,
                          users=True, admin=True, acts=True),
    "jobdispatch_many": OpSpec(op_jobdispatch_many, SCHED_ONLY, "write",
                               member_roles=SCHED_ONLY, users=True, admin=True, acts=True),
    "set_pend_reason": OpSpec(op_set_pend_reason, SCHED_ONLY, "volatile", member_roles=SCHED_ONLY,
                              users=True, admin=True, acts=True),
    "clear_reason": OpSpec(op_clear_reason, SCHED_ONLY, "volatile", member_roles=SCHED_ONLY,
                           users=True, admin=True, acts=True),
    "update_resvals": OpSpec(op_update_resvals, WORKER_ONLY, "volatile", member_roles=WORKER_ONLY,
                             users=True, admin=True, acts=True),
    "notify_job": OpSpec(op_notify_job, WORKER_ONLY, "write", member_roles=WORKER_ONLY),
    "update_jusage": OpSpec(op_update_jusage, WORKER_ONLY, "volatile", member_roles=WORKER_ONLY),
    "resval": OpSpec(op_resval, ANY, "read"),
    "clusterconf": OpSpec(op_clusterconf, ANY, "read", needs_jobs=False),
    "jobinfo": OpSpec(op_jobinfo, ANY, "read"),
    "hostinfo": OpSpec(op_hostinfo, ANY, "read"),
    "queueinfo": OpSpec(op_queueinfo, ANY, "read"),  # its counts need the jobs loaded
    "status": OpSpec(op_status, ANY, "read", needs_jobs=False),
    "shutdown": OpSpec(op_shutdown, NOBODY, "read", users=True, admin=True, acts=True,
                       dedupe=False, needs_jobs=False),
    # The file is read off the loop before the op runs (Controller._prepare). Not recorded
    # under a key: a repeat reads the file again, which is what a retry should do.
    "reconfig": OpSpec(op_reconfig, NOBODY, "write", users=True, admin=True, acts=True,
                       dedupe=False, needs_jobs=False),
    # May record a tombstone (a durable write) under the rid it names, not under its own.
    "outcome": OpSpec(op_outcome, ANY, "write", dedupe=False, needs_jobs=False),
    "events": OpSpec(op_events, ANY, "read", needs_jobs=False),
    "task_launch": OpSpec(op_task_launch, NOBODY, "write", users=True, acts=True),
    "task_block": OpSpec(op_task_block, NOBODY, "write", users=True, acts=True),
    # Revoked bearer tokens (xce_controller.revocations): a user revokes their own, an
    # administrator anyone's (revoke_tokens checks; revoke_token records whom it acts for).
    # Repeatable, so not recorded under a key: a retry after a lost answer revokes again.
    "revoke_token": OpSpec(op_revoke_token, NOBODY, "write", users=True, acts=True,
                           dedupe=False, needs_jobs=False),
    "revoke_tokens": OpSpec(op_revoke_tokens, NOBODY, "write", users=True, acts=True,
                            dedupe=False, needs_jobs=False),
}


def now() -> float:
    """Wall-clock time for records (a function so tests can patch it)."""
    return time.time()


_UNTYPED = sorted(set(OPS) - set(SCHEMAS))
if _UNTYPED:  # a new op row without its schema: say so at import, not as INTERNAL per request
    raise RuntimeError(f"controller ops without an argument schema in xcecore.schema.ops.OP_ARGS: "
                       f"{', '.join(_UNTYPED)}")
