"""Every controller op: one handler each, and ONE table (:data:`OPS`) that says who may call it.

The table gives, per op: its handler, the roles that may call it (None: any), whether it is a
durable write, a volatile update or a read, which roles must have joined first, which roles
must be an administrator, and its arguments (type, required, default). :func:`check_call`
enforces all of that before the handler runs, so handlers only see valid arguments, and a
refused request never reaches the state. docs/protocol-ops.md documents the same table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from xce_controller.state import Changes, ClusterState
from xcecore.protocol import JOB_STATES
from xcecore.wire import ErrorCode, RemoteError

FRONT_ENDS = frozenset({"apiserver", "cli", "admin"})
WORKER = "worker"
SCHEDULER = "scheduler"


@dataclass(slots=True)
class Caller:
    """Who is calling: the handshake identity and what its join made of it."""

    identity: str
    role: str
    joined: bool = False
    worker_host: str | None = None  # a joined worker's host name
    cid: int = 0  # the server's connection id
    pushes: str = "all"  # what its join subscribed to: "all" or "none"


class ServerView(Protocol):
    """What handlers may ask of the server besides the state."""

    state: ClusterState
    address: str

    def status(self) -> dict[str, Any]: ...

    def subscribe(self, caller: Caller) -> None: ...

    def replace_worker(self, caller: Caller, host: str) -> None: ...

    def request_shutdown(self, by: str) -> None: ...

    def outcome(self, rid: str) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Arg:
    """One argument: accepted JSON types, whether required, and its default."""

    types: tuple[type, ...]
    required: bool = False
    default: Any = None


Handler = Callable[[ServerView, Caller, dict[str, Any], float], Changes]
Kind = Literal["read", "write", "volatile"]


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One row of the op table."""

    handler: Handler
    roles: frozenset[str] | None  # None: any role
    kind: Kind
    member_roles: frozenset[str] | None = frozenset()  # None: every role must have joined
    admin_roles: frozenset[str] = frozenset()  # these roles must be an administrator
    args: dict[str, Arg] = field(default_factory=dict)
    dedupe: bool = True  # store the result under the request's rid

    def needs_join(self, role: str) -> bool:
        return self.member_roles is None or role in self.member_roles


STR, INT, NUM, BOOL, LIST, OBJ = (str,), (int,), (int, float), (bool,), (list,), (dict,)
USER = {"user": Arg(STR)}


def _type_name(types: tuple[type, ...]) -> str:
    return {STR: "str", INT: "int", NUM: "float", BOOL: "bool", LIST: "list", OBJ: "object"}.get(
        types, "/".join(t.__name__ for t in types)
    )


def check_args(op: str, spec: OpSpec, args: dict[str, Any]) -> dict[str, Any]:
    """Validate ``args`` against the op's table row; INVALID names the argument."""
    out: dict[str, Any] = {}
    for name, value in args.items():
        arg = spec.args.get(name) or USER.get(name)
        if arg is None:
            raise RemoteError(ErrorCode.INVALID, f"{op}: unknown argument {name!r}")
        if value is None and not arg.required:
            continue
        bad_bool = isinstance(value, bool) and bool not in arg.types
        if bad_bool or not isinstance(value, arg.types):
            raise RemoteError(
                ErrorCode.INVALID,
                f"{op}: argument {name!r} must be {_type_name(arg.types)}, "
                f"got {type(value).__name__}",
                {"arg": name},
            )
        out[name] = value
    for name, arg in spec.args.items():
        if name not in out:
            if arg.required:
                raise RemoteError(
                    ErrorCode.INVALID, f"{op}: argument {name!r} is required", {"arg": name}
                )
            if arg.default is not None:
                out[name] = arg.default
    return out


def check_call(op: str, caller: Caller, args: dict[str, Any], state: ClusterState) -> tuple[OpSpec, dict[str, Any]]:
    """Everything before the handler: known op, role, join, arguments, admin rights."""
    spec = OPS.get(op)
    if spec is None:
        raise RemoteError(ErrorCode.INVALID, f"unknown op {op!r}")
    if spec.roles is not None and caller.role not in spec.roles:
        raise RemoteError(ErrorCode.DENIED, f"{op}: role {caller.role!r} may not call it")
    if spec.needs_join(caller.role) and not caller.joined:
        raise RemoteError(ErrorCode.NOT_JOINED, f"{op}: join first")
    checked = check_args(op, spec, args)
    if caller.role in FRONT_ENDS and caller.role != "admin" and _needs_user(op, spec):
        if "user" not in checked:
            raise RemoteError(ErrorCode.INVALID, f"{op}: argument 'user' is required", {"arg": "user"})
    if caller.role in spec.admin_roles and not state.is_admin(caller.role, checked.get("user")):
        who = checked.get("user") or caller.identity
        raise RemoteError(ErrorCode.DENIED, f"{op}: {who} is not a cluster administrator")
    return spec, checked


def _needs_user(op: str, spec: OpSpec) -> bool:
    return op in ("jobsubmit", "jobctrl") or bool(spec.admin_roles & FRONT_ENDS)


def _one_of(op: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise RemoteError(
            ErrorCode.INVALID, f"{op}: {name} {value!r} is not one of {', '.join(choices)}",
            {"arg": name},
        )


# -- handlers -----------------------------------------------------------------------------


def op_join(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    role, attrs = args["role"], args.get("attrs", {})
    if role != caller.role:
        raise RemoteError(ErrorCode.DENIED, f"join: handshake says role {caller.role!r}, not {role!r}")
    sub = args.get("subscribe", {})
    pushes = sub.get("pushes", "all")
    if set(sub) - {"pushes"} or pushes not in ("all", "none"):
        raise RemoteError(ErrorCode.INVALID, 'join: subscribe must be {"pushes": "all" | "none"}',
                          {"arg": "subscribe"})
    ch = Changes()
    if role == WORKER:
        hname = attrs.get("hname")
        if not isinstance(hname, str) or not hname:
            raise RemoteError(ErrorCode.INVALID, "join: a worker needs attrs 'hname' (str)", {"arg": "attrs"})
        ch = srv.state.join_worker(attrs, now)
        srv.replace_worker(caller, hname)
        caller.worker_host = hname
    caller.joined, caller.pushes = True, pushes
    member = srv.state.add_member(caller.identity, role, now, None if role == WORKER else attrs, pushes)
    ch.events.extend(member.events)
    ch.result = {"member": caller.identity, "server": srv.address, "role": role}
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
    if not args["command"].strip():
        raise RemoteError(ErrorCode.INVALID, "jobsubmit: argument 'command' is empty", {"arg": "command"})
    if args.get("ntasks", 1) < 1:
        raise RemoteError(ErrorCode.INVALID, "jobsubmit: argument 'ntasks' must be >= 1", {"arg": "ntasks"})
    env = args.get("env", {})
    if not all(isinstance(v, str) for v in env.values()):
        raise RemoteError(ErrorCode.INVALID, "jobsubmit: argument 'env' must map str to str", {"arg": "env"})
    return srv.state.submit(args, now)


JOB_ACTIONS = ("kill", "stop", "resume", "checkpoint", "requeue")


def op_jobctrl(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    _one_of("jobctrl", "action", args["action"], JOB_ACTIONS)
    job = srv.state.job(args["jobid"])
    user = args.get("user")
    if not srv.state.is_admin(caller.role, user) and job["user"] != user:
        raise RemoteError(ErrorCode.DENIED, f"jobctrl: job {job['jobid']} belongs to {job['user']}, not {user}")
    return srv.state.control(args["jobid"], args["action"], now)


def op_queuectrl(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    _one_of("queuectrl", "action", args["action"], ("open", "close", "activate", "inactivate"))
    return srv.state.queue_control(args["queue"], args["action"])


def op_hostctrl(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    _one_of("hostctrl", "action", args["action"], ("open", "close"))
    return srv.state.host_control(args["host"], args["action"], args.get("comment", ""))


def op_jobdispatch(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    alloc = args["alloc"]
    if not alloc:
        raise RemoteError(ErrorCode.INVALID, "jobdispatch: argument 'alloc' is empty", {"arg": "alloc"})
    seen: set[str] = set()
    for a in alloc:
        ok = isinstance(a, dict) and set(a) == {"host", "ntasks"} and isinstance(a["host"], str)
        n = a.get("ntasks") if isinstance(a, dict) else None
        if not ok or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RemoteError(
                ErrorCode.INVALID,
                'jobdispatch: argument \'alloc\' must be a list of {"host": str, "ntasks": int >= 1}',
                {"arg": "alloc"},
            )
        if a["host"] in seen:
            raise RemoteError(ErrorCode.INVALID, f"jobdispatch: host {a['host']} is listed twice", {"arg": "alloc"})
        seen.add(a["host"])
    force = bool(args.get("force", False))
    if force and not srv.state.is_admin(caller.role, args.get("user")):
        raise RemoteError(ErrorCode.DENIED, "jobdispatch: only an administrator may force a dispatch")
    return srv.state.dispatch(args["jobid"], alloc, force)


def op_set_pend_reason(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    reasons: dict[int, str | None] = {}
    for key, reason in args["reasons"].items():
        if not key.isdigit() or not isinstance(reason, str):
            raise RemoteError(
                ErrorCode.INVALID, "set_pend_reason: 'reasons' must map job ids to strings", {"arg": "reasons"}
            )
        reasons[int(key)] = reason
    ch = srv.state.set_reasons(reasons)
    ch.result = {"updated": ch.result}
    return ch


def op_clear_reason(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    ids = args.get("jobids")
    if ids is None:
        ids = [j for j, job in srv.state.jobs.items() if job["pend_reason"] is not None]
    elif not all(isinstance(j, int) and not isinstance(j, bool) for j in ids):
        raise RemoteError(ErrorCode.INVALID, "clear_reason: 'jobids' must be a list of int", {"arg": "jobids"})
    ch = srv.state.set_reasons(dict.fromkeys(ids))
    ch.result = {"cleared": ch.result}
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
    event = args["event"]
    _one_of("notify_job", "event", event, ("start", "finish", "fail", "stop", "resume"))
    needed = {"start": "pid", "finish": "exit_status"}.get(event)
    if needed is not None and needed not in args:
        raise RemoteError(
            ErrorCode.INVALID, f"notify_job: argument {needed!r} is required for {event}", {"arg": needed}
        )
    assert caller.worker_host is not None
    return srv.state.notify(caller.worker_host, args, now)


def op_update_jusage(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    assert caller.worker_host is not None
    return srv.state.set_jusage(caller.worker_host, args["jobid"], args["usage"])


def op_resval(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    names = [args["host"]] if "host" in args else sorted(st.hosts)
    wanted = args.get("names")
    out: dict[str, Any] = {}
    for name in names:
        vals = st.host(name)["resvals"]
        out[name] = {k: v for k, v in vals.items() if k in wanted} if wanted is not None else vals
    return Changes(result={"hosts": out})


def op_clusterconf(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return Changes(result=srv.state.clusterconf())


def op_jobinfo(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    states = set(args.get("states") or ([args["state"]] if "state" in args else []))
    for s in states:
        if s not in JOB_STATES:
            raise RemoteError(ErrorCode.INVALID, f"jobinfo: unknown job state {s!r}", {"arg": "states"})
    owner = args.get("owner")
    if owner is None and caller.role not in FRONT_ENDS:
        owner = args.get("user")
    queue, host, limit = args.get("queue"), args.get("host"), args.get("limit")
    if "jobids" in args:
        jobs = [st.jobs[j] for j in sorted(set(args["jobids"])) if isinstance(j, int) and j in st.jobs]
    else:
        jobs = list(st.jobs.values())
    out = [
        j for j in jobs
        if (not states or j["state"] in states)
        and (owner is None or j["user"] == owner)
        and (queue is None or j["queue"] == queue)
        and (host is None or any(a["host"] == host for a in j["alloc"]))
    ]
    if limit is not None:
        out = out[: max(0, limit)]
    return Changes(result={"jobs": out})


def op_hostinfo(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    names = args.get("hosts") or sorted(st.hosts)
    return Changes(result={"hosts": [st.host(n) for n in names]})


def op_queueinfo(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    st = srv.state
    if "queues" in args:
        qs = [st.queue(n) for n in args["queues"]]
        qs.sort(key=lambda q: (-q["priority"], q["name"]))
    else:
        qs = st.sorted_queues()
    return Changes(result={"queues": qs})


def op_status(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    return Changes(result=srv.status())


def op_outcome(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    """What became of the keyed write ``rid``; "not applied" is made final (a tombstone)."""
    rid = args["rid"]
    if not 0 < len(rid) <= 128:
        raise RemoteError(ErrorCode.INVALID, "outcome: argument 'rid' must be 1-128 chars", {"arg": "rid"})
    return Changes(result=srv.outcome(rid))


def op_shutdown(srv: ServerView, caller: Caller, args: dict[str, Any], now: float) -> Changes:
    who = f"{args['user']} via {caller.identity}" if "user" in args else caller.identity
    ch = Changes(result={"server": srv.address})
    ch.after = lambda: srv.request_shutdown(who)
    return ch


ANY = None
FRONT_SCHED = FRONT_ENDS | {SCHEDULER}
FRONT_WORKER = FRONT_ENDS | {WORKER}
SCHED_ONLY = frozenset({SCHEDULER})
WORKER_ONLY = frozenset({WORKER})

OPS: dict[str, OpSpec] = {
    "join": OpSpec(op_join, ANY, "write", dedupe=False,
                   args={"role": Arg(STR, True), "attrs": Arg(OBJ), "subscribe": Arg(OBJ)}),
    "hello": OpSpec(op_hello, ANY, "read"),
    "heartbeat": OpSpec(op_heartbeat, ANY, "volatile", member_roles=None, dedupe=False),
    "jobsubmit": OpSpec(op_jobsubmit, FRONT_ENDS, "write", args={
        "command": Arg(STR, True), "user": Arg(STR, True), "queue": Arg(STR), "resreq": Arg(STR), "name": Arg(STR),
        "project": Arg(STR), "cwd": Arg(STR), "env": Arg(OBJ), "ntasks": Arg(INT)}),
    "jobctrl": OpSpec(op_jobctrl, FRONT_ENDS, "write",
                      args={"jobid": Arg(INT, True), "action": Arg(STR, True)}),
    "queuectrl": OpSpec(op_queuectrl, FRONT_ENDS, "write", admin_roles=FRONT_ENDS,
                        args={"queue": Arg(STR, True), "action": Arg(STR, True)}),
    "hostctrl": OpSpec(op_hostctrl, FRONT_ENDS, "write", admin_roles=FRONT_ENDS,
                       args={"host": Arg(STR, True), "action": Arg(STR, True), "comment": Arg(STR)}),
    "jobdispatch": OpSpec(op_jobdispatch, FRONT_SCHED, "write", member_roles=SCHED_ONLY,
                          admin_roles=FRONT_ENDS,
                          args={"jobid": Arg(INT, True), "alloc": Arg(LIST, True), "force": Arg(BOOL)}),
    "set_pend_reason": OpSpec(op_set_pend_reason, FRONT_SCHED, "volatile", member_roles=SCHED_ONLY,
                              admin_roles=FRONT_ENDS, args={"reasons": Arg(OBJ, True)}),
    "clear_reason": OpSpec(op_clear_reason, FRONT_SCHED, "volatile", member_roles=SCHED_ONLY,
                           admin_roles=FRONT_ENDS, args={"jobids": Arg(LIST)}),
    "update_resvals": OpSpec(op_update_resvals, FRONT_WORKER, "volatile", member_roles=WORKER_ONLY,
                             admin_roles=FRONT_ENDS, args={"values": Arg(OBJ, True), "host": Arg(STR)}),
    "notify_job": OpSpec(op_notify_job, WORKER_ONLY, "write", member_roles=WORKER_ONLY, args={
        "jobid": Arg(INT, True), "event": Arg(STR, True), "pid": Arg(INT), "exit_status": Arg(INT),
        "reason": Arg(STR), "attempt": Arg(INT)}),
    "update_jusage": OpSpec(op_update_jusage, WORKER_ONLY, "volatile", member_roles=WORKER_ONLY,
                            args={"jobid": Arg(INT, True), "usage": Arg(OBJ, True)}),
    "resval": OpSpec(op_resval, ANY, "read", args={"host": Arg(STR), "names": Arg(LIST)}),
    "clusterconf": OpSpec(op_clusterconf, ANY, "read"),
    "jobinfo": OpSpec(op_jobinfo, ANY, "read", args={
        "jobids": Arg(LIST), "state": Arg(STR), "states": Arg(LIST), "owner": Arg(STR), "queue": Arg(STR),
        "host": Arg(STR), "limit": Arg(INT)}),
    "hostinfo": OpSpec(op_hostinfo, ANY, "read", args={"hosts": Arg(LIST)}),
    "queueinfo": OpSpec(op_queueinfo, ANY, "read", args={"queues": Arg(LIST)}),
    "status": OpSpec(op_status, ANY, "read"),
    "shutdown": OpSpec(op_shutdown, FRONT_ENDS, "read", admin_roles=FRONT_ENDS, dedupe=False),
    # May record a tombstone (a durable write) under the rid it names, not under its own.
    "outcome": OpSpec(op_outcome, ANY, "write", dedupe=False, args={"rid": Arg(STR, True)}),
}


def now() -> float:
    """Wall-clock time for records (a function so tests can patch it)."""
    return time.time()
