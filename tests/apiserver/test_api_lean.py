"""The hot routes (``POST /jobs``, ``GET /jobs``, ``GET /jobs/{ids}``) take the raw request
and call the edge themselves (:mod:`xce_apiserver.lean`); against a real controller and a real
``xce run apiserver`` process: a bad body, token or Idempotency-Key gets the error it always
got, in the same words as the routes FastAPI's parameter handling serves (one edge), and a good
one is a job the controller holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_api_frontdoor import logon, start_api

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

JSON = {"content-type": "application/json"}

BAD_BODIES: list[tuple[bytes, dict[str, str], str]] = [
    (b"", JSON, "invalid request: body is required"),
    (b"null", JSON, "invalid request: body must be object, got null"),
    (b'{"command": ', JSON, "invalid request: body.12 JSON decode error"),
    (b"\xff\xfe", JSON, "invalid request: body.0 JSON decode error"),
    (b'{"command": "\xff"}', JSON, "invalid request: body is not valid JSON text (UTF-8)"),
    (b"[1]", JSON, "invalid request: body must be object, got list"),
    (b'{"command": "x"}', {"content-type": "text/plain"}, "invalid request: body must be object, got bytes"),
    (b'{"command": "x"}', {}, "invalid request: body must be object, got bytes"),
    (b"{}", JSON, "invalid request: body.command is required"),
    (b'{"command": "x", "ntasks": "2"}', JSON, "invalid request: body.ntasks must be int, got str"),
    (b'{"command": "x", "ntasks": 1180591620717411303424}', JSON,
     "invalid request: body.ntasks must be <= 2147483647, got 1180591620717411303424"),
    (b'{"command": "x", "bogus": 1}', JSON, "invalid request: body.bogus is not accepted"),
    (b'{"command": "", "ntasks": 0, "cwd": 5}', JSON,
     "invalid request: body.command is empty; body.cwd must be str, got int; body.ntasks must be "
     ">= 1, got 0"),
]

WHOLE_BODY = 8
"""The first BAD_BODIES are wrong as a whole (not a field of a submission's)."""

BAD_KEYS = [('"a"b"', "invalid request: header.Idempotency-Key: has unbalanced quotes"),
            ("x" * 65, "invalid request: header.Idempotency-Key: must have 1 to 64 characters"),
            ("", "invalid request: header.Idempotency-Key is empty"),
            ("sp ace", "invalid request: header.Idempotency-Key must match")]

NEED_TOKEN = ("authentication required: send 'Authorization: Bearer <token>' (POST "
              "/xce/v1/auth/logon gives one)")


def _env(r: httpx.Response) -> dict[str, Any]:
    env: dict[str, Any] = r.json()
    assert env["code"] == r.status_code or (r.status_code == 200 and env["code"] == 201), env
    return env


def test_the_hot_routes_refuse_as_every_route_does_and_submit_for_real(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    _, base = start_api(cl, tmp_path, "web")
    token = logon(base).json()["data"]["token"]
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=30) as http:
        for i, (body, headers, msg) in enumerate(BAD_BODIES):
            r = http.post("/jobs", content=body, headers={**auth, **headers})
            env = _env(r)
            assert r.status_code == 422 and env["msg"] == msg, (body, env)
            if i < WHOLE_BODY:  # /hosts/select's body: FastAPI's own parameter handling, same words
                other = _env(http.post("/hosts/select", content=body, headers={**auth, **headers}))
                assert other["msg"] == msg, (body, other)
        for key, msg in BAD_KEYS:
            hdr = {**auth, "Idempotency-Key": key}
            env = _env(http.post("/jobs", json={"command": "true"}, headers=hdr))
            assert env["code"] == 422 and env["msg"].startswith(msg), (key, env)
            other = _env(http.post("/hosts/select", json={"resreq": "select[ncpus>0]"}, headers=hdr))
            assert other["msg"] == env["msg"], (key, other)
        for hdr, msg in (({}, NEED_TOKEN), ({"Authorization": "Basic abc"}, NEED_TOKEN),
                         ({"Authorization": "Bearer abc"}, "invalid or expired token; log on again")):
            for path in ("/jobs", "/jobs/create", "/hosts/select"):
                r = http.post(path, json={"command": "true"}, headers=hdr)
                assert r.status_code == 401 and _env(r)["msg"] == msg, (path, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
            for path in ("/jobs", "/jobs/1", "/queues"):
                r = http.get(path, headers=hdr)
                assert r.status_code == 401 and _env(r)["msg"] == msg, (path, r.text)
        r = http.get("/jobs?usr=alice", headers=auth)
        assert r.status_code == 422 and _env(r)["msg"] == "invalid request: query.usr is not accepted"
        r = http.get("/jobs?limit=0", headers=auth)
        assert _env(r)["msg"] == "invalid request: query.limit must be >= 1, got '0'"
        # A good submission: the controller holds it, the replica shows it, a replay is the same.
        hdr = {**auth, "Idempotency-Key": '"lean-1"'}
        first = http.post("/jobs", json={"command": "true", "name": "lean"}, headers=hdr)
        again = http.post("/jobs", json={"command": "true", "name": "lean"}, headers=hdr)
        env = _env(first)
        assert first.status_code == 200 and env["code"] == 201 and first.content == again.content
        assert first.headers["idempotency-key"] == '"lean-1"'
        jobid = env["data"]["jobid"]
        r = http.post("/jobs", json={"command": "true", "name": "other"}, headers=hdr)
        assert r.status_code == 422 and "was used for a different request" in _env(r)["msg"]

        def pushed() -> dict[str, Any] | None:  # the controller's push reached the replica
            r = http.get(f"/jobs/{jobid}", headers=auth)
            return _env(r)["data"][0] if r.status_code == 200 else None

        job = wait_for(pushed, 30, what="the submitted job in the API server's replica")
        assert job["jobid"] == jobid and job["name"] == "lean" and job["user"] == "alice"
        assert job["status"] == job["state"] and isinstance(job["submittime"], int)
        page = _env(http.get("/jobs?limit=1000&fields=jobid,name", headers=auth))
        assert {"jobid": jobid, "name": "lean"} in page["data"] and page["next"] is None
        r = http.get(f"/jobs/{jobid},{jobid + 1000}", headers=auth)
        assert r.status_code == 404 and _env(r)["data"] == {"missing": [jobid + 1000]}
