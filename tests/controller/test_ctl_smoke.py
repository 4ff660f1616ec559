"""Smoke: a primary answers, submits are durable, pushes arrive."""

from __future__ import annotations

import pytest
from ctl_testlib import RawClient, running

pytestmark = pytest.mark.anyio


async def test_submit_and_read(tmp_path):
    async with running(tmp_path) as ctl:
        assert ctl.role == "primary"
        c = await RawClient.connect(ctl.address)
        assert c.hello["state"] == "primary"
        r = await c.ok("jobsubmit", {"command": "sleep 1", "user": "alice"}, rid="r1")
        assert r == {"jobid": 1, "queue": "normal", "state": "PEND"}
        jobs = (await c.ok("jobinfo", {}))["jobs"]
        assert [j["jobid"] for j in jobs] == [1]
        await c.aclose()
