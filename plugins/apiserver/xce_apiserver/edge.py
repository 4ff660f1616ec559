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
- :func:`bearer_token`, :func:`parse_body`, :func:`parse_query`, :func:`refuse_unknown_query`
  and :func:`check_value`: the request's parts read and validated the way FastAPI's own
  parameter handling does, with the same pydantic models and the same error envelope, for
  the routes that take the raw request (:mod:`xce_apiserver.hot`) and the dependencies of
  every other route alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from xce_apiserver.envelope import ApiError, EnvelopeResponse, error_response
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
    exc = InvalidRequest(errors)
    return error_response(exc.status, exc.msg, exc.data)


class InvalidRequest(ApiError):
    """A request part that failed validation: the 422 of :func:`validation_response`."""

    def __init__(self, errors: Iterable[Any]) -> None:
        details = validation_details(errors)
        msg = "; ".join(f"{d['field']} {d['message']}" for d in details[:10]) or "invalid request"
        super().__init__(422, f"invalid request: {msg}", details)


def _located(errors: Iterable[Any], prefix: tuple[str | int, ...]) -> list[dict[str, Any]]:
    return [{**e, "loc": (*prefix, *e.get("loc", ()))} for e in errors]


Model = TypeVar("Model", bound=BaseModel)


def _json_content(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` says JSON (``application/json``, ``application/*+json``),
    as FastAPI decides whether to decode a body (no header: not JSON)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = media.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def parse_body(model: type[Model], raw: bytes, content_type: str | None) -> Model:
    """The request body ``raw`` validated as ``model`` (pydantic, straight from the JSON
    bytes), or :class:`InvalidRequest` naming each bad field as ``body.<field>``.

    Refused as FastAPI's parameter handling refuses a body (the other routes' edge), with
    the same words: an empty body is missing; a body without a JSON content type is not an
    object; text that is not JSON names the offset where decoding stopped."""
    if raw and _json_content(content_type):
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if all(e["loc"] for e in errors):  # the fields' errors (the body is an object)
                raise InvalidRequest(_located(errors, ("body",))) from None
        # Not JSON, or not an object: decoded and checked again to say so in the words the
        # other routes use (the offset where decoding stopped, the type it is).
        value: Any = _decode_json(raw)
    elif raw:
        value = raw
    else:
        raise InvalidRequest([{"type": "missing", "loc": ("body",), "input": None}])
    try:
        return model.model_validate(value, from_attributes=True)  # as FastAPI validates a body
    except ValidationError as exc:
        raise InvalidRequest(_located(exc.errors(include_url=False), ("body",))) from None


def _decode_json(raw: bytes) -> Any:
    """``raw`` decoded by the standard library, or the 422 of the text it is not."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest([{"type": "json_invalid", "loc": ("body", exc.pos),
                               "msg": "JSON decode error", "ctx": {"error": exc.msg}}]) from None
    except ValueError:  # not UTF-8 (or -16/-32): the words the app's 400 handler uses
        raise InvalidRequest([{"type": "json_invalid", "loc": ("body",),
                               "msg": "is not valid JSON text (UTF-8)"}]) from None


def parse_query(model: type[Model], params: Mapping[str, str]) -> Model:
    """The query parameters validated as ``model`` (lax: they are text), or
    :class:`InvalidRequest` naming each as ``query.<name>``."""
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise InvalidRequest(_located(exc.errors(include_url=False), ("query",))) from None


def check_value(adapter: TypeAdapter[Any], value: Any, where: tuple[str, str]) -> Any:
    """``value`` validated by ``adapter``, or :class:`InvalidRequest` naming ``where``
    (``("header", "Idempotency-Key")``)."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise InvalidRequest(_located(exc.errors(include_url=False), where)) from None


def refuse_unknown_query(unknown: list[str]) -> None:
    """A 422 naming the query parameters a route does not take (like a body's unknown field:
    a misspelt filter is refused, not silently ignored); nothing when there are none."""
    if unknown:
        shown = [u[:40] for u in unknown[:5]]
        raise ApiError(422, f"invalid request: query.{shown[0]} is not accepted"
                       + (f" (nor {', '.join(shown[1:])})" if len(shown) > 1 else ""),
                       [{"field": f"query.{u}", "message": "is not accepted"} for u in shown])


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (the scheme in any case), or
    None when there is none (read as FastAPI's ``HTTPBearer`` reads it)."""
    if not header:
        return None
    scheme, _, param = header.partition(" ")
    token = param.strip()
    if not scheme or not token or scheme.lower() != "bearer":
        return None
    return token


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
