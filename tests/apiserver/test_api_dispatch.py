"""The lean routes are served by :class:`xce_apiserver.lean.LeanDispatch` (not FastAPI's
router), with the same envelopes; another method on their paths still gets the router's 405."""

from __future__ import annotations

from typing import Any

import pytest
from apikit import Api
from xce_apiserver.lean import LeanRoute

pytestmark = pytest.mark.anyio


def _router_refuses(api: Api) -> None:
    """Make the router's way to every lean route fail loudly: only the dispatch may serve."""
    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"the router served {scope['method']} {scope['path']}")

    for route in api.app.router.routes:
        if isinstance(route, LeanRoute):
            route.app = never


async def test_lean_routes_are_dispatched_with_the_same_envelopes(api: Api) -> None:
    _router_refuses(api)
    alice = api.token("alice")
    r = await api.client.post("/xce/v1/jobs", json={"command": "true"}, headers=alice)
    assert r.status_code == 200 and r.json()["code"] == 201, r.text
    assert r.headers["Idempotency-Key"].startswith('"')
    r = await api.client.post("/xce/v1/jobs/create", json={"command": "true"}, headers=alice)
    assert r.status_code == 200 and r.json()["data"]["jobid"] > 1000, r.text
    r = await api.client.get("/xce/v1/jobs?limit=2", headers=alice)
    assert r.status_code == 200 and r.json()["count"] == 2 and r.json()["next"] == "2", r.text
    r = await api.client.get("/xce/v1/jobs/1,3", headers=alice)
    assert [j["jobid"] for j in r.json()["data"]] == [1, 3], r.text
    # failures: the app's handlers, the same envelope and words as before
    r = await api.client.post("/xce/v1/jobs", json={"command": "true"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
    assert r.json()["msg"].startswith("authentication required")
    r = await api.client.post("/xce/v1/jobs", json={"command": ""}, headers=alice)
    assert r.status_code == 422 and r.json()["msg"] == "invalid request: body.command is empty"
    r = await api.client.get("/xce/v1/jobs/9", headers=alice)
    assert r.status_code == 404 and r.json()["data"] == {"missing": [9]}, r.text
    r = await api.client.get("/xce/v1/jobs?bogus=1", headers=alice)
    assert r.status_code == 422 and r.json()["msg"] == "invalid request: query.bogus is not accepted"


async def test_other_methods_on_lean_paths_get_the_routers_405(api: Api) -> None:
    alice = api.token("alice")
    r = await api.client.delete("/xce/v1/jobs", headers=alice)
    assert r.status_code == 405, r.text
    assert r.headers["Allow"] == "GET, POST"
    assert r.json()["code"] == 405 and "allowed: GET, POST" in r.json()["msg"]
    r = await api.client.put("/xce/v1/jobs/1", headers=alice)
    assert r.status_code == 405 and "GET" in r.headers["Allow"], r.text
