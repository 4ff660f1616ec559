"""The FastAPI application: every route of the REST API under ``/xce/v1``.

Reads are served from the push-fed :class:`~xce_apiserver.store.Store`; writes go through the
one :class:`~xce_apiserver.backend.Backend` wrapper. Every response, success or failure, is
the envelope ``{"code", "msg", "data", "count"}`` rendered with orjson.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at run
# time, and the dependency aliases (User, Admin) are local to create_app.
import math
import threading
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import orjson
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from xce_apiserver import models as m
from xce_apiserver.auth import Authenticator, Session
from xce_apiserver.backend import Backend, BackendUnavailableError
from xce_apiserver.health import BackendHealth
from xce_apiserver.hosts import evaluator_host, lsf_host
from xce_apiserver.store import Store
from xcecore.wire import RemoteError

PREFIX = "/xce/v1"
EvaluatorFactory = Callable[[Any], Any]
"""Builds a resource-requirement evaluator for a ``ResourceRegistry``."""

# Controller error code -> HTTP status.
_STATUS = {"NOT_FOUND": 404, "DENIED": 403, "CONFLICT": 409, "INVALID": 422}


class EnvelopeResponse(Response):
    """A JSON response rendered with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialize ``content``."""
        return _dumps(content)


def envelope(data: Any = None, code: int = 200, msg: str = "ok") -> dict[str, Any]:
    """The envelope around ``data``; ``count`` is its length for lists, 1 or 0 otherwise."""
    count = len(data) if isinstance(data, list) else int(data is not None)
    return {"code": code, "msg": msg, "data": data, "count": count}


def ok(data: Any = None, code: int = 200, msg: str = "ok") -> EnvelopeResponse:
    """A success response (HTTP 200; the envelope code is 201 for a created job)."""
    return EnvelopeResponse(envelope(data, code, msg), status_code=200)


class ApiError(Exception):
    """A failure the route reports with ``status`` and the envelope."""

    def __init__(self, status: int, msg: str, data: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(msg)
        self.status, self.msg, self.data, self.headers = status, msg, data, headers


def _error(status: int, msg: str, data: Any = None, headers: dict[str, str] | None = None) -> EnvelopeResponse:
    return EnvelopeResponse(envelope(data, status, msg), status_code=status, headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc) or "request"


def remote_to_api(exc: RemoteError, what: str) -> ApiError:
    """Map a controller error reply to an HTTP failure naming what failed."""
    status = _STATUS.get(exc.code, 502)
    data = {"error": exc.code, **exc.data}
    return ApiError(status, f"{what}: {exc.message or exc.code}", data)


def _unavailable(exc: BackendUnavailableError) -> ApiError:
    return ApiError(503, exc.message, None, {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})


_HostEntry = tuple[dict[str, Any], dict[str, Any], bytes]
"""A host's pushed record, its evaluator mapping, and its LSF view as JSON without the final
``}`` (so fields can be appended)."""


class _HostViews:
    """One version of the pushed hosts, in the forms the routes need, built incrementally."""

    __slots__ = ("entries", "json_list", "mappings", "version")

    def __init__(self, version: int, entries: dict[str, _HostEntry]) -> None:
        self.version = version
        self.entries = entries
        self.mappings = [e[1] for e in entries.values()]
        self.json_list: bytes | None = None

    def hosts_json(self) -> bytes:
        """Every LSF host view as one JSON array (built once per version)."""
        if self.json_list is None:
            body = b"},".join(e[2] for e in self.entries.values())
            self.json_list = b"[" + body + b"}]" if body else b"[]"
        return self.json_list


class HostSelector:
    """Host selection over the pushed hosts, with the evaluator cached per registry version.

    Host views are cached per pushed record: a push replaces a host's record, so only
    records that are not the cached objects are converted again (a ``resvals`` push for
    one host of 10,000 rebuilds one entry). Each LSF view is kept as its JSON bytes, so a
    response listing thousands of hosts is joined from bytes, not re-serialized.
    """

    def __init__(self, store: Store, evaluator_factory: EvaluatorFactory) -> None:
        self.store = store
        self.factory = evaluator_factory
        self._res: tuple[int, Any, Any] | None = None
        self._views: _HostViews | None = None
        self._lock = threading.Lock()

    def _current(self) -> tuple[int, Any, Any]:
        version, site = self.store.site_resources()
        if self._res is None or self._res[0] != version:
            from xcecore.resreq.registry import ResourceRegistry

            try:
                registry = ResourceRegistry(site)
            except ValueError as exc:
                raise ApiError(500, f"the pushed site resources are invalid: {exc}") from None
            if self._res is not None and self._res[1].version == registry.version:
                # A re-join re-sent the same resources: keep the evaluator and its cache.
                self._res = (version, self._res[1], self._res[2])
            else:
                self._res = (version, registry, self.factory(registry))
        return self._res

    def registry(self) -> Any:
        """The ``ResourceRegistry`` of the pushed site resources."""
        return self._current()[1]

    def evaluator(self) -> Any:
        """The evaluator for the current site resources (built once per resources version)."""
        return self._current()[2]

    def views(self) -> _HostViews:
        """The host views of the store's current hosts version."""
        views = self._views
        if views is not None and views.version == self.store.hosts_version:
            return views  # unchanged: skip the store's sorted snapshot of every host
        version, records = self.store.snapshot_hosts()
        with self._lock:  # one thread rebuilds; the others wait for its result
            views = self._views
            if views is not None and views.version == version:
                return views
            old = views.entries if views is not None else {}
            entries = {}
            for record in records:
                name = record["name"]
                entry = old.get(name)
                if entry is None or entry[0] is not record:
                    view = lsf_host(record)
                    entry = (record, evaluator_host(record), _dumps(view)[:-1])
                entries[name] = entry
            self._views = views = _HostViews(version, entries)
        return views

    def hosts_json(self) -> tuple[bytes, int]:
        """(every host in LSF's fields as a JSON array, by name; the number of hosts)."""
        views = self.views()
        return views.hosts_json(), len(views.entries)

    def select_json(self, resreq: str, limit: int | None, ntasks: int) -> tuple[bytes, int]:
        """(matching hosts in order as a JSON array, their number).

        Each item is the host's LSF view plus ``tasks`` and ``alternative``, joined from the
        cached view bytes; the few distinct ``tasks``/``alternative`` tails are built once.
        """
        evaluator = self.evaluator()
        views = self.views()
        matches = evaluator.select(resreq, views.mappings, limit=limit, ntasks=ntasks)
        if not matches:
            return b"[]", 0
        entries = views.entries
        tails: dict[Any, bytes] = {}
        parts: list[bytes] = [b"["]
        add = parts.append
        for hm in matches:
            # Keyed by the bare task count when there is no alternative: no tuple per host
            # (thousands of short-lived tuples also feed the cyclic GC).
            alt = hm.alternative
            key = hm.tasks if alt is None else (hm.tasks, alt)
            tail = tails.get(key)
            if tail is None:
                tail = tails[key] = (b',"tasks":' + _dumps(hm.tasks) + b',"alternative":'
                                     + _dumps(alt) + b"},")
            add(entries[hm.name][2])
            add(tail)
        parts[-1] = parts[-1][:-1] + b"]"  # the last item's tail: no comma, close the array
        return b"".join(parts), len(matches)


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def raw_ok(data_json: bytes, count: int) -> Response:
    """A success envelope around ``data_json``, already-serialized JSON of ``count`` items."""
    body = b'{"code":200,"msg":"ok","data":' + data_json + b',"count":' + str(count).encode() + b"}"
    return Response(body, media_type="application/json")


def _resreq_error_type() -> type[Exception]:
    from xcecore.resreq.errors import ResreqError

    return ResreqError


def create_app(
    store: Store,
    backend: Backend,
    health: BackendHealth,
    auth: Authenticator,
    evaluator_factory: EvaluatorFactory,
) -> FastAPI:
    """Build the application over the given store, backend wrapper, health and users."""
    app = FastAPI(
        title="xce REST API",
        version="1",
        description="Cluster workload management: jobs, queues, hosts, resources.",
        default_response_class=EnvelopeResponse,
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
    )
    selector = HostSelector(store, evaluator_factory)
    resreq_error = _resreq_error_type()
    bearer = HTTPBearer(auto_error=False, description="token from POST /xce/v1/auth/logon")
    errors: dict[int | str, dict[str, Any]] = {
        401: {"model": m.Envelope[None], "description": "missing, unknown or expired token"},
        422: {"model": m.Envelope[Any], "description": "invalid request (the msg names the field)"},
    }
    write_errors: dict[int | str, dict[str, Any]] = {
        **errors,
        403: {"model": m.Envelope[Any], "description": "not allowed for this user"},
        404: {"model": m.Envelope[Any], "description": "unknown job, host or queue"},
        409: {"model": m.Envelope[Any], "description": "the state forbids it (e.g. queue closed)"},
        503: {"model": m.Envelope[None], "description": "backend unavailable; see Retry-After"},
    }

    # ------------------------------------------------------------------ errors
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return _error(exc.status, exc.msg, exc.data, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        details = [
            {"field": _field(e.get("loc", ())), "message": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        msg = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid request"
        return _error(422, f"invalid request: {msg}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        msg = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and msg == "Not Found":
            msg = f"no route {request.method} {request.url.path}"
        return _error(exc.status_code, msg, None, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        from loguru import logger

        logger.exception("apiserver: {} {} failed", request.method, request.url.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ auth
    async def session(
        cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Session:
        if cred is None or cred.scheme.lower() != "bearer":
            raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>' "
                                "(POST /xce/v1/auth/logon gives one)", headers={"WWW-Authenticate": "Bearer"})
        found = auth.lookup(cred.credentials)
        if found is None:
            raise ApiError(401, "invalid or expired token; log on again", headers={"WWW-Authenticate": "Bearer"})
        return found

    async def admin(s: Annotated[Session, Depends(session)]) -> Session:
        if not s.user.is_admin:
            raise ApiError(403, f"user {s.user.name!r} is not an administrator")
        return s

    User = Annotated[Session, Depends(session)]
    Admin = Annotated[Session, Depends(admin)]

    async def forward(op: str, args: dict[str, Any], what: str) -> Any:
        try:
            return await backend.call(op, args)
        except BackendUnavailableError as exc:
            raise _unavailable(exc) from None
        except RemoteError as exc:
            raise remote_to_api(exc, what) from None

    def check_resreq(text: str) -> None:
        try:
            selector.evaluator().compile(text)
        except resreq_error as exc:
            raise ApiError(400, f"bad resource requirement: {exc.message}", exc.to_dict()) from None  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ auth routes
    @app.post(f"{PREFIX}/auth/logon", response_model=m.Envelope[m.Token], tags=["auth"],
              responses={401: errors[401], 422: errors[422]})
    async def logon(body: m.LogonBody) -> Response:
        """Exchange a user name and password for a bearer token."""
        user = await anyio.to_thread.run_sync(auth.check_password, body.username, body.password)
        if user is None:
            raise ApiError(401, "logon failed: unknown user or wrong password")
        s = auth.issue(user)
        return ok({"token": s.token, "token_type": "bearer", "expires_in": auth.token_ttl,
                   "username": user.name, "role": user.role})

    @app.post(f"{PREFIX}/auth/logout", response_model=m.Envelope[None], tags=["auth"], responses=errors)
    async def logout(s: User) -> Response:
        """Revoke the token of this request."""
        auth.revoke(s.token)
        return ok(None, msg=f"user {s.user.name} logged out")

    # ------------------------------------------------------------------ jobs
    @app.get(f"{PREFIX}/jobs", response_model=m.Envelope[list[m.Job]], tags=["jobs"], responses=errors)
    async def list_jobs(
        s: User,
        state: Annotated[str | None, Query(description="state(s), comma-separated: PEND,RUN")] = None,
        user: Annotated[str | None, Query(description="owner")] = None,
        queue: Annotated[str | None, Query()] = None,
        fields: Annotated[str | None, Query(description="only these fields, comma-separated")] = None,
    ) -> Response:
        """Jobs from the pushed state, in job id order."""
        jobs = store.snapshot_jobs()
        if state:
            states = {x.strip().upper() for x in state.split(",") if x.strip()}
            jobs = [j for j in jobs if j.get("state") in states]
        if user:
            jobs = [j for j in jobs if j.get("user") == user]
        if queue:
            jobs = [j for j in jobs if j.get("queue") == queue]
        if fields:
            keep = [f.strip() for f in fields.split(",") if f.strip()]
            jobs = [{k: j.get(k) for k in keep} for j in jobs]
        return ok(jobs)

    @app.get(f"{PREFIX}/jobs/{{jobids}}", response_model=m.Envelope[list[m.Job]], tags=["jobs"],
             responses={**errors, 404: write_errors[404]})
    async def get_jobs(s: User, jobids: Annotated[str, Path(description="ids, comma-separated")]) -> Response:
        """The named jobs; 404 naming any unknown id."""
        ids = parse_jobids(jobids)
        missing = [i for i in ids if store.get_job(i) is None]
        if missing:
            raise ApiError(404, f"no such job: {', '.join(map(str, missing))}", {"missing": missing})
        return ok([store.get_job(i) for i in ids])

    async def submit(s: User, body: m.SubmitBody) -> Response:
        if body.resreq:
            check_resreq(body.resreq)
        args = {k: v for k, v in body.model_dump().items() if v is not None}
        args["user"] = s.user.name
        result = await forward("jobsubmit", args, "job submission")
        return ok(result, code=201, msg=f"job <{result.get('jobid')}> is submitted to queue <{result.get('queue')}>")

    for path in (f"{PREFIX}/jobs", f"{PREFIX}/jobs/create"):
        app.add_api_route(path, submit, methods=["POST"], response_model=m.Envelope[m.Submitted],
                          tags=["jobs"], responses=write_errors, summary="Submit a job",
                          description="Submit a job as the logged-on user; envelope code 201.")

    @app.post(f"{PREFIX}/jobs/{{jobids}}/control", response_model=m.Envelope[list[m.Job]],
              tags=["jobs"], responses=write_errors)
    async def control_jobs(s: User, body: m.ControlBody, jobids: Annotated[str, Path()]) -> Response:
        """kill, stop, resume, checkpoint or requeue jobs (own jobs; admins any)."""
        done = []
        for jobid in parse_jobids(jobids):
            args = {"jobid": jobid, "action": body.action, "user": s.user.name}
            done.append(await forward("jobctrl", args, f"{body.action} job {jobid}"))
        return ok(done)

    @app.post(f"{PREFIX}/jobs/{{jobid}}/run", response_model=m.Envelope[dict[str, Any]],
              tags=["jobs"], responses=write_errors)
    async def force_run(s: Admin, body: m.RunBody, jobid: Annotated[int, Path(ge=1)]) -> Response:
        """Admin: dispatch a pending job to named hosts now (like LSF ``brun``)."""
        alloc = run_alloc(body, store.get_job(jobid))
        args = {"jobid": jobid, "alloc": alloc, "force": body.force, "user": s.user.name}
        return ok(await forward("jobdispatch", args, f"force-run job {jobid}"))

    # ------------------------------------------------------------------ queues
    @app.get(f"{PREFIX}/queues", response_model=m.Envelope[list[m.Queue]], tags=["queues"], responses=errors)
    async def list_queues(s: User) -> Response:
        """Queues, highest priority first."""
        return ok(store.snapshot_queues())

    @app.post(f"{PREFIX}/queues/control", response_model=m.Envelope[m.Queue], tags=["queues"],
              responses=write_errors)
    async def control_queue(s: Admin, body: m.QueueControlBody) -> Response:
        """Admin: open, close, activate or inactivate a queue."""
        args = {"queue": body.queue, "action": body.action, "user": s.user.name}
        return ok(await forward("queuectrl", args, f"{body.action} queue {body.queue}"))

    # ------------------------------------------------------------------ hosts
    @app.get(f"{PREFIX}/hosts", response_model=m.Envelope[list[m.Host]], tags=["hosts"], responses=errors)
    async def list_hosts(s: User) -> Response:
        """Hosts in LSF's field names, by name."""
        return raw_ok(*selector.hosts_json())

    @app.post(f"{PREFIX}/hosts/control", response_model=m.Envelope[m.Host], tags=["hosts"],
              responses=write_errors)
    async def control_host(s: Admin, body: m.HostControlBody) -> Response:
        """Admin: open or close a host (with a comment)."""
        args = {"host": body.host, "action": body.action, "comment": body.comment, "user": s.user.name}
        result = await forward("hostctrl", args, f"{body.action} host {body.host}")
        return ok(lsf_host(result) if isinstance(result, dict) and "name" in result else result)

    @app.post(f"{PREFIX}/hosts/select", response_model=m.Envelope[list[m.SelectedHost]],
              tags=["hosts"], responses={**errors, 400: {"model": m.Envelope[m.ResreqErrorData],
                                                         "description": "bad resource requirement"}})
    async def select_hosts(s: User, body: m.SelectBody) -> Response:
        """Hosts that satisfy a resource requirement, best first."""
        try:
            found = await anyio.to_thread.run_sync(selector.select_json, body.resreq, body.limit,
                                                   body.ntasks)
        except resreq_error as exc:
            raise ApiError(400, f"bad resource requirement: {exc.message}", exc.to_dict()) from None  # type: ignore[attr-defined]
        return raw_ok(*found)

    # ------------------------------------------------------------------ resources, cluster
    @app.get(f"{PREFIX}/resources", response_model=m.Envelope[list[dict[str, Any]]],
             tags=["resources"], responses=errors)
    async def list_resources(s: User) -> Response:
        """Resource definitions: LSF's built-ins and the site's."""
        return ok([r.to_dict() for r in selector.registry().resources()])

    @app.get(f"{PREFIX}/resources/values", response_model=m.Envelope[dict[str, dict[str, Any]]],
             tags=["resources"], responses=errors)
    async def resource_values(s: User) -> Response:
        """Each host's resource values as last pushed (no call to the controller)."""
        values = {h["name"]: dict(h.get("resvals") or {}) for h in store.snapshot_hosts()[1]}
        return EnvelopeResponse(envelope(values) | {"count": len(values)})

    @app.get(f"{PREFIX}/cluster", response_model=m.Envelope[dict[str, Any]], tags=["cluster"], responses=errors)
    async def cluster(s: User) -> Response:
        """The pushed cluster configuration, with the controller that sent it."""
        return ok({**store.cluster, "server": store.server, "members": list(store.members.values())})

    # ------------------------------------------------------------------ health
    @app.get(f"{PREFIX}/healthz", response_model=m.Envelope[dict[str, Any]], tags=["health"])
    async def healthz() -> Response:
        """The process is up."""
        return ok({"status": "up"})

    @app.get(f"{PREFIX}/readyz", response_model=m.Envelope[dict[str, Any]], tags=["health"],
             responses={503: {"model": m.Envelope[dict[str, Any]], "description": "not ready"}})
    async def readyz() -> Response:
        """Ready: the first full state arrived and the backend is not degraded."""
        data = {"state_received": store.ready, "degraded": health.is_degraded(),
                "server": store.server, "pushes": store.pushes}
        if not store.ready:
            return _error(503, "not ready: no full state from the controller yet", data, {"Retry-After": "1"})
        if data["degraded"]:
            wait = str(max(1, math.ceil(health.retry_after())))
            return _error(503, f"not ready: backend degraded ({health.reason})", data, {"Retry-After": wait})
        return ok(data)

    return app


def parse_jobids(text: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``; anything else is a 422 naming the bad part."""
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ApiError(422, f"invalid request: path.jobids: {part!r} is not a job id (positive integer)",
                           [{"field": "path.jobids", "message": f"{part!r} is not a job id"}])
        ids.append(int(part))
    return ids


def run_alloc(body: m.RunBody, job: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ``alloc`` of a force-run: explicit, or the job's tasks spread over ``hosts``."""
    if body.alloc is not None:
        if body.hosts is not None:
            raise ApiError(422, "invalid request: body: give either 'hosts' or 'alloc', not both")
        return [a.model_dump() for a in body.alloc]
    if not body.hosts:
        raise ApiError(422, "invalid request: body.hosts: name at least one host (or give 'alloc')")
    hosts = list(dict.fromkeys(body.hosts))
    ntasks = int((job or {}).get("ntasks") or 1)
    if len(hosts) > ntasks:
        raise ApiError(422, f"invalid request: body.hosts: {len(hosts)} hosts for a job of {ntasks} task(s)")
    share, extra = divmod(ntasks, len(hosts))
    return [{"host": h, "ntasks": share + (1 if i < extra else 0)} for i, h in enumerate(hosts)]
