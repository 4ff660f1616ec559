"""Request bodies and documented response shapes of the REST API (pydantic models).

Request bodies forbid unknown fields, so a typo is a 422 naming the field rather than a
silently ignored option, and take JSON's types strictly (``"2"`` is not an integer). Every
field is one of the constrained types of :mod:`xcecore.schema.types`, the very objects the
controller validates its op arguments with: a body the API server accepts is one the
controller accepts, and a 422 here says what an ``INVALID`` there would. Response models exist
for the OpenAPI document; routes build their JSON directly (orjson) instead of validating
10,000 records per request.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from xcecore.schema import limits as lim
from xcecore.schema import ops as schema_ops
from xcecore.schema import types as t

T = TypeVar("T")


class Envelope(BaseModel, Generic[T]):
    """Every response, success or failure: ``code`` equals the HTTP status except 201."""

    code: int = Field(description="200 (or 201 for a created job) on success, else the HTTP status")
    msg: str = Field(description="'ok' or what went wrong")
    data: T | None = None
    count: int = Field(description="number of items in data (1 for one object, 0 for none)")


class JobPage(BaseModel, Generic[T]):
    """The envelope of a page of jobs: ``next`` is the cursor of the following page."""

    code: int = Field(description="200")
    msg: str = Field(description="'ok'")
    data: T | None = None
    count: int = Field(description="number of jobs in data")
    next: str | None = Field(None, description="pass as `cursor` for the next page; null: "
                                               "this was the last (always null without `limit`)")


Cursor = Annotated[str, StringConstraints(min_length=1, max_length=20, pattern=r"^[0-9]+$")]
"""The ``cursor`` of ``GET /jobs``: opaque to clients (today the last job id a page looked at)."""


MAX_PAGE = 1000
"""The most jobs one page of ``GET /jobs`` may ask for (``limit``)."""


class JobsQuery(BaseModel):
    """``GET /jobs``'s query parameters (text, so lax: ``limit=100`` is an integer)."""

    state: t.Label | None = Field(None, description="state(s), comma-separated: PEND,RUN")
    user: t.Name | None = Field(None, description="owner")
    queue: t.Name | None = None
    array: int | None = Field(None, ge=1, description="only the elements of this job array")
    fields: t.Label | None = Field(None, description="only these fields, comma-separated "
                                                     "(each item then holds only those)")
    limit: int | None = Field(None, ge=1, le=MAX_PAGE, description=(
        f"a page of at most this many jobs (1 to {MAX_PAGE}), with the next page's cursor in "
        "the envelope's `next`; without it, every matching job"))
    cursor: Cursor | None = Field(None, description="the `next` of the page before")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Password = Annotated[str, StringConstraints(max_length=lim.LABEL_MAX)]

IdempotencyKey = Annotated[str, StringConstraints(
    min_length=1, max_length=66, pattern=r"^[\x21-\x5b\x5d-\x7e]+$")]
"""An ``Idempotency-Key`` header: 1 to 64 visible ASCII characters (no backslash), in
quotes as the IETF draft writes it (a structured-field string) or bare."""


class LogonBody(_Body):
    """``POST /auth/logon``."""

    username: t.Name
    password: Password


class RevokeTokensBody(_Body):
    """``POST /auth/revoke``."""

    user: t.Name = Field(description="whose tokens to revoke: your own, or (an administrator) "
                                     "anyone's")


class Revoked(BaseModel):
    """Every token of ``user`` issued before ``before`` is refused by every API server."""

    user: str
    before: float = Field(description="Unix time: tokens issued before it are refused")
    by: str


class Token(BaseModel):
    """A bearer token."""

    token: str
    token_type: Literal["bearer"] = "bearer"
    expires_in: float
    username: str
    role: str
    path: str | None = Field(None, description="the API's base path (/xce/v1); logon only")
    ip: str | None = Field(None, description="the address of the API server the client "
                                             "reached; logon only")


class SubmitBody(_Body):
    """``POST /jobs``: what ``bsub`` takes (the controller's ``jobsubmit`` arguments)."""

    command: t.Command = Field(description="the command line to run")
    queue: t.Name | None = Field(None, description="queue (default: the cluster's)")
    resreq: t.ResReq | None = Field(None, description="resource requirement, e.g. select[mem>4G]")
    name: t.Label | None = None
    project: t.Name | None = None
    cwd: t.WorkDir | None = None
    env: t.Env | None = None
    ntasks: t.Count | None = None
    mem_limit: t.MemLimit | None = Field(None, description="memory limit in bytes (bsub -M)")
    run_limit: t.RunLimit | None = Field(None, description="run limit in seconds (bsub -W)")
    stdout: t.JobPath | None = Field(None, description="output file; %J job id, %I index, %A attempt (bsub -o)")
    stderr: t.JobPath | None = Field(None, description="error file (bsub -e); default: with stdout")
    stdin: t.JobPath | None = Field(None, description="input file (bsub -i)")
    exclusive: bool | None = Field(None, description="hosts to itself (bsub -x): the scheduler "
                                   "puts it on empty hosts and nothing else beside it")
    array: t.ArrayText | None = Field(None, description="a job array: 1-1000:2%50 (bsub -J "
                                      "'name[1-1000:2]%50', sbatch --array)")
    depend: t.DependText | None = Field(None, description="a dependency: done(12) && ended(prep) "
                                        "(bsub -w) or afterok:12 (sbatch --dependency)")


class Submitted(BaseModel):
    """The controller's answer to a submission."""

    jobid: int
    queue: str
    state: str
    array: str | None = Field(None, description="a job array's index expression")
    size: int | None = Field(None, description="a job array's elements")


class ControlBody(_Body):
    """``POST /jobs/{jobids}/control``."""

    action: schema_ops.JobAction
    index: t.ArrayIndex | None = Field(None, description="one element of each job array named "
                                       "(without it: every element of an array)")


class AllocEntry(_Body):
    """Tasks on one host."""

    host: t.Name
    ntasks: t.Count


class RunBody(_Body):
    """``POST /jobs/{jobid}/run`` (like LSF ``brun``): ``hosts`` or an explicit ``alloc``."""

    hosts: list[t.Name] | None = Field(None, min_length=1, max_length=lim.ALLOC_MAX,
                                       description="tasks spread over these")
    alloc: list[AllocEntry] | None = Field(None, min_length=1, max_length=lim.ALLOC_MAX)
    force: bool = Field(True, description="ignore closed hosts and free slots (brun -f)")

    @field_validator("alloc")
    @classmethod
    def _distinct(cls, alloc: list[AllocEntry] | None) -> list[AllocEntry] | None:
        if alloc is not None:
            schema_ops.check_distinct([a.host for a in alloc])  # the controller's own rule
        return alloc


class QueueControlBody(_Body):
    """``POST /queues/control``."""

    queue: t.Name
    action: schema_ops.QueueAction


class HostControlBody(_Body):
    """``POST /hosts/control``."""

    host: t.Name
    action: schema_ops.HostAction
    comment: t.Label = ""


class SelectBody(_Body):
    """``POST /hosts/select``."""

    resreq: t.ResReq = Field(description="resource requirement, e.g. select[ncpus>=4] order[r1m]")
    limit: t.Count | None = Field(None, description="at most this many hosts")
    ntasks: t.Count = 1


class Job(BaseModel):
    """A job record as the controller pushes it."""

    model_config = ConfigDict(extra="allow")
    jobid: int
    name: str = ""
    user: str
    project: str = "default"
    queue: str
    command: str
    cwd: str = ""
    env: dict[str, str] = {}
    resreq: str = ""
    ntasks: int = 1
    state: t.JobState
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    alloc: list[dict[str, Any]] = []
    pid: int | None = None
    exit_status: int | None = None
    pend_reason: str | None = None
    reason: str | None = None
    signal: str | None = None
    attempt: int = 0
    forced: bool = False
    usage: dict[str, Any] = {}
    lost_at: float | None = Field(None, description="UNKWN since (its host went unavail)")
    lost_from: t.JobState | None = Field(None, description="the state UNKWN returns to when its "
                                                         "worker reports the job alive")
    mem_limit: int | None = Field(None, description="bytes, if submitted with one")
    run_limit: int | None = Field(None, description="seconds, if submitted with one")
    stdout: str | None = None
    stderr: str | None = None
    stdin: str | None = None
    exclusive: bool | None = None
    array: dict[str, Any] | None = Field(None, description="a job array's record (its pending "
                                         "indexes, elements per state) or an element's "
                                         "{of, index}; null for a plain job")
    waiting: str | None = Field(None, description="why a job with a dependency may not run yet")
    # What existing XCE REST clients read (xce_apiserver.hosts.JOB_CLIENT), beside the above.
    status: str = Field(description="the state again (PEND, RUN, DONE, ...)")
    jobname: str = ""
    projectname: str = "default"
    submittime: int = Field(description="submit_time in whole seconds")
    jobdescription: str = ""
    tasks: dict[str, Any] | None = Field(None, description="a parallel job's launched tasks "
                                         "(xce task launch): {blocked, commands (one per "
                                         "launch), list: [{task, host, launch, state, pid, "
                                         "exit_status, launch_time, start_time, end_time, "
                                         "reason, usage}]}; null if it never had any")


JobOrFields = Job | dict[str, Any]
"""A job record, or (with ``fields=``) the chosen fields of one."""


class Host(BaseModel):
    """A host: every field of LSF's ``struct hostInfo`` (lsf.h; never null), then ``bhosts``
    and ``lsload`` (status, slots, load indices)."""

    hostName: str
    hostType: str
    hostModel: str
    cpuFactor: float
    maxCpus: int
    maxMem: int = Field(description="MB")
    maxSwap: int = Field(description="MB")
    maxTmp: int = Field(description="MB")
    nDisks: int
    nRes: int
    resources: list[str]
    nDRes: int
    DResources: list[str]
    windows: str = Field(description="dispatch windows; empty: always open")
    numIndx: int
    busyThreshold: list[float] = Field(description="per load index; 1e30: none")
    isServer: int
    licensed: int
    rexPriority: int
    licFeaturesNeeded: int
    licClass: int
    cores: int = Field(description="cores per physical processor")
    hostAddr: str
    pprocs: int = Field(description="physical processors")
    cores_per_proc: int
    threads_per_core: int
    status: str = Field(description="ok, closed_Adm, closed_Full or unavail")
    available: bool
    closed: bool
    comment: str = ""
    loadIndices: dict[str, Any] = Field(description="r15s r1m r15m ut pg io ls it tmp swp mem")
    maxSlots: int
    usedSlots: int
    slots: int = Field(description="free slots")


class SelectedHost(Host):
    """A host matching a requirement, with the tasks it would take."""

    tasks: int
    alternative: int | None = None


class Queue(BaseModel):
    """A queue record."""

    model_config = ConfigDict(extra="allow")
    name: str
    priority: int
    description: str = ""
    open: bool
    active: bool
    status: str


class ResreqErrorData(BaseModel):
    """Why a resource requirement was rejected, and where."""

    code: str
    message: str
    section: str | None = None
    offset: int
    column: int
    snippet: str
