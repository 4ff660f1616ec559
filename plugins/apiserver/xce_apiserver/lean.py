"""Routes that take the raw request: the hot path of the REST API, documented all the same.

FastAPI's dependency resolution and parameter handling cost about half a millisecond of CPU a
request; for the routes a busy site calls thousands of times a second (``POST /jobs``,
``GET /jobs``, ``GET /jobs/{jobids}``) that is most of the API server's work. A
:class:`LeanRoute` is an ``APIRoute`` (it is in the OpenAPI document, in the route metrics and
in the ``Allow`` of a 405) whose endpoint takes the Starlette request and calls the edge
explicitly -- the same token check, Idempotency-Key edge, pydantic models and error envelope as
every other route (:mod:`xce_apiserver.edge`) -- and returns a response already encoded.

What FastAPI would have derived from the endpoint's signature is declared from those same
models instead (:func:`query_parameters`, :func:`header_parameter`, :func:`json_body`), so
the document says exactly what the edge checks.

:class:`LeanDispatch` serves them: the innermost of the app's middlewares (so the request
metrics, the writes-first gate and the body limit see every request as before), it hands a
request for a lean route straight to its endpoint, with the app's own exception handlers
(the same envelopes), instead of through FastAPI's exception middleware, exit-stack
middleware, router and route wrappers -- about a fifth of the API server's CPU per
``POST /jobs``. Any other request, and a lean route's path with another method (the 405
with every allowed method), goes on to the router.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, request_response
from starlette.types import ASGIApp, Receive, Scope, Send

SCHEMAS = "#/components/schemas/{model}"

BEARER: list[dict[str, list[str]]] = [{"HTTPBearer": []}]
"""The security requirement of a route behind the token check (the scheme every other route
declares through ``HTTPBearer``)."""

Endpoint = Callable[[Request], Awaitable[Response]]


class LeanRoute(APIRoute):
    """An ``APIRoute`` whose endpoint takes the request: no dependencies, no parameter
    handling, no response model validation; Starlette's request/response wrapper (with the
    app's exception handlers) around it."""

    def __init__(self, path: str, endpoint: Endpoint, **kwargs: Any) -> None:
        super().__init__(path, endpoint, dependencies=[], **kwargs)
        self.app = request_response(endpoint)


def add_lean_route(app: FastAPI, path: str, endpoint: Endpoint, methods: list[str],
                   **kwargs: Any) -> LeanRoute:
    """Add a :class:`LeanRoute`, ahead of the others: the hot routes match first (and
    :class:`LeanDispatch` serves them, once installed with :func:`install_dispatch`)."""
    route = LeanRoute(path, endpoint, methods=methods, **kwargs)
    app.router.routes.insert(0, route)
    return route


ExceptionHandler = Callable[[Request, Any], Response | Awaitable[Response]]


class LeanDispatch:
    """ASGI middleware: a request for a :class:`LeanRoute` goes to its endpoint directly.

    Which route serves a request is what the router would have chosen (the lean routes are
    ahead of every other, and each is tried in the router's order: an exact path is a dict
    lookup, a path with parameters the route's own ``matches``); ``scope`` gets the route,
    endpoint and path parameters the router would have set. An exception of the endpoint
    becomes the response of the app's handler for it (``app.exception_handlers``, the one
    set of handlers of every route); one without a handler (a crash) propagates to the app's
    server-error handler, as from any route.
    """

    def __init__(self, app: ASGIApp, owner: FastAPI) -> None:
        self.app = app
        self.owner = owner
        self._exact: dict[tuple[str, str], LeanRoute] | None = None
        self._patterned: list[LeanRoute] = []
        self._handlers: dict[type[BaseException], ExceptionHandler] = {}

    def _index(self) -> dict[tuple[str, str], LeanRoute]:
        """The lean routes by (method, path), and those with parameters in order (built at
        the first request: every route is added by then)."""
        exact: dict[tuple[str, str], LeanRoute] = {}
        for route in self.owner.router.routes:
            if not isinstance(route, LeanRoute):
                continue
            if route.param_convertors:
                self._patterned.append(route)
                continue
            for method in route.methods or ():
                exact.setdefault((method, route.path), route)
        self._handlers = {k: v for k, v in self.owner.exception_handlers.items()
                          if isinstance(k, type) and k is not Exception}
        self._exact = exact
        return exact

    def _route(self, scope: Scope) -> LeanRoute | None:
        exact = self._exact if self._exact is not None else self._index()
        route = exact.get((scope["method"], scope["path"]))
        if route is not None:
            scope["route"], scope["endpoint"] = route, route.endpoint
            scope.setdefault("path_params", {})
            return route
        for route in self._patterned:
            match, child = route.matches(scope)
            if match is Match.FULL:
                scope.update(child)
                return route
            if match is Match.PARTIAL:
                return None  # the router answers 405 with every allowed method
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            answer = handler(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> ExceptionHandler | None:
        for cls in type(exc).__mro__:
            handler = self._handlers.get(cls)
            if handler is not None:
                return handler
        return None


def install_dispatch(app: FastAPI) -> None:
    """Serve the app's lean routes with :class:`LeanDispatch`; call it before adding any
    other middleware, so that it is the innermost and every other one sees these requests."""
    app.add_middleware(LeanDispatch, owner=app)


def _schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    return adapter.json_schema(ref_template=SCHEMAS)


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The OpenAPI query parameters of ``model``'s fields (all optional)."""
    schema = model.model_json_schema(ref_template=SCHEMAS)
    out = []
    for name, prop in schema.get("properties", {}).items():
        param: dict[str, Any] = {"name": name, "in": "query", "required": name in
                                 schema.get("required", ()), "schema": prop}
        if "description" in prop:
            param["description"] = prop["description"]
        out.append(param)
    return out


def header_parameter(name: str, adapter: TypeAdapter[Any], description: str) -> dict[str, Any]:
    """An optional header parameter of type ``adapter``."""
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {**_schema(adapter), "title": name, "description": description}}


def path_parameter(name: str, description: str) -> dict[str, Any]:
    """A string path parameter."""
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "title": name.capitalize(), "description": description}}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """A required JSON request body of ``model`` (see :func:`document_models`)."""
    return {"required": True, "content": {"application/json": {
        "schema": {"$ref": SCHEMAS.format(model=model.__name__)}}}}


def document_models(app: FastAPI, *models: type[BaseModel]) -> None:
    """Put ``models`` (and what they refer to) in the OpenAPI document's components: the
    lean routes refer to them, and FastAPI only collects the models of signatures."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template=SCHEMAS)
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
