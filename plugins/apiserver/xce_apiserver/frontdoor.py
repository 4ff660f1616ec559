"""The front door's log: who asked, from where, and why they were refused; the access log.

:func:`client_of` is the one way a route names the client (its address as the socket says:
the API server reads no proxy headers). :func:`denied` logs a refused request (401, 403,
429) with who, from where and why, one line each (the log's repeat limit keeps a flood of them
to a line per interval with a count). :class:`AccessLog` is an ASGI middleware that logs one
line per request when ``[apiserver] access_log`` is on.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from loguru import logger
from starlette.requests import Request

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def client_of(request: Request) -> str:
    """The client's address (``?`` when the server does not know it)."""
    client = request.client
    return client.host if client is not None else "?"


def denied(request: Request, status: int, who: str | None, why: str) -> None:
    """Log a refused request: status, method, path, client, user (if known) and the reason."""
    logger.warning("apiserver: {} {} from {}{} refused ({}): {}", request.method,
                   request.url.path, client_of(request), f" as {who!r}" if who else "", status, why)


class AccessLog:
    """One INFO line per request: client, method, path, status, milliseconds."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [0]

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            client = scope.get("client")
            logger.info("apiserver access: {} {} {} {} {:.1f} ms",
                        client[0] if client else "?", scope.get("method", "?"),
                        scope.get("path", "?"), status[0] or "-",
                        (time.perf_counter() - t0) * 1e3)
