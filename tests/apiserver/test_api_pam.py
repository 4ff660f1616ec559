"""PAM logon against a real system user the test creates (root: useradd, chpasswd)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from test_api_frontdoor import jobs, logon, start_api

from xcecore.testing import LocalCluster, wait_for
from xcecore.testing.munge import TestUsers, require

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def test_pam_logon_of_a_real_system_user(xce_cluster: Callable[..., LocalCluster],
                                         tmp_path: Path) -> None:
    require("chpasswd", root=True)
    users = TestUsers()
    try:
        user = users.add("pam")
        subprocess.run(["chpasswd"], input=f"{user.name}:S3cret-{users.tag}\n", text=True,
                       check=True, capture_output=True)
        cl = xce_cluster(1)
        # "other": Debian's fallback service (common-auth, common-account), no fail delay.
        proc, base = start_api(cl, tmp_path, "web1", 'apiserver.pam_service="other"')
        r = logon(base, user.name, f"S3cret-{users.tag}")
        assert r.status_code == 200, r.text
        body = r.json()["data"]
        assert body["username"] == user.name and body["role"] == "user"
        assert jobs(base, body["token"]) == 200
        r = httpx.post(f"{base}/jobs", json={"command": "true"}, timeout=10,
                       headers={"Authorization": f"Bearer {body['token']}"})
        assert r.status_code == 200 and r.json()["code"] == 201, r.text
        jobid = r.json()["data"]["jobid"]
        hdr = {"Authorization": f"Bearer {body['token']}"}
        seen = wait_for(lambda: [j for j in httpx.get(f"{base}/jobs", headers=hdr, timeout=10)
                                 .json()["data"] if j["jobid"] == jobid], 20, what="the job")
        assert seen[0]["user"] == user.name  # the controller was told whom it acts for
        assert logon(base, user.name, "wrong").status_code == 401
        assert logon(base, "alice", "pw").status_code == 200  # the configured list still works
        assert f"as '{user.name}' refused (401): logon failed" in proc.text()
    finally:
        assert users.remove() == []
