"""REST route of the cluster events: ``GET /xce/v1/events``, one ``events`` call to the controller.

The envelope's ``data`` is the page's events (oldest first, each ``{"seq", "time", "kind",
...fields, "text"}``), ``count`` their number, and beside them ``next`` (pass it as ``since``
for the following page: every event comes exactly once), ``more`` (a full page is waiting),
``oldest`` and ``newest`` (the seqs the controller keeps). Any logged-on user may read them.
"""


import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from xce_apiserver.auth import Session
from xce_apiserver.envelope import EnvelopeResponse, envelope
from xcecore.schema import types as t
from xcecore.schema.limits import PAGE_MAX

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
Forward = Callable[[str, dict[str, Any], str, str, str], Awaitable[Any]]  # op, args, what, rid, user
SessionDep = Callable[..., Awaitable[Session]]


def events_router(prefix: str, session: SessionDep, forward: Forward,
                  responses: dict[int | str, dict[str, Any]]) -> APIRouter:
    """The events route under ``prefix``, calling the controller through ``forward``."""
    router = APIRouter(prefix=prefix, tags=["events"], responses=responses)
    User = Annotated[Session, Depends(session)]

    @router.get("/events")
    async def list_events(
        s: User,
        since: Annotated[int, Query(ge=0, le=2**63 - 1, description="events after this seq: "
                                    "the `next` of the previous page (default 0)")] = 0,
        kind: Annotated[t.Name | None, Query(description="only this kind: promotion, "
                                             "member_join, member_leave, host_state, "
                                             "queue_state, reconfig, shutdown")] = None,
        since_time: Annotated[float | None, Query(ge=0, le=1e11, description="only events at "
                                                  "or after this time (epoch seconds)")] = None,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX, description=f"events per page, 1 to "
                                    f"{PAGE_MAX}")] = 100,
        last: Annotated[bool, Query(description="the newest `limit` events instead")] = False,
    ) -> Response:
        """A page of cluster events, oldest first (docs/rest.md, "Events")."""
        args: dict[str, Any] = {"since_seq": since, "limit": limit}
        if kind is not None:
            args["kind"] = kind
        if since_time is not None:
            args["since_time"] = since_time
        if last:
            args["last"] = True
        page = await forward("events", args, "cluster events", f"events:{uuid.uuid4().hex}",
                             s.user.name)
        body = envelope(page["events"]) | {k: page[k] for k in ("next", "more", "oldest", "newest")}
        return EnvelopeResponse(body)

    return router
