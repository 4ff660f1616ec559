"""Schemathesis hooks of ``bench_restfuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

A bearer token from a real logon (again after a fuzzed ``POST /auth/logout`` revoked it), and
the check the CI test ``tests/apiserver/test_api_conformance.py`` makes too: every 4xx says
why, a 422 names the field.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import schemathesis

LOGON_FROM = "127.0.0.2"  # loopback: the whole of 127.0.0.0/8 reaches the API server's 127.0.0.1


@schemathesis.auth(refresh_interval=None)
class Logon:
    """Log on as the benchmark's administrator (``XCE_FUZZ_URL``, ``XCE_FUZZ_USER``/``_PASSWORD``)."""

    def get(self, case: Any, ctx: Any) -> str:
        # From an address of its own: the fuzzed logons (wrong passwords, from 127.0.0.1) soon
        # pass the failed-logon limit of theirs, and the front door then answers 429 there.
        with httpx.Client(transport=httpx.HTTPTransport(local_address=LOGON_FROM), timeout=10) as c:
            r = c.post(f"{os.environ['XCE_FUZZ_URL']}/auth/logon",
                       json={"username": os.environ["XCE_FUZZ_USER"],
                             "password": os.environ["XCE_FUZZ_PASSWORD"]})
        r.raise_for_status()
        return str(r.json()["data"]["token"])

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schemathesis.check
def a_4xx_names_what_is_wrong(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every refusal says why, and a 422 names the field."""
    if 400 <= response.status_code < 500:
        env = response.json()
        assert env["code"] == response.status_code and env["msg"], env
        if response.status_code == 422:
            msg = env["msg"]
            # a field of the request, or an argument the controller refused (named the same)
            assert any(w in msg for w in ("body", "query.", "path.", "header.", "argument '")), msg
    return None
