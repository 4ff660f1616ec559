"""The REST API against its own OpenAPI document, fuzzed by schemathesis (bounded for CI).

Every operation gets generated requests, valid and invalid (types, sizes, NUL and control
characters, huge integers, random headers, undeclared methods), against the real app over
ASGI with the push-fed store and a backend that validates what it is sent with the
controller's own argument schemas. Checked: no 5xx, every response conforms to the documented
status codes, content type, headers and body schema, invalid data is refused with a 4xx that
names the field, and valid data is accepted (by the API server and by the controller's
schemas). ``benchmarks/bench_restfuzz.py`` runs the same with many more cases.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from apikit import Api
from hypothesis import HealthCheck, settings

pytestmark = pytest.mark.timeout(600)

EXAMPLES = 25  # per operation and phase: ~2 minutes for the whole API on 2 shared cores

API = Api()
schema = schemathesis.openapi.from_asgi("/xce/v1/openapi.json", API.app)
# Valid per the schema but refused on meaning: a resource requirement that does not parse
# (400), a force-run naming both hosts and alloc or more hosts than tasks (422); a valid
# logon past the failed-logon limit of its address (429: every case comes from one client).
schema.config.checks.positive_data_acceptance.expected_statuses = [
    "2xx", "400", "401", "403", "404", "409", "422", "429"]
# A body over max_body is refused with 413 before anything else is looked at.
schema.config.checks.negative_data_rejection.expected_statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]


@schema.auth(refresh_interval=None)
class Token:
    """A fresh administrator's token per case (a case may be POST /auth/logout)."""

    def get(self, case: Any, ctx: Any) -> str:
        return str(API.auth.issue(API.auth.users["root"]).token)

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


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True, database=None)
def test_api_conforms_to_its_openapi(case: Any) -> None:
    API.fake.fail = None
    case.call_and_validate()
