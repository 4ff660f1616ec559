"""The FastAPI application: every route of the REST API under ``/xce/v1``.

Reads are served from the push-fed :class:`~xce_apiserver.store.Store`; writes go through the
one :class:`~xce_apiserver.backend.Backend` wrapper, each under its ``Idempotency-Key``
(:mod:`xce_apiserver.idempotency`). Every response, success or failure, is the envelope
``{"code", "msg", "data", "count"}`` rendered with orjson (:mod:`xce_apiserver.envelope`);
bodies are bounded and validated at the edge (:mod:`xce_apiserver.edge`) with the same
constrained types the controller uses, so no input reaches the controller that it would
refuse, and none ends in a 5xx.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at run
# time, and the dependency aliases (User, Admin) are local to create_app.
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException

from xce_apiserver import models as m
from xce_apiserver.auth import Authenticator, Session
from xce_apiserver.backend import RETRY_AFTER, Backend, BackendUnavailableError, OutcomeUnknownError
from xce_apiserver.docs import mount_docs
from xce_apiserver.edge import (
    DEFAULT_MAX_BODY,
    BodyLimit,
    allowed_methods,
    bearer_token,
    check_value,
    parse_body,
    parse_query,
    refuse_unknown_query,
    unknown_query,
    validation_response,
)
from xce_apiserver.envelope import (
    ApiError,
    EnvelopeResponse,
    envelope,
    error_response,
    ok,
    remote_to_api,
)
from xce_apiserver.envelope import dumps as _dumps
from xce_apiserver.events import events_router
from xce_apiserver.frontdoor import AccessLog, client_of, denied
from xce_apiserver.health import BackendHealth
from xce_apiserver.history import history_router
from xce_apiserver.hosts import evaluator_host, lsf_host
from xce_apiserver.idempotency import HEADER as IDEMPOTENCY_HEADER
from xce_apiserver.idempotency import Idempotent, Memory, parse_key
from xce_apiserver.lean import (
    BEARER,
    add_lean_route,
    document_models,
    header_parameter,
    install_dispatch,
    json_body,
    path_parameter,
    query_parameters,
)
from xce_apiserver.listing import Filters, WriteGate, WritesFirst, jobs_json, page_body, stream_body
from xce_apiserver.store import Store
from xce_apiserver.throttle import Throttle
from xce_apiserver.ui import mount_ui, ui_router
from xcecore.schema import limits as lim
from xcecore.schema import types as t
from xcecore.wire import RemoteError

PREFIX = "/xce/v1"
EvaluatorFactory = Callable[[Any], Any]
"""Builds a resource-requirement evaluator for a ``ResourceRegistry``."""

MAX_JOBIDS = 10_000
"""Job ids one path may name (``/jobs/1,2,3``)."""

MAX_PAGE = m.MAX_PAGE
"""The most jobs one page of ``GET /jobs`` may ask for (``limit``)."""

NO_QUERY = m.JobsQuery.model_validate({})

__all__ = ["PREFIX", "ApiError", "EnvelopeResponse", "HostSelector", "create_app", "envelope", "ok",
           "raw_ok", "remote_to_api"]


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


def raw_ok(data_json: bytes, count: int) -> Response:
    """A success envelope around ``data_json``, already-serialized JSON of ``count`` items."""
    body = b'{"code":200,"msg":"ok","data":' + data_json + b',"count":' + str(count).encode() + b"}"
    return Response(body, media_type="application/json")


def _resreq_error_type() -> type[Exception]:
    from xcecore.resreq.errors import ResreqError

    return ResreqError


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented failures of a route (every one of them is the envelope)."""
    text = {
        400: "bad resource requirement (data: where and why)",
        401: "missing, unknown or expired token",
        403: "not allowed for this user",
        404: "unknown job, host or queue",
        405: "method not allowed on this path (see Allow)",
        409: "the state forbids it (e.g. queue closed)",
        413: "request body too large",
        422: "invalid request: the msg names each field and its limit",
        429: "too many failed logons for this user or client address; see Retry-After",
        503: "backend unavailable, nothing was sent; see Retry-After",
        504: "outcome unknown: the write was sent and no answer came; retry with the same "
             "Idempotency-Key (data.idempotency_key), which is safe",
    }
    return {c: {"model": m.Envelope[Any], "description": text[c]} for c in codes}


IDEMPOTENCY_KEY: TypeAdapter[str] = TypeAdapter(m.IdempotencyKey)
IDEMPOTENCY_AT = ("header", IDEMPOTENCY_HEADER)
IDEMPOTENCY_DOC = ("the request's idempotency key (IETF httpapi draft): the same key and request "
                   "get the same response, the same key with another request is a 422; 1 to 64 "
                   "visible ASCII characters, in quotes or bare")
IDEMPOTENCY_PARAMETER = header_parameter(IDEMPOTENCY_HEADER, TypeAdapter(m.IdempotencyKey | None),
                                         IDEMPOTENCY_DOC)

_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})
"""FastAPI's native OpenTelemetry off: xce exports its own figures (xce_apiserver.metrics),
and with it on FastAPI looks the global providers and environment up on every request."""

READ = (401, 405, 413, 422)
WRITE = (*READ, 403, 404, 409, 503, 504)


def create_app(
    store: Store,
    backend: Backend,
    health: BackendHealth,
    auth: Authenticator,
    evaluator_factory: EvaluatorFactory,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    throttle: Throttle | None = None,
    access_log: bool = False,
    stream_timing: dict[str, float] | None = None,
) -> FastAPI:
    """Build the application over the given store, backend wrapper, health and users.

    ``throttle`` counts failed logons (default: 5 per user and per address in 60 s);
    ``access_log`` logs one line per request; ``stream_timing``: the event stream's
    intervals (:func:`xce_apiserver.stream.pump`)."""
    throttle = throttle if throttle is not None else Throttle(5, 60.0)
    declared: dict[int, frozenset[str]] = {}

    async def no_unknown_query(request: Request) -> None:
        # Like a body's unknown field: a misspelt filter is a 422, not silently ignored.
        refuse_unknown_query(unknown_query(request.scope.get("route"), request.query_params.keys(),
                                           declared))

    app = FastAPI(
        **_NO_TELEMETRY,
        dependencies=[Depends(no_unknown_query)],
        title="xce REST API",
        version="1",
        description="Cluster workload management: jobs, queues, hosts, resources. Every POST "
                    "takes an Idempotency-Key header (IETF httpapi draft).",
        default_response_class=EnvelopeResponse,
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=None,  # mount_docs: the same page, its assets shipped with xce (no CDN)
        redoc_url=None,
    )
    mount_docs(app, PREFIX, f"{PREFIX}/openapi.json", "xce")
    install_dispatch(app)  # first: the innermost middleware, inside every other
    app.add_middleware(BodyLimit, max_bytes=max_body)
    gate = WriteGate()  # listings give way to the writes in flight (xce_apiserver.listing)
    app.add_middleware(WritesFirst, gate=gate)
    app.state.write_gate = gate
    if access_log:
        app.add_middleware(AccessLog)
    selector = HostSelector(store, evaluator_factory)
    resreq_error = _resreq_error_type()
    memory = Memory()
    bearer = HTTPBearer(auto_error=False, description="token from POST /xce/v1/auth/logon")

    # ------------------------------------------------------------------ errors
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc.status, exc.msg, exc.data, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return validation_response(exc.errors())

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        msg = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        status, headers = exc.status_code, dict(getattr(exc, "headers", None) or {})
        if status == 404 and msg == "Not Found":
            msg = f"no route {request.method} {request.url.path}"
        elif status == 405:
            headers["Allow"] = allowed_methods(app.router.routes, request.scope)
            msg = f"method {request.method} not allowed on {request.url.path}; allowed: {headers['Allow']}"
        elif status == 400 and "parsing the body" in msg:
            # FastAPI's answer to a body that is not text (bad UTF-8): a field error like any other
            return validation_response([{"loc": ("body",), "type": "json_invalid",
                                         "msg": "is not valid JSON text (UTF-8)"}])
        return error_response(status, msg, None, headers or None)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        from loguru import logger

        logger.exception("apiserver: {} {} failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ auth
    def authenticate(request: Request) -> Session:
        """THE token check of every route: the live session of the request's bearer token
        (the authenticator's verified-token cache, expiry, user, revocations), else 401."""
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            denied(request, 401, None, "no bearer token")
            raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>' "
                                "(POST /xce/v1/auth/logon gives one)", headers={"WWW-Authenticate": "Bearer"})
        found = auth.check(token)
        if isinstance(found, str):
            denied(request, 401, None, found)
            msg = f"{found}; log on again" if "revoked" in found else "invalid or expired token; log on again"
            raise ApiError(401, msg, headers={"WWW-Authenticate": "Bearer"})
        return found

    async def session(
        request: Request,
        cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Session:
        # cred declares the bearer scheme in the OpenAPI document; authenticate checks it
        return authenticate(request)

    async def admin(request: Request, s: Annotated[Session, Depends(session)]) -> Session:
        if not s.user.is_admin:
            denied(request, 403, s.user.name, "not an administrator")
            raise ApiError(403, f"user {s.user.name!r} is not an administrator")
        return s

    async def idempotent(
        request: Request,
        key: Annotated[m.IdempotencyKey | None, Header(
            alias=IDEMPOTENCY_HEADER, description=IDEMPOTENCY_DOC)] = None,
    ) -> Idempotent:
        # key: declared (and checked) for the OpenAPI document; idempotency checks it again
        return idempotency(request, await request.body())  # the body: read for the model

    def idempotency(request: Request, body: bytes) -> Idempotent:
        """THE Idempotency-Key edge of every POST: the header checked and unquoted, the
        request's fingerprint (method, path, body) taken when a key was given."""
        raw = request.headers.get("idempotency-key")
        given = None if raw is None else parse_key(check_value(IDEMPOTENCY_KEY, raw, IDEMPOTENCY_AT))
        # scope["path"], not request.url.path: building the URL object cost more than the rest
        # of this edge together
        return Idempotent(memory, given, request.method, request.scope["path"], body)

    User = Annotated[Session, Depends(session)]
    Admin = Annotated[Session, Depends(admin)]
    Once = Annotated[Idempotent, Depends(idempotent)]

    async def forward(op: str, args: dict[str, Any], what: str, rid: str, user: str) -> Any:
        try:
            return await backend.call(op, args, rid=rid, user=user)
        except BackendUnavailableError as exc:
            raise ApiError(503, exc.message, None, {"Retry-After": str(max(1, round(exc.retry_after)))}) from None
        except OutcomeUnknownError as exc:
            key = rid.rsplit(":", 1)[-1]
            raise ApiError(504, f"{what}: outcome unknown: the request was sent and no answer came "
                                f"({exc.message}); retry with {IDEMPOTENCY_HEADER}: \"{key}\", "
                                "which is safe", {"idempotency_key": key, "op": op}) from None
        except RemoteError as exc:
            raise remote_to_api(exc, what) from None

    def check_resreq(text: str) -> None:
        try:
            selector.evaluator().compile(text)
        except resreq_error as exc:
            raise ApiError(400, f"bad resource requirement: {exc.message}", exc.to_dict()) from None  # type: ignore[attr-defined]

    def once(idem: Idempotent, user: str, handle: Callable[[], Awaitable[Response]]) -> Awaitable[Response]:
        return idem.run(user, handle)

    app.include_router(history_router(PREFIX, session, forward,  # GET /history/... (accounting)
                                      _responses(*READ, 403, 404, 503, 504)))
    app.include_router(events_router(PREFIX, session, forward,  # GET /events (the controller)
                                     _responses(*READ, 503, 504)))
    app.include_router(ui_router(PREFIX, store, auth, session, forward,  # the dashboard's stream
                                 _responses(*READ, 503, 504), **(stream_timing or {})))
    mount_ui(app, PREFIX)

    # ------------------------------------------------------------------ auth routes
    def token_body(s: Session) -> dict[str, Any]:
        return {"token": s.token, "token_type": "bearer", "expires_in": auth.token_ttl,
                "username": s.user.name, "role": s.user.role}

    @app.post(f"{PREFIX}/auth/logon", response_model=m.Envelope[m.Token], tags=["auth"],
              responses=_responses(401, 405, 413, 422, 429))
    async def logon(request: Request, body: m.LogonBody, idem: Once) -> Response:
        """Exchange a user name and password for a bearer token (a signed JWT). Failed
        logons are counted per user and per client address: past the limit, 429 with
        Retry-After, without the password being checked."""
        keys = (f"user:{body.username}", f"addr:{client_of(request)}")

        async def handle() -> Response:
            wait = throttle.retry_after(keys, time.monotonic())
            if wait > 0:
                after = max(1, math.ceil(wait))
                denied(request, 429, body.username, f"{throttle.limit} failed logons of this "
                       f"user or address within {throttle.window:g} s; retry in {after} s")
                raise ApiError(429, f"too many failed logons for this user or address; retry "
                                    f"in {after} s", headers={"Retry-After": str(after)})
            user = await anyio.to_thread.run_sync(auth.check_password, body.username, body.password)
            if user is None:
                throttle.failed(keys, time.monotonic())
                denied(request, 401, body.username, "logon failed: unknown user or wrong password")
                raise ApiError(401, "logon failed: unknown user or wrong password")
            throttle.succeeded(keys[0])
            # What existing XCE clients read besides the token: the API's base path and the
            # address of this API server as the client reached it.
            server = request.scope.get("server") or ("", 0)
            return ok({**token_body(auth.issue(user)), "path": PREFIX, "ip": str(server[0] or "")})
        return await once(idem, f"logon:{body.username}", handle)

    async def revoke(s: Session, idem: Idempotent, what: str) -> None:
        """Revoke ``s``'s token through the controller; answered once it is committed (so
        every API server refuses it), else 503/504 and the token stays valid."""
        rid = idem.rid(s.user.name, "revoke_token")
        got = await forward("revoke_token", {"jti": s.jti, "expires": s.expires}, what, rid,
                            s.user.name)
        if isinstance(got, dict):
            auth.revocations.hold(got.get("record"))

    @app.post(f"{PREFIX}/auth/refresh", response_model=m.Envelope[m.Token], tags=["auth"],
              responses=_responses(*READ, 409, 503, 504))
    async def refresh(s: User, idem: Once) -> Response:
        """Swap this request's live token for a fresh one (a new expiry); the old one is
        revoked on every API server first (503 when the controller cannot be reached: no
        fresh token, the old one stays valid)."""
        async def handle() -> Response:
            await revoke(s, idem, f"refresh the token of {s.user.name}")
            return ok(token_body(auth.refresh(s)))
        return await once(idem, s.user.name, handle)

    @app.post(f"{PREFIX}/auth/logout", response_model=m.Envelope[None], tags=["auth"],
              responses=_responses(*READ, 409, 503, 504))
    async def logout(s: User, idem: Once) -> Response:
        """Revoke the token of this request on every API server (a revocation committed by
        the controller before the answer; 503 when it cannot be reached, and the token is
        then still valid)."""
        async def handle() -> Response:
            await revoke(s, idem, f"log out {s.user.name}")
            return ok(None, msg=f"user {s.user.name} logged out (the token is revoked on every "
                                "API server)")
        return await once(idem, s.user.name, handle)

    @app.post(f"{PREFIX}/auth/revoke", response_model=m.Envelope[m.Revoked], tags=["auth"],
              responses=_responses(*WRITE))
    async def revoke_tokens(s: User, body: m.RevokeTokensBody, idem: Once) -> Response:
        """Revoke every token of ``user`` issued before now, on every API server (as ``xce
        admin revoke-tokens USER``): your own (a token was stolen: log on again after it), or
        an administrator anyone's (403 otherwise). Answered once the controller committed it."""
        async def handle() -> Response:
            rid = idem.rid(s.user.name, "revoke_tokens")
            got = await forward("revoke_tokens", {"target": body.user},
                                f"revoke the tokens of {body.user}", rid, s.user.name)
            rec = got.get("record") if isinstance(got, dict) else None
            if not isinstance(rec, dict):
                raise ApiError(502, f"revoke the tokens of {body.user}: the controller answered "
                                    "no revocation record")
            auth.revocations.hold(rec)
            return ok({"user": rec.get("user"), "before": rec.get("before"), "by": rec.get("by")},
                      msg=f"every token of {body.user} issued before now is revoked on every "
                          "API server")
        return await once(idem, s.user.name, handle)

    # ------------------------------------------------------------------ jobs
    # The hot routes take the raw request (xce_apiserver.lean) and call the edge themselves:
    # the unknown-query check, authenticate, the Idempotency-Key edge, the pydantic models.
    query_names = frozenset(m.JobsQuery.model_fields)

    async def list_jobs(request: Request) -> Response:
        """Jobs from the pushed state, in job id order; paged with ``limit`` and ``cursor``.

        Paging is stable under concurrent changes: a job that matches throughout a listing
        appears in exactly one page. A page may hold fewer than ``limit`` jobs when few
        match (each request looks at a bounded number): follow ``next`` until it is null.
        """
        params = request.query_params
        refuse_unknown_query(sorted(set(params) - query_names))
        authenticate(request)
        q = parse_query(m.JobsQuery, params) if params else NO_QUERY
        states = [x.strip().upper() for x in q.state.split(",") if x.strip()] if q.state else None
        keep = [f.strip() for f in q.fields.split(",") if f.strip()] if q.fields else None
        after = int(q.cursor) if q.cursor is not None else 0
        filters = Filters(states, q.user, q.queue, q.array, keep)
        if q.limit is None:
            return StreamingResponse(stream_body(store, gate, after, filters),
                                     media_type="application/json")
        return Response(await page_body(store, gate, after, filters, q.limit),
                        media_type="application/json")

    add_lean_route(app, f"{PREFIX}/jobs", list_jobs, ["GET"],
                   response_model=m.JobPage[list[m.JobOrFields]], tags=["jobs"],
                   responses=_responses(*READ), openapi_extra={
                       "parameters": query_parameters(m.JobsQuery), "security": BEARER})

    async def get_jobs(request: Request) -> Response:
        """The named jobs; 404 naming any unknown id."""
        if request.scope["query_string"]:  # none (the usual case): nothing to parse
            refuse_unknown_query(sorted(request.query_params))
        authenticate(request)
        ids = parse_jobids(request.path_params["jobids"])
        jobs = [store.get_job(i) for i in ids]
        missing = [i for i, j in zip(ids, jobs, strict=True) if j is None]
        if missing:
            raise ApiError(404, f"no such job: {', '.join(map(str, missing[:20]))}", {"missing": missing})
        return raw_ok(jobs_json([j for j in jobs if j is not None], None), len(ids))

    add_lean_route(app, f"{PREFIX}/jobs/{{jobids:jobids}}", get_jobs, ["GET"],
                   response_model=m.Envelope[list[m.Job]], tags=["jobs"],
                   responses=_responses(*READ, 404), openapi_extra={
                       "parameters": [path_parameter("jobids", "ids, comma-separated")],
                       "security": BEARER})

    async def submit(request: Request) -> Response:
        """Submit a job as the logged-on user; envelope code 201."""
        if request.scope["query_string"]:
            refuse_unknown_query(sorted(request.query_params))
        s = authenticate(request)
        raw = await request.body()
        idem = idempotency(request, raw)
        body = parse_body(m.SubmitBody, raw, request.headers.get("content-type"))

        async def handle() -> Response:
            if body.resreq:
                check_resreq(body.resreq)
            args = body.model_dump(exclude_none=True)
            result = await forward("jobsubmit", args, "job submission",
                                   idem.rid(s.user.name, "jobsubmit"), s.user.name)
            return ok(result, code=201,
                      msg=f"job <{result.get('jobid')}> is submitted to queue <{result.get('queue')}>")
        return await once(idem, s.user.name, handle)

    for path in (f"{PREFIX}/jobs", f"{PREFIX}/jobs/create"):
        add_lean_route(app, path, submit, ["POST"], response_model=m.Envelope[m.Submitted],
                       tags=["jobs"], responses=_responses(*WRITE, 400), summary="Submit a job",
                       openapi_extra={"parameters": [IDEMPOTENCY_PARAMETER],
                                      "requestBody": json_body(m.SubmitBody), "security": BEARER})
    document_models(app, m.SubmitBody)

    @app.post(f"{PREFIX}/jobs/{{jobids:jobids}}/control", response_model=m.Envelope[list[m.Job]],
              tags=["jobs"], responses=_responses(*WRITE))
    async def control_jobs(s: User, body: m.ControlBody, jobids: Annotated[str, Path()], idem: Once) -> Response:
        """kill, stop, resume, checkpoint or requeue jobs (own jobs; admins any)."""
        ids = parse_jobids(jobids)

        async def handle() -> Response:
            done = []
            for jobid in ids:
                args: dict[str, Any] = {"jobid": jobid, "action": body.action}
                what = f"{body.action} job {jobid}"
                if body.index is not None:
                    args["index"] = body.index
                    what = f"{body.action} job {jobid}[{body.index}]"
                rid = idem.rid(s.user.name, "jobctrl", jobid)
                done.append(await forward("jobctrl", args, what, rid, s.user.name))
            return ok(done)
        return await once(idem, s.user.name, handle)

    @app.post(f"{PREFIX}/jobs/{{jobid}}/run", response_model=m.Envelope[dict[str, Any]],
              tags=["jobs"], responses=_responses(*WRITE))
    async def force_run(s: Admin, body: m.RunBody, jobid: Annotated[t.JobId, Path()], idem: Once) -> Response:
        """Admin: dispatch a pending job to named hosts now (like LSF ``brun``)."""
        async def handle() -> Response:
            alloc = run_alloc(body, store.get_job(jobid))
            args = {"jobid": jobid, "alloc": alloc, "force": body.force}
            rid = idem.rid(s.user.name, "jobdispatch")
            return ok(await forward("jobdispatch", args, f"force-run job {jobid}", rid, s.user.name))
        return await once(idem, s.user.name, handle)

    # ------------------------------------------------------------------ queues
    @app.get(f"{PREFIX}/queues", response_model=m.Envelope[list[m.Queue]], tags=["queues"],
             responses=_responses(*READ))
    async def list_queues(s: User) -> Response:
        """Queues, highest priority first."""
        return ok(store.snapshot_queues())

    @app.post(f"{PREFIX}/queues/control", response_model=m.Envelope[m.Queue], tags=["queues"],
              responses=_responses(*WRITE))
    async def control_queue(s: Admin, body: m.QueueControlBody, idem: Once) -> Response:
        """Admin: open, close, activate or inactivate a queue."""
        async def handle() -> Response:
            args = {"queue": body.queue, "action": body.action}
            rid = idem.rid(s.user.name, "queuectrl")
            return ok(await forward("queuectrl", args, f"{body.action} queue {body.queue}", rid,
                                      s.user.name))
        return await once(idem, s.user.name, handle)

    # ------------------------------------------------------------------ hosts
    @app.get(f"{PREFIX}/hosts", response_model=m.Envelope[list[m.Host]], tags=["hosts"],
             responses=_responses(*READ))
    async def list_hosts(s: User) -> Response:
        """Hosts in LSF's field names, by name."""
        return raw_ok(*selector.hosts_json())

    @app.post(f"{PREFIX}/hosts/control", response_model=m.Envelope[m.Host], tags=["hosts"],
              responses=_responses(*WRITE))
    async def control_host(s: Admin, body: m.HostControlBody, idem: Once) -> Response:
        """Admin: open or close a host (with a comment)."""
        async def handle() -> Response:
            args = {"host": body.host, "action": body.action, "comment": body.comment}
            rid = idem.rid(s.user.name, "hostctrl")
            result = await forward("hostctrl", args, f"{body.action} host {body.host}", rid, s.user.name)
            return ok(lsf_host(result) if isinstance(result, dict) and "name" in result else result)
        return await once(idem, s.user.name, handle)

    @app.post(f"{PREFIX}/hosts/select", response_model=m.Envelope[list[m.SelectedHost]],
              tags=["hosts"], responses={**_responses(*READ), 400: {"model": m.Envelope[m.ResreqErrorData],
                                                                    "description": "bad resource requirement"}})
    async def select_hosts(s: User, body: m.SelectBody, idem: Once) -> Response:
        """Hosts that satisfy a resource requirement, best first."""
        async def handle() -> Response:
            try:
                found = await anyio.to_thread.run_sync(selector.select_json, body.resreq, body.limit,
                                                       body.ntasks)
            except resreq_error as exc:
                raise ApiError(400, f"bad resource requirement: {exc.message}", exc.to_dict()) from None  # type: ignore[attr-defined]
            return raw_ok(*found)
        return await once(idem, s.user.name, handle)

    # ------------------------------------------------------------------ resources, cluster
    @app.get(f"{PREFIX}/resources", response_model=m.Envelope[list[dict[str, Any]]],
             tags=["resources"], responses=_responses(*READ))
    async def list_resources(s: User) -> Response:
        """Resource definitions: LSF's built-ins and the site's."""
        return ok([r.to_dict() for r in selector.registry().resources()])

    @app.get(f"{PREFIX}/resources/values", response_model=m.Envelope[dict[str, dict[str, Any]]],
             tags=["resources"], responses=_responses(*READ))
    async def resource_values(s: User) -> Response:
        """Each host's resource values as last pushed (no call to the controller)."""
        values = {h["name"]: dict(h.get("resvals") or {}) for h in store.snapshot_hosts()[1]}
        return EnvelopeResponse(envelope(values) | {"count": len(values)})

    @app.get(f"{PREFIX}/cluster", response_model=m.Envelope[dict[str, Any]], tags=["cluster"],
             responses=_responses(*READ))
    async def cluster(s: User) -> Response:
        """The pushed cluster configuration, with the controller that sent it."""
        return ok({**store.cluster, "server": store.server, "members": list(store.members.values())})

    # ------------------------------------------------------------------ health
    @app.get(f"{PREFIX}/healthz", response_model=m.Envelope[dict[str, Any]], tags=["health"],
             responses=_responses(405, 413))
    async def healthz() -> Response:
        """The process is up."""
        return ok({"status": "up"})

    @app.get(f"{PREFIX}/readyz", response_model=m.Envelope[dict[str, Any]], tags=["health"],
             responses={**_responses(405, 413),
                        503: {"model": m.Envelope[dict[str, Any]], "description": "not ready"}})
    async def readyz() -> Response:
        """Ready: the first state sync completed (and no snapshot is streaming), and the
        backend is not degraded."""
        degraded = await backend.degraded()
        rep = store.replica
        data = {"state_received": store.ready, "syncing": rep.syncing, "syncs": rep.syncs,
                "degraded": degraded is not None, "server": store.server, "pushes": store.pushes,
                "jobs": rep.count("jobs")}
        if not store.ready:
            why = ("a snapshot of the state is streaming" if rep.syncs
                   else "the first state sync from the controller has not completed")
            return error_response(503, f"not ready: {why}", data, {"Retry-After": "1"})
        if degraded is not None:
            return error_response(503, f"not ready: backend degraded ({degraded})", data,
                                  {"Retry-After": str(max(1, round(RETRY_AFTER)))})
        return ok(data)

    return app


def parse_jobids(text: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``; anything else is a 422 naming the bad part."""
    parts = text.split(",")
    if len(parts) > MAX_JOBIDS:
        raise ApiError(422, f"invalid request: path.jobids: more than {MAX_JOBIDS:,} job ids",
                       [{"field": "path.jobids", "message": f"more than {MAX_JOBIDS:,} job ids"}])
    ids: list[int] = []
    for part in parts:
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or not 1 <= int(part) <= lim.INT64_MAX:
            shown = part if len(part) <= 24 else part[:21] + "..."
            raise ApiError(422, f"invalid request: path.jobids: {shown!r} is not a job id (1 to "
                                f"{lim.INT64_MAX})", [{"field": "path.jobids",
                                                       "message": f"{shown!r} is not a job id"}])
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
