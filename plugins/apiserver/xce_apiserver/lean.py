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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import request_response

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
    """Add a :class:`LeanRoute`, ahead of the others: the hot routes match first."""
    route = LeanRoute(path, endpoint, methods=methods, **kwargs)
    app.router.routes.insert(0, route)
    return route


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
