"""REST routes of the job history: ``GET /xce/v1/history/...``, answered by the accounting role.

Each route makes one delegated call through the controller (``history.jobs``,
``history.summary``, ``history.job``, ``history.events``) acting for the logged-on user; the
controller attaches that user to the call and the accounting role authorizes from it (users
see their own jobs, administrators -- the controller's ``admins`` -- everyone's). 503 when no
accounting role is connected.
"""


import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response

from xce_apiserver.auth import Session
from xce_apiserver.envelope import ok
from xcecore.schema import limits as lim
from xcecore.schema import types as t
from xcecore.schema.delegated import PAGE_MAX

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
Forward = Callable[[str, dict[str, Any], str, str, str], Awaitable[Any]]  # op, args, what, rid, user
SessionDep = Callable[..., Awaitable[Session]]
Epoch = Annotated[float | None, Query(ge=0, le=1e11, description="seconds since 1970")]
Cursor = Annotated[str | None, Query(min_length=1, max_length=256, pattern=r"^[0-9A-Za-z_.:-]+$",
                                     description="the `next` of the previous page")]
Limit = Annotated[int, Query(ge=1, le=PAGE_MAX, description=f"rows per page, 1 to {PAGE_MAX}")]


def history_router(prefix: str, session: SessionDep, forward: Forward,
                   responses: dict[int | str, dict[str, Any]]) -> APIRouter:
    """The history routes under ``prefix``, calling the controller through ``forward``;
    ``responses``: the failures they document."""
    router = APIRouter(prefix=f"{prefix}/history", tags=["history"], responses=responses)
    User = Annotated[Session, Depends(session)]

    async def call(s: Session, op: str, args: dict[str, Any], what: str) -> Any:
        body = {k: v for k, v in args.items() if v is not None}
        body["user"] = s.user.name
        return await forward(op, body, what, f"history:{uuid.uuid4().hex}", s.user.name)

    @router.get("/jobs")
    async def history_jobs(
        s: User,
        owner: Annotated[t.Name | None, Query(description="only this user's (administrators)")] = None,
        queue: Annotated[t.Name | None, Query()] = None,
        project: Annotated[t.Name | None, Query()] = None,
        host: Annotated[t.Name | None, Query(description="ran on this host")] = None,
        state: Annotated[Literal["DONE", "EXIT", "REQUEUED"] | None, Query()] = None,
        since: Epoch = None,
        until: Epoch = None,
        cursor: Cursor = None,
        limit: Limit = 100,
    ) -> Response:
        """Finished job attempts, newest end first: ``{"rows": [...], "next": cursor|null}``."""
        return ok(await call(s, "history.jobs", {
            "owner": owner, "queue": queue, "project": project, "host": host, "state": state,
            "since": since, "until": until, "cursor": cursor, "limit": limit}, "job history"))

    @router.get("/summary")
    async def history_summary(
        s: User,
        owner: Annotated[t.Name | None, Query()] = None,
        queue: Annotated[t.Name | None, Query()] = None,
        project: Annotated[t.Name | None, Query()] = None,
        host: Annotated[t.Name | None, Query()] = None,
        state: Annotated[Literal["DONE", "EXIT", "REQUEUED"] | None, Query()] = None,
        since: Epoch = None,
        until: Epoch = None,
    ) -> Response:
        """Jobs, CPU and wall hours, wait-time percentiles, failures by reason (like bacct)."""
        return ok(await call(s, "history.summary", {
            "owner": owner, "queue": queue, "project": project, "host": host, "state": state,
            "since": since, "until": until}, "job history summary"))

    @router.get("/jobs/{jobid}")
    async def history_job(s: User, jobid: Annotated[int, Path(ge=1, le=lim.INT64_MAX,
                                                             description="the job")]) -> Response:
        """One job's attempts and timeline (like bhist -l)."""
        return ok(await call(s, "history.job", {"jobid": jobid}, f"history of job {jobid}"))

    @router.get("/events")
    async def history_events(
        s: User,
        jobid: Annotated[int | None, Query(ge=1, le=lim.INT64_MAX,
                                           description="this job's timeline; without: cluster events")] = None,
        since: Epoch = None,
        until: Epoch = None,
        cursor: Cursor = None,
        limit: Limit = 100,
    ) -> Response:
        """A job's timeline or the cluster's events: ``{"events": [...], "next": cursor|null}``."""
        return ok(await call(s, "history.events", {"jobid": jobid, "since": since, "until": until,
                                                   "cursor": cursor, "limit": limit}, "events"))

    return router
