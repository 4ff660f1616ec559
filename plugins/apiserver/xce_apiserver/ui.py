"""The web dashboard's routes: its page, its event stream and the controller's candidates.

- ``GET /xce/v1/ui/``: the page (``static/ui/``: plain HTML, CSS and JavaScript shipped in
  the package; no build step, no CDN), with a Content-Security-Policy that lets it load
  nothing but its own files and talk to nothing but this server;
- ``POST /xce/v1/stream/ticket``: a single-use ticket for the stream (an ``EventSource``
  cannot send the bearer token; see :mod:`xce_apiserver.stream` for why a ticket);
- ``GET /xce/v1/stream?ticket=T``: the server-sent events of the replica's changes;
- ``GET /xce/v1/cluster/status``: the controller candidates, which is primary and since when
  (one ``status`` call to the controller: the page asks on load and after each failover the
  stream reports, never on a timer).
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import uuid
from collections.abc import Awaitable, Callable, Hashable
from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from xce_apiserver.auth import Authenticator, Session
from xce_apiserver.envelope import ApiError, error_response, ok
from xce_apiserver.hosts import lsf_host
from xce_apiserver.store import Store
from xce_apiserver.stream import ChangeHub, StreamRefused, Tickets, serve_stream

Forward = Callable[[str, dict[str, Any], str, str, str], Awaitable[Any]]  # op, args, what, rid, user
SessionDep = Callable[..., Awaitable[Session]]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""The page may load only its own files and talk only to this server."""

Ticket = Annotated[str | None, Query(max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                                     description="from POST /xce/v1/stream/ticket (single-use)")]


class _Page(StaticFiles):
    """The dashboard's files, each with the page's security headers."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"content-security-policy", CSP.encode()),
                                      (b"x-content-type-options", b"nosniff"),
                                      (b"referrer-policy", b"no-referrer"),
                                      (b"cache-control", b"no-cache")]
            await send(message)
        await super().__call__(scope, receive, with_headers)


def renderer(store: Store) -> Callable[[str, set[Hashable]], tuple[list[Any], list[Any]]]:
    """(kind, keys) -> (the keys' current records as the REST routes show them, keys gone)."""
    def render(kind: str, keys: set[Hashable]) -> tuple[list[Any], list[Any]]:
        items: list[Any] = []
        removed: list[Any] = []
        for key in sorted(keys, key=str):
            if kind == "jobs":
                rec = store.get_job(key) if isinstance(key, int) else None
            elif kind == "hosts":
                host = store.hosts.get(str(key))
                rec = None if host is None else lsf_host(host)
            else:
                rec = store.queues.get(str(key))
            if rec is None:
                removed.append(key)
            else:
                items.append(rec)
        return items, removed
    return render


class _Stream(Response):
    """The response of ``GET /stream``: the ASGI body is :func:`serve_stream`."""

    def __init__(self, run: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        super().__init__(media_type="text/event-stream")
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.run(scope, receive, send)


def ui_router(prefix: str, store: Store, auth: Authenticator, session: SessionDep,
              forward: Forward, responses: dict[int | str, dict[str, Any]],
              **timing: float) -> APIRouter:
    """The stream and status routes (``timing``: :func:`~xce_apiserver.stream.pump`'s
    intervals, for tests)."""
    router = APIRouter(prefix=prefix, tags=["dashboard"], responses=responses)
    User = Annotated[Session, Depends(session)]
    hub: ChangeHub = store.hub
    tickets = Tickets()
    render = renderer(store)

    @router.post("/stream/ticket")
    async def stream_ticket(s: User) -> Response:
        """A single-use ticket (valid 30 s) that opens ``GET /stream`` as this user: a
        browser's EventSource cannot send the Authorization header."""
        return ok({"ticket": tickets.issue(s.token, s.user.name), "expires_in": tickets.ttl})

    @router.get("/stream", response_class=Response,
                responses={200: {"content": {"text/event-stream": {}},
                                 "description": "server-sent events (see docs/dashboard.md)"}})
    async def stream(ticket: Ticket = None) -> Response:
        """Live changes of the pushed state as server-sent events: ``hello``, ``cluster``,
        ``hosts``, ``queues``, ``jobs``, ``resync``; a heartbeat comment every 15 s."""
        held = tickets.redeem(ticket) if ticket else None
        if held is None or auth.lookup(held[0]) is None:
            raise ApiError(401, "authentication required: open the stream with "
                                "?ticket= from POST /xce/v1/stream/ticket (single-use, 30 s)")
        token, user = held
        refused = hub.refusal(user)
        if refused is not None:
            raise ApiError(*refused, headers={"Retry-After": "5"})

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            # Opened here, not in the route: serve_stream always closes it. Streams opened
            # since the route's check may have reached a bound: open() checks again.
            try:
                client = hub.open(user)
            except StreamRefused as exc:
                refusal = error_response(exc.status, exc.why, headers={"Retry-After": "5"})
                await refusal(scope, receive, send)
                return
            await serve_stream(hub, client, render, scope, receive, send,
                               lambda: auth.lookup(token) is not None, **timing)
        return _Stream(run)

    @router.get("/cluster/status")
    async def cluster_status(s: User) -> Response:
        """The controller candidates, the primary and since when (one call to the
        controller), with the failovers this API server saw."""
        result = await forward("status", {"limit": 1}, "cluster status", f"status:{uuid.uuid4().hex}",
                               s.user.name)
        keep = ("server", "primary", "since", "candidates", "jobs", "hosts", "members", "roles",
                "promotion", "backend", "loading")
        data = {k: result.get(k) for k in keep} if isinstance(result, dict) else {}
        return ok({**data, "failovers": list(hub.failovers), "link": hub.link})

    return router


def mount_ui(app: FastAPI, prefix: str) -> None:
    """Serve the page's files at ``<prefix>/ui/``."""
    directory = files("xce_apiserver") / "static" / "ui"

    @app.get(f"{prefix}/ui", include_in_schema=False)
    async def ui_slash() -> Response:
        return RedirectResponse(f"{prefix}/ui/", status_code=308)

    app.mount(f"{prefix}/ui", _Page(directory=str(directory), html=True), name="ui")
