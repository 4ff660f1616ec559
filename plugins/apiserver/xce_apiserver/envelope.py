"""The REST API's one response shape, ``{"code", "msg", "data", "count"}``, and its errors.

Every response, success or failure, is this envelope rendered with orjson; ``code`` equals
the HTTP status except 201 for a created job (HTTP 200).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse

from xcecore.wire import RemoteError

STATUS = {"NOT_FOUND": 404, "DENIED": 403, "CONFLICT": 409, "INVALID": 422, "INTERNAL": 500,
          "STORAGE": 503, "UNAVAILABLE": 503}
"""Controller error code -> HTTP status. ``STORAGE``: the controller refused the write (its
store cannot write now), nothing was applied: retry later. ``UNAVAILABLE``: no member serves
a delegated op (history), or it did not answer. Any other code is 502."""


def dumps(value: Any) -> bytes:
    """JSON bytes (orjson; integer keys allowed)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


class EnvelopeResponse(JSONResponse):
    """A JSON response rendered with orjson (a ``JSONResponse``, so that FastAPI documents
    each route's response model rather than ``{"type": "string"}``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialize ``content``."""
        return dumps(content)


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


def error_response(status: int, msg: str, data: Any = None,
                   headers: dict[str, str] | None = None) -> EnvelopeResponse:
    """A failure envelope with HTTP ``status``."""
    return EnvelopeResponse(envelope(data, status, msg), status_code=status, headers=headers)


def from_api_error(exc: ApiError) -> EnvelopeResponse:
    """The response of an :class:`ApiError`."""
    return error_response(exc.status, exc.msg, exc.data, exc.headers)


def remote_to_api(exc: RemoteError, what: str) -> ApiError:
    """Map a controller error reply to an HTTP failure naming what failed."""
    status = STATUS.get(exc.code, 502)
    data = {"error": exc.code, **exc.data}
    headers = {"Retry-After": "1"} if status == 503 else None
    return ApiError(status, f"{what}: {exc.message or exc.code}", data, headers)
