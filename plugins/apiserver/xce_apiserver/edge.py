"""The HTTP edge in front of the routes: body size, validation errors, methods, path ids.

- :class:`BodyLimit` refuses a request body over ``max_body`` bytes with 413 before any of
  it is parsed (by its ``Content-Length``, or by counting a chunked body as it arrives), so
  an oversized submission never reaches the controller.
- :func:`validation_response` turns pydantic's errors into the 422 envelope, naming each
  field (``body.env.PATH``) and its limit in the words the controller uses for ``INVALID``
  (both come from :func:`xcecore.schema.errors.describe`).
- :func:`allowed_methods` lists every method of every route whose path matches, for the
  ``Allow`` header of a 405 (Starlette names only the first matching route's).
- :class:`JobIdsConvertor` is the ``{jobids}`` path segment: anything but ``create``, so
  ``/jobs/create`` belongs to job submission alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from xce_apiserver.envelope import EnvelopeResponse, error_response
from xcecore.schema.errors import describe, limit_of

DEFAULT_MAX_BODY = 1024 * 1024
"""Bytes a request body may have (``[apiserver] max_body``): far above any real submission,
far below the controller's frame."""


class BodyTooLarge(HTTPException):
    """A request body over the limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body too large: at most {limit:,} bytes")


class BodyLimit:
    """ASGI middleware: a body over ``max_bytes`` is a 413, whatever the route."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            exc = BodyTooLarge(self.max_bytes)
            await error_response(413, exc.detail, {"limit": self.max_bytes},
                                 {"Connection": "close"})(scope, receive, send)
            return
        seen = 0
        limit = self.max_bytes

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # a chunked body, or one longer than its Content-Length
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects a malformed length itself
    return None


def validation_details(errors: Iterable[Any]) -> list[dict[str, Any]]:
    """Each failed field: ``{"field", "message", "type"}`` and its ``limit`` when it has one."""
    out: list[dict[str, Any]] = []
    for e in errors:
        field, message = describe(e)
        item: dict[str, Any] = {"field": field or "request", "message": message,
                                "type": e.get("type", "")}
        limit = limit_of(e)
        if limit:
            item["limit"] = limit
        out.append(item)
    return out


def validation_response(errors: Iterable[Any]) -> EnvelopeResponse:
    """The 422 envelope for failed validation: ``msg`` names every field and what is wrong."""
    details = validation_details(errors)
    msg = "; ".join(f"{d['field']} {d['message']}" for d in details[:10]) or "invalid request"
    return error_response(422, f"invalid request: {msg}", details)


def query_names(route: Any) -> frozenset[str]:
    """Every query parameter ``route`` declares (its dependencies' too)."""
    names: set[str] = set()
    todo = [getattr(route, "dependant", None)]
    while todo:
        dependant = todo.pop()
        if dependant is None:
            continue
        names.update(p.alias for p in dependant.query_params)
        todo.extend(dependant.dependencies)
    return frozenset(names)


def unknown_query(route: Any, given: Iterable[str], cache: dict[int, frozenset[str]]) -> list[str]:
    """The query parameters a request gives that its route does not take (sorted)."""
    names = cache.get(id(route))
    if names is None:
        names = cache[id(route)] = query_names(route)
    return sorted(set(given) - names)


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The methods of every route whose path matches ``scope`` (for a 405's ``Allow``)."""
    methods: set[str] = set()
    probe = {**scope, "method": "\x00"}  # no route takes this method: a path match is PARTIAL
    for route in routes:
        match, _ = route.matches(probe)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


class JobIdsConvertor(Convertor[str]):
    """The ``{jobids}`` segment: any segment but ``create`` (``POST /jobs/create`` submits)."""

    regex = "(?!create(?:/|$))[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("jobids", JobIdsConvertor())
