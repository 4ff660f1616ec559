"""Request bodies and documented response shapes of the REST API (pydantic models).

Request bodies forbid unknown fields, so a typo is a 422 naming the field rather than a
silently ignored option. Response models exist for the OpenAPI document; routes build their
JSON directly (orjson) instead of validating 10,000 records per request.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from xcecore.protocol import JobState

T = TypeVar("T")


class Envelope(BaseModel, Generic[T]):
    """Every response, success or failure: ``code`` equals the HTTP status except 201."""

    code: int = Field(description="200 (or 201 for a created job) on success, else the HTTP status")
    msg: str = Field(description="'ok' or what went wrong")
    data: T | None = None
    count: int = Field(description="number of items in data (1 for one object, 0 for none)")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LogonBody(_Body):
    """``POST /auth/logon``."""

    username: str = Field(min_length=1)
    password: str


class Token(BaseModel):
    """A bearer token."""

    token: str
    token_type: Literal["bearer"] = "bearer"
    expires_in: float
    username: str
    role: str


class SubmitBody(_Body):
    """``POST /jobs``: what ``bsub`` takes."""

    command: str = Field(min_length=1, description="the command line to run")
    queue: str | None = Field(None, min_length=1, description="queue (default: the cluster's)")
    resreq: str | None = Field(None, description="resource requirement, e.g. select[mem>4G]")
    name: str | None = None
    project: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    ntasks: int | None = Field(None, ge=1)


class Submitted(BaseModel):
    """The controller's answer to a submission."""

    jobid: int
    queue: str
    state: str


class ControlBody(_Body):
    """``POST /jobs/{jobids}/control``."""

    action: Literal["kill", "stop", "resume", "checkpoint", "requeue"]


class AllocEntry(_Body):
    """Tasks on one host."""

    host: str = Field(min_length=1)
    ntasks: int = Field(ge=1)


class RunBody(_Body):
    """``POST /jobs/{jobid}/run`` (like LSF ``brun``): ``hosts`` or an explicit ``alloc``."""

    hosts: list[str] | None = Field(None, min_length=1, description="tasks spread over these")
    alloc: list[AllocEntry] | None = Field(None, min_length=1)
    force: bool = Field(True, description="ignore closed hosts and free slots (brun -f)")


class QueueControlBody(_Body):
    """``POST /queues/control``."""

    queue: str = Field(min_length=1)
    action: Literal["open", "close", "activate", "inactivate"]


class HostControlBody(_Body):
    """``POST /hosts/control``."""

    host: str = Field(min_length=1)
    action: Literal["open", "close"]
    comment: str = ""


class SelectBody(_Body):
    """``POST /hosts/select``."""

    resreq: str = Field(description="resource requirement, e.g. select[ncpus>=4] order[r1m]")
    limit: int | None = Field(None, ge=1, description="at most this many hosts")
    ntasks: int = Field(1, ge=1)


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
    state: JobState
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


class Host(BaseModel):
    """A host in LSF's field names, with its free ``slots``."""

    hostName: str
    hostType: str | None = None
    hostModel: str | None = None
    cpuFactor: float | None = None
    maxCpus: int | None = None
    maxMem: float | None = None
    maxSwap: float | None = None
    maxTmp: float | None = None
    resources: list[str] = []
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
