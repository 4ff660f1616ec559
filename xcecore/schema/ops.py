"""The argument model of every controller op, and the one function that validates against it.

Each model is a ``TypedDict`` (validation returns a plain dict, which is what the handlers
take) that forbids unknown arguments and takes JSON's types strictly: ``"2"`` is not an int,
``true`` is not a number. Its docstring is the op's contract as ``docs/protocol-ops.md``
shows it; each field's description is its line in the op's argument table. Who may call an
op, its kind (read, write, volatile) and its joins live in the controller's op table
(``xce_controller.ops.OPS``), which takes its argument models from :data:`OP_ARGS`.
"""

from __future__ import annotations

import functools
import threading
from typing import Annotated, Any, Literal, NotRequired

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from xcecore.schema import types as t
from xcecore.schema.errors import invalid
from xcecore.schema.limits import DISPATCH_ELEMENTS_MAX

_STRICT = ConfigDict(extra="forbid", strict=True)


def _d(text: str) -> Any:
    return Field(description=text)


User = Annotated[t.Name, _d("the user a front end (the API server) acts for: required from "
                            "it where marked *user*; anyone else may name only itself")]


@with_config(_STRICT)
class NoArgs(TypedDict):
    """An op that takes no arguments (``user`` is accepted, as by every op)."""

    user: NotRequired[User]


@with_config(_STRICT)
class Subscribe(TypedDict):
    """What a member receives: kind -> scope; a kind left out is not sent (``{}``: nothing
    but ``shutdown``). The older form ``{"pushes": "all" | "none"}`` (alone) means the role's
    default or nothing."""

    cluster: NotRequired[Annotated[Literal["all"], _d("the cluster configuration record")]]
    queues: NotRequired[Annotated[Literal["all"], _d("queue records")]]
    hosts: NotRequired[Annotated[Literal["all", "own"], _d("host records; `own`: the worker's host")]]
    jobs: NotRequired[Annotated[Literal["all", "unfinished", "host"], _d(
        "job records; `unfinished`: pending and active jobs (a job that finishes is sent once "
        "more); `host`: the active jobs on the worker's host")]]
    members: NotRequired[Annotated[Literal["all"], _d("member records (no revs)")]]
    resvals: NotRequired[Annotated[Literal["all", "own"], _d("hosts' monitor values (volatile)")]]
    pend_reasons: NotRequired[Annotated[Literal["all"], _d("pending jobs' reasons (volatile)")]]
    jusage: NotRequired[Annotated[Literal["all"], _d("running jobs' usage (volatile)")]]
    revocations: NotRequired[Annotated[Literal["all"], _d("revoked bearer tokens (the API servers')")]]
    pushes: NotRequired[Annotated[Literal["all", "none"], _d(
        'the older form, alone: `"all"` (the role\'s default) or `"none"` (nothing)')]]


@with_config(_STRICT)
class VolatileSince(TypedDict):
    """Where a member's volatile values stand: the ``volatile`` of its last sync's
    ``sync_begin`` (a primary's term, and a position in that term's volatile changes)."""

    epoch: Annotated[t.StoreId, _d("the term of the primary that synced them")]
    seq: Annotated[t.NonNegative, _d("the position in that term's volatile changes")]


@with_config(_STRICT)
class Since(TypedDict):
    """Where a member's copy stands: the store it came from and the highest rev it holds."""

    store: Annotated[t.StoreId, _d("the store id of the member's last completed sync")]
    rev: Annotated[t.NonNegative, _d("the highest rev it holds from that store")]
    volatile: NotRequired[Annotated[VolatileSince, _d(
        "where its volatile values stand; absent: they are sent whole")]]


@with_config(_STRICT)
class JoinArgs(TypedDict):
    """Make this connection a member.

    ``role`` must equal the handshake role, else DENIED. A joining host (role ``worker``)
    gives its attributes in ``attrs`` (see *Host attributes*): the join creates the host or
    updates its attributes, and makes an unavailable host available again (``state`` ok, or
    closed if an admin closed it). A newer worker join for the same host replaces (closes) an
    older connection of that host.

    ``subscribe`` absent: the role's default -- a worker ``{"cluster", "queues": all,
    "hosts": own, "jobs": host, "resvals": own}``, every other role every kind (``all``).

    Result: ``{"member": "<identity>", "server": "<host:port>", "role": "<role>", "sync":
    {"mode": "snapshot" | "delta", "store": "<store id>", "rev": S}}`` (``sync`` null when the
    member subscribed to nothing). After the reply the controller streams the sync
    (``sync_begin``, ``sync_records``/``sync_removed`` frames, ``sync_end``), then deltas;
    ``delta`` when ``since`` names this store and a rev inside the retention window (not for
    a worker's host-scoped view, whose snapshot is small), else ``snapshot``; a join without
    ``since`` is one with ``since`` null (a snapshot). Joining again on the same connection
    starts a new sync (seq keeps counting).
    """

    role: Annotated[t.Name, _d("the role joining; must equal the handshake's")]
    attrs: NotRequired[Annotated[t.JsonObject, _d("the member's attributes (default `{}`)")]]
    subscribe: NotRequired[Annotated[Subscribe, _d("kind -> scope (default: the role's)")]]
    since: NotRequired[Annotated[Since | None, _d(
        "the member's resume point, null (or absent) when it has completed no sync")]]
    user: NotRequired[User]


@with_config(ConfigDict(extra="ignore", strict=True))
class HostAttrs(TypedDict):
    """Host attributes, the ``attrs`` of a worker's ``join``.

    Other keys (``ncores``, ``nthreads``, site string and numeric resources, ...) are
    kept as they are, within the bounds of a free-form object.
    """

    hname: Annotated[t.Name, _d("the host's name")]
    ncpus: NotRequired[Annotated[t.Count, _d("logical CPUs")]]
    max_slots: NotRequired[Annotated[t.Count, _d("job slots (default: ncpus, else 1)")]]
    resources: NotRequired[Annotated[t.Names, _d("the host's boolean resources")]]
    type: NotRequired[Annotated[t.Name, _d("host type (LSF `hostType`), e.g. X86_64")]]
    model: NotRequired[Annotated[t.Label, _d("host model (LSF `hostModel`), e.g. the CPU")]]
    cpuf: NotRequired[Annotated[t.Amount, _d("CPU factor")]]
    maxmem: NotRequired[Annotated[t.Amount, _d("memory (MB)")]]
    maxswp: NotRequired[Annotated[t.Amount, _d("swap (MB)")]]
    maxtmp: NotRequired[Annotated[t.Amount, _d("temporary space (MB)")]]


@with_config(_STRICT)
class HelloArgs(TypedDict):
    """Result: ``{"server": "<host:port>", "state": "primary", "time": <float epoch>,
    "joined": <bool>}``. A worker re-joins after ``hello`` when a rejoin is pending."""

    user: NotRequired[User]


@with_config(_STRICT)
class HeartbeatArgs(TypedDict):
    """Result: ``{"time": <float epoch>}``. A worker's heartbeat keeps its host available: a
    host whose worker has not sent a heartbeat (or joined) for ``[controller] host_timeout``
    seconds becomes ``unavail``."""

    user: NotRequired[User]


@with_config(_STRICT)
class JobSubmitArgs(TypedDict):
    """Submit a job. Result: ``{"jobid": <int>, "queue": "<name>", "state": "PEND"}``.

    Errors: NOT_FOUND (queue), CONFLICT (queue closed). The resource requirement is stored
    as text; the scheduler evaluates it. Job ids start at 1 and are never reused (also not
    after the highest ones are purged). The job records its owner (``user``: the
    authenticated caller, or the user a front end names), ``uid``/``gid`` (a direct caller's
    authenticated ones, which a worker with ``run_as_user`` runs it as; null for a front
    end's user, whose name the worker looks up) and ``via`` (the front end's ``role@host``,
    or null).
    """

    command: Annotated[t.Command, _d("the command line (run by the worker as `sh -c`)")]
    user: NotRequired[Annotated[t.Name, _d("the job's owner when a front end submits it; "
                                           "otherwise the authenticated caller")]]
    queue: NotRequired[Annotated[t.Name, _d("default: `[controller] default_queue`")]]
    resreq: NotRequired[Annotated[t.ResReq, _d('default `""`')]]
    name: NotRequired[Annotated[t.Label, _d('the job\'s name; default `""`')]]
    project: NotRequired[Annotated[t.Name, _d('default `"default"`')]]
    cwd: NotRequired[Annotated[t.WorkDir, _d('working directory; default `""` (the worker\'s)')]]
    env: NotRequired[Annotated[t.Env, _d("environment variables; default `{}`")]]
    ntasks: NotRequired[Annotated[t.Count, _d("tasks (slots); default 1")]]
    mem_limit: NotRequired[Annotated[t.MemLimit, _d("memory limit of the job's group on each host, "
                                                    "bytes (`-M`); default none")]]
    run_limit: NotRequired[Annotated[t.RunLimit, _d("seconds the job may run, time stopped not "
                                                    "counted (`-W`); then SIGTERM, SIGKILL after "
                                                    "`kill_grace`; default none")]]
    stdout: NotRequired[Annotated[t.JobPath, _d("output file, appended to, relative to `cwd` "
                                                "(`-o`); default the worker's spool")]]
    stderr: NotRequired[Annotated[t.JobPath, _d("error file (`-e`); default: with `stdout` if "
                                                "given, else the worker's spool")]]
    stdin: NotRequired[Annotated[t.JobPath, _d("input file (`-i`); default `/dev/null`")]]
    exclusive: NotRequired[Annotated[bool, _d(
        "hosts to itself (`-x`); default false. The scheduler places it on idle hosts; the "
        "controller refuses any dispatch, forced ones too, that would share a host with it")]]
    depend: NotRequired[Annotated[t.DependText, _d(
        "a dependency (LSF `-w`: `done(12) && (exit(13, >2) || ended(\"prep\"))`, by id, "
        "`ID[INDEX]` or your job's name; Slurm `--dependency`: `afterok:12:13,afterany:14`): "
        "the job waits (`waiting` says on what) until it holds")]]
    array: NotRequired[Annotated[t.ArrayText, _d(
        "a job array (`-J name[1-1000:2]%50`, `--array`): one record holds its pending "
        "indexes; each element becomes a job of its own, `ARRAY[INDEX]`, when dispatched. "
        "The result adds `array` (its canonical text) and `size` (its elements)")]]


JobAction = Literal["kill", "stop", "resume", "checkpoint", "requeue"]
QueueAction = Literal["open", "close", "activate", "inactivate"]
HostAction = Literal["open", "close"]


@with_config(_STRICT)
class JobCtrlArgs(TypedDict):
    """Act on a job; the caller (a front end's ``user``) must own it unless an administrator
    or its role holds a grant of ``jobctrl``. Result: the job record after the action.

    | action | from state | effect |
    |---|---|---|
    | `kill` | PEND, PSUSP | -> EXIT (`reason` "killed by owner NAME" / "by administrator NAME") |
    | `kill` | RUN, USUSP, SSUSP, UNKWN | `signal` "kill" to its hosts, `reason` as above; ends at its end report |
    | `stop` | PEND | -> PSUSP |
    | `stop` | RUN, SSUSP | -> USUSP, `signal` "stop" |
    | `resume` | PSUSP | -> PEND |
    | `resume` | USUSP, SSUSP | -> RUN, `signal` "resume" |
    | `checkpoint` | RUN | `signal` "checkpoint" (no state change) |
    | `requeue` | RUN, USUSP, SSUSP, UNKWN | `signal` "kill" to the old hosts, -> PEND, alloc cleared, `attempt` + 1 |
    | `requeue` | DONE, EXIT | -> PEND, `attempt` + 1 |

    Any other combination is CONFLICT (e.g. killing a finished job, stopping a stopped one).

    An array's ``jobid`` acts on every element the action applies to (``kill`` also ends
    its pending indexes, counted EXIT; ``stop`` holds them, ``resume`` releases them;
    CONFLICT when it applies to none); with ``index``, on that element only (a pending index
    can be killed -> an EXIT element, or stopped -> a PSUSP element; NOT_FOUND if the array
    has no such index). An element's own job id acts on it like any job's.
    """

    jobid: Annotated[t.JobId, _d("the job")]
    action: Annotated[JobAction, _d("what to do")]
    index: NotRequired[Annotated[t.ArrayIndex, _d("an array's element (INVALID for a job "
                                                  "that is not an array)")]]
    user: NotRequired[User]


@with_config(_STRICT)
class QueueCtrlArgs(TypedDict):
    """Admin. Result: the queue record. Closed queues refuse ``jobsubmit`` (CONFLICT);
    inactive queues accept jobs but nothing is dispatched from them (``jobdispatch``
    CONFLICT, even forced)."""

    queue: Annotated[t.Name, _d("the queue")]
    action: Annotated[QueueAction, _d("what to do")]
    user: NotRequired[User]


TokenId = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                                description="a token's id (its JWT ``jti``)")]


@with_config(_STRICT)
class RevokeTokenArgs(TypedDict):
    """Revoke one bearer token of the user the request acts for (an API server's logout or
    refresh), until ``expires``: every API server then refuses it. The record applies only to
    a token of that user. Refused with CONFLICT when the user already holds the most revoked
    tokens that have not expired (``xce_controller.revocations.MAX_PER_USER``); INVALID when
    ``expires`` is more than 30 days ahead. A token that has expired already needs no record.
    Result: ``{key, revoked, record}``."""

    jti: TokenId
    expires: Annotated[t.Epoch, _d("when the token expires (its ``exp``): the record lasts until then")]
    user: NotRequired[User]


@with_config(_STRICT)
class RevokeTokensArgs(TypedDict):
    """Revoke every token of ``target`` issued before now (a compromised account): every API
    server refuses them, tokens issued later work. A user may revoke their own; an
    administrator anyone's (else DENIED). Result: ``{key, revoked, record}``."""

    target: Annotated[t.Name, _d("the user whose tokens are revoked")]
    until: NotRequired[Annotated[t.Epoch, _d(
        "when the last of those tokens expires (now + the API servers' ``token_ttl``): the "
        "record lasts until then; at most 30 days ahead (the default: no token lives longer)")]]
    user: NotRequired[User]


@with_config(_STRICT)
class HostCtrlArgs(TypedDict):
    """Admin. Result: the host record. A closed host gets no new jobs (``jobdispatch``
    CONFLICT unless forced); running jobs go on."""

    host: Annotated[t.Name, _d("the host")]
    action: Annotated[HostAction, _d("what to do")]
    comment: NotRequired[Annotated[t.Label, _d('default `""`')]]
    user: NotRequired[User]


@with_config(_STRICT)
class AllocEntry(TypedDict):
    """Tasks on one host."""

    host: Annotated[t.Name, _d("the host")]
    ntasks: Annotated[t.Count, _d("tasks on it")]


def check_distinct(hosts: list[str]) -> None:
    """An allocation names each host once (the wire's ``alloc`` and the REST force-run's)."""
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            raise ValueError(f"host {host} is listed twice")
        seen.add(host)


def _distinct_hosts(alloc: list[AllocEntry]) -> list[AllocEntry]:
    check_distinct([entry["host"] for entry in alloc])
    return alloc


Alloc = Annotated[list[AllocEntry], Field(min_length=1, max_length=t.lim.ALLOC_MAX),
                  AfterValidator(_distinct_hosts),
                  t.Shape("alloc", f'a list, each {{"host": name, "ntasks": int >= 1}}; 1 to '
                                          f"{t.lim.ALLOC_MAX:,} distinct hosts")]


@with_config(_STRICT)
class JobDispatchArgs(TypedDict):
    """Run a pending job on ``alloc`` (the scheduler's allocation, or an administrator's
    force-run like LSF ``brun``). Result: ``{"jobid", "state": "RUN", "alloc"}``.

    Errors: NOT_FOUND (job); INVALID when the tasks do not sum to the job's ``ntasks``;
    CONFLICT when the job is not PEND, its queue is inactive, a host is unknown,
    unavailable, closed (unless forced) or has too few free slots (unless forced). A forced
    dispatch never goes to an unavailable host. The job becomes RUN with ``alloc`` set, the
    hosts' ``used_slots`` grow, and the job is pushed to the workers of those hosts, which
    start it and report ``notify_job start``.

    An array (``jobid`` of an array's record) dispatches its lowest pending indexes, one on
    ``alloc`` and one on each of ``more``, each becoming an element record with a job id of
    its own; CONFLICT when the array is stopped, has fewer pending indexes, or its `%limit`
    would be passed (an element record that is pending again counts against it too). The
    result adds ``elements``: ``[{"jobid", "index", "alloc"}, ...]``.
    """

    jobid: Annotated[t.JobId, _d("the job")]
    alloc: Annotated[Alloc, _d("tasks per host, summing to the job's `ntasks`")]
    more: NotRequired[Annotated[list[Alloc], Field(max_length=t.lim.DISPATCH_MORE_MAX), _d(
        "an array only: one more element on each of these allocations, in the same write")]]
    force: NotRequired[Annotated[bool, _d("default false; only an administrator may force")]]
    user: NotRequired[User]


@with_config(_STRICT)
class DispatchItem(TypedDict):
    """One allocation of a ``jobdispatch_many`` batch: what one ``jobdispatch`` would carry
    (never forced)."""

    jobid: Annotated[t.JobId, _d("the job")]
    alloc: Annotated[Alloc, _d("tasks per host, summing to the job's `ntasks`")]
    more: NotRequired[Annotated[list[Alloc], Field(max_length=t.lim.DISPATCH_MORE_MAX), _d(
        "an array only: one more element on each of these allocations")]]


def _bounded_batch(args: JobDispatchManyFields) -> JobDispatchManyFields:
    elements = sum(1 + len(item.get("more", ())) for item in args["dispatches"])
    if elements > DISPATCH_ELEMENTS_MAX:
        raise ValueError(f"dispatches: {elements:,} allocations in all (with `more`), at most "
                         f"{DISPATCH_ELEMENTS_MAX:,}")
    return args


@with_config(_STRICT)
class JobDispatchManyFields(TypedDict):
    """Run many pending jobs, each on its allocation, in ONE write (one commit, one record
    under the request's idempotency key): the scheduler's batch of one picker pass. Result:
    ``{"dispatched": <int>, "refused": <int>, "results": [...]}``, one entry per item in
    the request's order: ``{"jobid", "state": "RUN"}`` (an array adds ``elements``:
    ``[{"jobid", "index"}, ...]``), or ``{"jobid", "code", "message"}`` for an item refused
    with the error ``jobdispatch`` would have given it (NOT_FOUND, INVALID, CONFLICT). Each
    item is checked against the state as the items before it left it (two items taking the
    same free slots: the second is refused); a refused item changes nothing and never fails
    the rest. The items accepted become RUN as ``jobdispatch`` says (slots taken, pushed to
    their hosts' workers, a host's record once per batch). Nothing is forced: a forced
    dispatch is ``jobdispatch`` with ``force``. A repeat of the key is answered the stored
    result (nothing dispatched twice); a batch that dispatched nothing is not recorded.

    INVALID (nothing applied) when an item is malformed or the items hold more than 10,000
    allocations in all (each item's one plus its ``more``). An item may name a job an
    earlier item dispatched (refused: not PEND) or an array again (its next indexes).
    """

    dispatches: Annotated[list[DispatchItem], Field(
        min_length=1, max_length=t.lim.DISPATCH_BATCH_MAX),
        _d(f"1 to {t.lim.DISPATCH_BATCH_MAX:,} items, each a job's `jobid`, `alloc` and (an "
           "array) `more`, as `jobdispatch` takes them")]
    user: NotRequired[User]


JobDispatchManyArgs = Annotated[JobDispatchManyFields, AfterValidator(_bounded_batch)]


@with_config(_STRICT)
class SetPendReasonArgs(TypedDict):
    """Set the pend reasons of pending jobs (ids of jobs that are not pending are skipped).
    Result: ``{"updated": <int>}``. Pushes ``pend_reasons``."""

    reasons: Annotated[t.PendReasons, _d("job id -> reason")]
    user: NotRequired[User]


@with_config(_STRICT)
class ClearReasonArgs(TypedDict):
    """Clear pend reasons. Result: ``{"cleared": <int>, "more": <bool>}``. Pushes
    ``pend_reasons``. Without ``jobids`` at most 10,000 reasons are cleared per call, in job
    id order; ``more`` says some are left (call again)."""

    jobids: NotRequired[Annotated[t.JobIds, _d("default: every job with a reason")]]
    user: NotRequired[User]


@with_config(_STRICT)
class UpdateResvalsArgs(TypedDict):
    """Replace a host's monitor values (``r15s``, ``r1m``, ``mem``, ``ut``, ...). Result:
    ``{"host": "<name>"}``. Pushes ``resvals``. NOT_FOUND for an unknown host."""

    values: Annotated[t.ResVals, _d("resource name -> value")]
    host: NotRequired[Annotated[t.Name, _d("a worker may omit it or name only its own host; "
                                           "front ends must give it")]]
    user: NotRequired[User]


NotifyEvent = Literal["start", "finish", "fail", "stop", "resume", "alive", "task_start",
                      "task_finish", "task_fail"]
_NEEDS = {"start": "pid", "finish": "exit_status", "task_start": "pid",
          "task_finish": "exit_status"}


@with_config(_STRICT)
class NotifyJobFields(TypedDict):
    """Worker only; the job must be allocated to the caller's host (else DENIED).

    | event | args | effect |
    |---|---|---|
    | `start` | `pid` (required) | sets `pid`, `start_time`; RUN (USUSP if stopped first); UNKWN: as `alive` |
    | `finish` | `exit_status` (required) | 0 -> DONE, else EXIT; slots released; `signal` cleared |
    | `fail` | `reason` (default "failed"), `exit_status` (optional) | -> EXIT with `reason` |
    | `stop` | — | RUN -> SSUSP (USUSP stays) |
    | `resume` | — | USUSP, SSUSP -> RUN |
    | `alive` | — | UNKWN -> the state it had before its host was lost (its worker runs it); else no change |
    | `task_start` | `task`, `pid` | the job's task `task` (``task_launch``) runs on the caller's host |
    | `task_finish` | `task`, `exit_status` | the task ended (its `usage` adds to the job's) |
    | `task_fail` | `task`, `reason` | the task could not start |

    A `start` of a job allocated to several hosts carries `task_key`, the SHA-256 (hex) of
    the secret its worker gave the job (``XCE_TASK_SECRET``): ``task_launch`` checks it.
    Task reports are accepted also after the job ended (its other tasks are killed then).

    Every report may carry ``time``, the worker's clock when it happened (it becomes the
    job's ``start_time`` / ``end_time``, so a report delivered after an outage keeps the true
    time; bounded by the controller's clock: never later than its now, never before the job's
    submission for a start or its start for an end). ``finish`` and ``fail`` may carry the final
    ``usage`` and an ``exit_reason``
    (``xcecore.jobspec.EXIT_REASONS``); a ``finish`` whose reason is not ``done`` is EXIT
    whatever its status, with the reason in words: ``memory limit exceeded``, ``run limit
    reached``, ``killed``, ``killed by signal 9``, ``exit code 3`` (without a reason, a
    non-zero status reads ``exit status 3``).

    If ``attempt`` is given and is not the job's current ``attempt``: CONFLICT (a report
    about a run that was requeued). ``finish``/``fail`` of a job already DONE or EXIT returns
    the record unchanged (a completion re-delivered after a failover). Any other state
    mismatch is CONFLICT. Result: the job record.
    """

    jobid: Annotated[t.JobId, _d("the job")]
    event: Annotated[NotifyEvent, _d("what happened")]
    pid: NotRequired[Annotated[t.Pid, _d("required for `start`")]]
    exit_status: NotRequired[Annotated[t.ExitStatus, _d("required for `finish`")]]
    reason: NotRequired[Annotated[t.Label, _d("for `fail`")]]
    attempt: NotRequired[Annotated[t.Attempt, _d("the run this report is about")]]
    task: NotRequired[Annotated[t.TaskId, _d("`task_*`: the task (from `task_launch`)")]]
    task_key: NotRequired[Annotated[t.TaskKey, _d("`start` of a multi-host job: SHA-256 (hex) "
                                                  "of the job's task secret")]]
    time: NotRequired[Annotated[t.Epoch, _d("the worker's clock when it happened: the job's "
                                            "`start_time` / `end_time` (default: the "
                                            "controller's clock on arrival)")]]
    usage: NotRequired[Annotated[t.JsonObject, _d("`finish`, `fail`: the final usage, kept as the "
                                                  "job's `usage`")]]
    exit_reason: NotRequired[Annotated[t.ExitReason, _d("`finish`, `fail`: how it ended; a `finish` "
                                                        "with a reason other than `done` is EXIT "
                                                        "with the reason in words")]]
    user: NotRequired[User]


def _event_needs(args: NotifyJobFields) -> NotifyJobFields:
    if args["event"].startswith("task_") and "task" not in args:
        raise ValueError(f"argument 'task' is required for {args['event']}")
    needed = _NEEDS.get(args["event"])
    if needed is not None and needed not in args:
        raise ValueError(f"argument {needed!r} is required for {args['event']}")
    return args


NotifyJobArgs = Annotated[NotifyJobFields, AfterValidator(_event_needs)]


@with_config(_STRICT)
class TaskLaunchArgs(TypedDict):
    """From inside a running job (like LSF's blaunch): start ``command`` once on each of
    ``hosts``, through their workers. Only the job itself may: the caller must act for the
    job's owner *and* present the job's task secret (``XCE_TASK_SECRET`` in the job's
    environment); an administrator is no exception. Every host must be in the job's
    allocation (INVALID naming the others) and available (CONFLICT naming the others, in
    ``error.unavailable``); the job must be RUN (CONFLICT). While launches
    are blocked (``task_block``) the answer is CONFLICT with ``error.blocked`` true (the CLI
    waits and tries again). Result: ``{"jobid", "tasks": [<task id>, ...]}`` in the order of
    ``hosts``; the tasks are listed in the job record's ``tasks``."""

    jobid: Annotated[t.JobId, _d("the job the caller runs in (XCE_JOBID)")]
    hosts: Annotated[list[t.Name], Field(min_length=1, max_length=t.lim.TASK_HOSTS_MAX),
                     _d("a host of the allocation per task (a host may repeat)")]
    command: Annotated[t.Command, _d("run by /bin/sh -c on each host")]
    secret: Annotated[t.TaskSecret, _d("the job's task secret (XCE_TASK_SECRET)")]
    user: NotRequired[User]


@with_config(_STRICT)
class TaskBlockArgs(TypedDict):
    """The job's owner (or an administrator): ``block`` pauses the job's task launches (a
    ``task_launch`` meanwhile is refused with ``error.blocked``; ``xce task launch`` waits),
    ``unblock`` resumes them. Tasks already running are not touched. Result: the job record.
    CONFLICT unless the job is active."""

    jobid: Annotated[t.JobId, _d("the job")]
    action: Annotated[Literal["block", "unblock"], _d("pause or resume task launches")]
    user: NotRequired[User]


@with_config(_STRICT)
class UpdateJusageArgs(TypedDict):
    """Worker only, job on its host. Result: ``{"jobid"}``. Pushes ``jusage``."""

    jobid: Annotated[t.JobId, _d("the job")]
    usage: Annotated[t.JsonObject, _d("the worker sends `utime`, `stime`, `cputime` (s), `mem`, "
                                      "`max_mem` (MB, the peak so far), `swap` where accounted, "
                                      "`nprocs`, `pids`")]
    task: NotRequired[Annotated[t.TaskId, _d("a launched task's usage (a parallel job's task on "
                                             "this host), not the job's first task's: the job's "
                                             "figure pushed is the sum over its tasks")]]
    user: NotRequired[User]


@with_config(_STRICT)
class ResvalArgs(TypedDict):
    """Result: ``{"hosts": {"<host>": {"<resource>": value}}, "next": cursor | null}`` with
    the hosts' current monitor values, a page of hosts by name when ``host`` is not given."""

    host: NotRequired[Annotated[t.Name, _d("only this host")]]
    names: NotRequired[Annotated[t.Names, _d("only these resources")]]
    limit: NotRequired[Annotated[t.PageLimit, _d("hosts per page (default 1,000)")]]
    cursor: NotRequired[Annotated[t.Cursor, _d("the `next` of the previous page")]]
    user: NotRequired[User]


@with_config(_STRICT)
class ClusterConfArgs(TypedDict):
    """Result: the cluster configuration object (same as ``state.cluster``): ``{"name",
    "resources" (site resource definitions from [cluster] resources), "admins",
    "default_queue", "host_timeout", "host_groups", "user_groups", "queues" (names in
    priority order)}``."""

    user: NotRequired[User]


@with_config(_STRICT)
class JobInfoArgs(TypedDict):
    """Jobs, filtered (all filters optional, combined with AND), one page at a time.

    Result: ``{"jobs": [job, ...], "next": cursor | null}`` in job id order. Pass ``next``
    back as ``cursor`` (with the same filters) for the following page; ``null``: no more.
    Paging is in job id order, so a job that matches throughout is returned exactly once
    while the cluster changes. A page holds at most ``limit`` jobs (default 100, at most
    1,000) and about 512 KiB; the controller looks at a bounded number of jobs per request,
    so a page may come back short (even empty) with a ``next``: keep going until ``next`` is
    null. Every filter is answered from an index (per state, owner, queue, host, name, id),
    so a query that matches nothing costs nothing. ``user`` from front ends is the caller and
    does not filter; use ``owner`` to filter by owner (other callers' ``user`` filters by
    owner). A cursor from another query is INVALID."""

    jobids: NotRequired[Annotated[t.PageJobIds, _d("only these jobs")]]
    state: NotRequired[Annotated[t.JobState, _d("only jobs in this state")]]
    states: NotRequired[Annotated[t.JobStates, _d("only jobs in these states")]]
    owner: NotRequired[Annotated[t.Name, _d("only this user's jobs")]]
    queue: NotRequired[Annotated[t.Name, _d("only this queue's jobs")]]
    host: NotRequired[Annotated[t.Name, _d("only jobs allocated to this host")]]
    name: NotRequired[Annotated[t.Label, _d("only jobs of this name")]]
    min_jobid: NotRequired[Annotated[t.JobId, _d("only jobs with this id or higher")]]
    max_jobid: NotRequired[Annotated[t.JobId, _d("only jobs with this id or lower")]]
    array: NotRequired[Annotated[t.JobId, _d("only the element records of this array")]]
    limit: NotRequired[Annotated[t.PageLimit, _d("jobs per page (default 100)")]]
    cursor: NotRequired[Annotated[t.Cursor, _d("the `next` of the previous page")]]
    user: NotRequired[User]


@with_config(_STRICT)
class HostInfoArgs(TypedDict):
    """Result ``{"hosts": [host, ...], "next": cursor | null}`` by name: the named hosts, or
    a page of every host. An unknown name is NOT_FOUND."""

    hosts: NotRequired[Annotated[t.PageNames, _d("only these hosts")]]
    limit: NotRequired[Annotated[t.PageLimit, _d("hosts per page (default 1,000)")]]
    cursor: NotRequired[Annotated[t.Cursor, _d("the `next` of the previous page")]]
    user: NotRequired[User]


@with_config(_STRICT)
class QueueInfoArgs(TypedDict):
    """Result ``{"queues": [queue, ...], "counts": {"<queue>": {"<state>": n}}}``: the
    queues by priority, highest first, and how many jobs each holds in each state (states
    with none left out). An unknown name is NOT_FOUND."""

    queues: NotRequired[Annotated[t.Names, _d("only these queues")]]
    user: NotRequired[User]


@with_config(_STRICT)
class StatusArgs(TypedDict):
    """Result: ``{"server": "<this candidate>", "state": "primary", "primary": "<host:port>",
    "since": <float epoch of promotion>, "candidates": [{"address", "state", "pid",
    "since"}], "jobs": <int>, "hosts": <int>, "members": <int>, "roles": {"<role>": <int>},
    "member_list": [member, ...], "next": cursor | null, "store": "<store id>", "rev": <int>,
    "loading": <bool>, "promotion": {...}, "backend": {"backend": "file" | "etcd", ...}}``:
    a page of members by identity (default 1,000), each with its ``joined_at``, ``last_seen``
    and ``subscribe``. ``candidates`` lists every
    candidate registered in the state directory whose process is alive; ``loading`` is true
    while a new primary still loads its jobs. ``backend`` with etcd also has ``endpoints``,
    ``prefix``, ``leader`` (the lease holder), ``lease_ttl`` and ``lease_left`` (seconds the
    primary can still prove its lease)."""

    limit: NotRequired[Annotated[t.PageLimit, _d("members per page (default 1,000)")]]
    cursor: NotRequired[Annotated[t.Cursor, _d("the `next` of the previous page")]]
    user: NotRequired[User]


@with_config(_STRICT)
class ShutdownArgs(TypedDict):
    """Admin. Result ``{"server": "<host:port>"}``; then the controller pushes ``shutdown``
    to every member, commits what is pending, gives up the primary lock and exits. Standbys
    then promote (a shutdown stops one candidate, not the cluster)."""

    user: NotRequired[User]


@with_config(_STRICT)
class ReconfigArgs(TypedDict):
    """Admin. The primary reads its configuration file again (as at SIGHUP) and applies what
    can change without a restart: queues (new ones created, priorities and descriptions),
    administrators, grants, service users, host and user groups, the default queue and the
    host timeout. Result ``{"queues_added": [...], "queues_changed": [...],
    "restart_needed": [...]}``, the last naming settings that changed in the file but keep
    their running value until a restart (listen, state_dir, peers, auth, resources, ...).
    A file that does not load is ``INVALID`` naming the problem; nothing changes. Standbys
    read their own files at SIGHUP."""

    user: NotRequired[User]


@with_config(_STRICT)
class EventsArgs(TypedDict):
    """A page of cluster events, oldest first. Result ``{"events": [event, ...], "next":
    <int>, "more": <bool>, "oldest": <int>, "newest": <int>}``; each event is ``{"seq": <int>,
    "time": <float epoch>, "kind": "<kind>", ...its fields, "text": "<one human line>"}``.
    Kinds: ``promotion`` (``primary``, ``old_primary``, ``how`` hot/cold, ``takeover_ms``:
    from winning the election to serving, ``catch_up_ms``, ``changes``), ``member_join`` /
    ``member_leave`` (``identity``, ``role``, ``candidate``), ``host_state`` (``host``,
    ``state``: added, closed, opened, unavail, back; ``by``, ``comment``), ``queue_state``
    (``queue``, ``state``: opened, closed, active, inactive, created, removed; ``by``),
    ``reconfig`` (``by``, ``queues_added``, ``queues_changed``, ``queues_removed``),
    ``shutdown`` (``server``, ``by``). Pass ``next`` as the following page's ``since_seq``:
    every event comes exactly once, also while new ones are recorded; ``more`` says a full
    page is waiting. ``oldest`` is the oldest seq kept (older ones expired: ``[controller]
    events_retention``, ``events_max``). A cursor beyond ``newest`` or an unknown kind is
    ``INVALID``; ``UNAVAILABLE`` while a new primary still reads its stored events (retry).
    Costs the page, not the history."""

    since_seq: NotRequired[Annotated[t.NonNegative, _d("events after this seq (default 0: "
                                                       "from the oldest kept)")]]
    kind: NotRequired[Annotated[t.Name, _d("only events of this kind")]]
    since_time: NotRequired[Annotated[t.Epoch, _d("only events at or after this time")]]
    limit: NotRequired[Annotated[t.PageLimit, _d("events per page (default 100)")]]
    last: NotRequired[Annotated[bool, _d("the newest `limit` matching events instead of the "
                                         "first")]]
    user: NotRequired[User]


@with_config(_STRICT)
class OutcomeArgs(TypedDict):
    """What became of the keyed write ``rid``, answered from the idempotency table. Result,
    one of:

    - ``{"rid": K, "outcome": "applied", "result": <the write's stored result>}``
    - ``{"rid": K, "outcome": "pending"}``: applied on this primary and being committed; ask again
    - ``{"rid": K, "outcome": "not_applied"}``: final. When K was unknown, a tombstone is
      committed under it before this reply (durable like a write, kept for ``idem_ttl``); any
      later request with ``rid`` K is answered ``CONFLICT`` (``error.outcome`` "not_applied")
      and not applied. Send the write again under a new key if it is still wanted.

    A read, or a write when it records a tombstone. The request's own ``rid`` is not recorded
    (asking twice is fine). ``xce outcome K`` asks it from the command line; clients have
    ``client.outcome(K)``.
    """

    rid: Annotated[t.Rid, _d("the idempotency key of a write whose outcome the caller does not know")]
    user: NotRequired[User]


OP_ARGS: dict[str, Any] = {
    "join": JoinArgs,
    "hello": HelloArgs,
    "heartbeat": HeartbeatArgs,
    "jobsubmit": JobSubmitArgs,
    "jobctrl": JobCtrlArgs,
    "queuectrl": QueueCtrlArgs,
    "hostctrl": HostCtrlArgs,
    "jobdispatch": JobDispatchArgs,
    "jobdispatch_many": JobDispatchManyArgs,
    "set_pend_reason": SetPendReasonArgs,
    "clear_reason": ClearReasonArgs,
    "update_resvals": UpdateResvalsArgs,
    "notify_job": NotifyJobArgs,
    "update_jusage": UpdateJusageArgs,
    "resval": ResvalArgs,
    "clusterconf": ClusterConfArgs,
    "jobinfo": JobInfoArgs,
    "hostinfo": HostInfoArgs,
    "queueinfo": QueueInfoArgs,
    "status": StatusArgs,
    "shutdown": ShutdownArgs,
    "reconfig": ReconfigArgs,
    "outcome": OutcomeArgs,
    "events": EventsArgs,
    "task_launch": TaskLaunchArgs,
    "task_block": TaskBlockArgs,
    "revoke_token": RevokeTokenArgs,
    "revoke_tokens": RevokeTokensArgs,
}
"""Op name (:data:`xcecore.protocol.OP_NAMES`) -> its argument model (a TypedDict, or an
``Annotated`` one with a validator)."""


_BUILDING = threading.Lock()
"""One validator is built at a time: a controller builds them on a thread while it stands by
and any it still lacks on first use on its loop (pydantic does not promise that building
the same type on two threads at once is safe)."""


class ArgsSchema:
    """One op's compiled validator: ``check(args)`` returns the validated arguments or raises
    :class:`~xcecore.wire.RemoteError` (INVALID naming the argument and the limit).

    The pydantic validator is built on first use, not at import: building all of them cost
    0.2-0.6 s of every controller start (most ops never arrive in a process's first second;
    a restarted primary's first write waits only for its own op's few milliseconds).
    """

    __slots__ = ("_adapter", "_required", "_validate", "fields", "model", "names", "op")

    def __init__(self, op: str, model: Any) -> None:
        self.op = op
        self.model = model
        self.fields: type = typed_dict_of(model)
        self.names: tuple[str, ...] = tuple(self.fields.__annotations__)
        """Every argument the op accepts, in the model's order."""
        self._adapter: TypeAdapter[dict[str, Any]] | None = None
        self._required: frozenset[str] | None = None
        # The core validator's own method: TypeAdapter.validate_python, which only passes its
        # default options on to it, cost a third of a small request's validation.
        self._validate: Any = None

    @property
    def adapter(self) -> TypeAdapter[dict[str, Any]]:
        """The op's pydantic validator (built once, on first use)."""
        adapter = self._adapter
        if adapter is None:
            with _BUILDING:
                adapter = self._adapter
                if adapter is None:
                    adapter = self._adapter = TypeAdapter(self.model)
        return adapter

    @property
    def required(self) -> frozenset[str]:
        """The arguments the op requires."""
        required = self._required
        if required is None:
            adapter = self.adapter
            with _BUILDING:
                # (not __required_keys__: under postponed annotations typing cannot see NotRequired)
                required = self._required = frozenset(adapter.json_schema().get("required", ()))
        return required

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validate ``args`` (a decoded JSON object)."""
        # No required argument: {} is valid as it is, so the hot ops without arguments
        # (heartbeat, hello) skip validation entirely.
        if not args and not self.required:
            return args
        validate = self._validate
        if validate is None:
            validate = self._validate = self.adapter.validator.validate_python
        try:
            out: dict[str, Any] = validate(args)
            return out
        except ValidationError as exc:
            raise invalid(self.op, exc.errors(include_url=False), "argument") from None


def typed_dict_of(model: Any) -> type:
    """The TypedDict class of an argument model (unwrapping ``Annotated[..., validator]``)."""
    return model.__origin__ if hasattr(model, "__metadata__") else model  # type: ignore[no-any-return]


def compile_all() -> dict[str, ArgsSchema]:
    """Every op's :class:`ArgsSchema` (each builds its validator on first use)."""
    return {op: ArgsSchema(op, model) for op, model in OP_ARGS.items()}


@functools.cache
def _host_attrs() -> TypeAdapter[HostAttrs]:
    return TypeAdapter(HostAttrs)  # on first use, as ArgsSchema's


def check_host_attrs(op: str, attrs: dict[str, Any]) -> HostAttrs:
    """Validate a joining host's ``attrs`` (a worker's join); returns the known fields."""
    try:
        return _host_attrs().validate_python(attrs)
    except ValidationError as exc:
        raise invalid(op, exc.errors(include_url=False), "argument", prefix=("attrs",)) from None


