"""REST history routes: a real API server, controller, worker, scheduler and accounting role.

The API server calls the delegated history ops acting for the logged-on user; the accounting
role authorizes from the user the controller attached (today: the ``user`` a front end names,
the controller's ``admins`` being administrators; the authenticated identity work replaces it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from xce_apiserver.auth import hash_password

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.e2e]


def test_history_over_rest_for_the_logged_on_user(xce_cluster: Any, tmp_path: Path) -> None:
    cl: LocalCluster = xce_cluster(1, extra_config='[controller]\nadmins = ["ops"]\n')
    cl.start_role("worker", 'worker.hname="node1"', f'worker.state_dir="{tmp_path / "node1"}"',
                  "worker.monitor_interval=0.1", "worker.slots=4", name="node1")
    cl.start_role("scheduler")
    cl.start_role("accounting", f'accounting.path="{tmp_path / "acct.db"}"', "accounting.flush_interval=0.02")
    pw = hash_password("pw", iterations=1000)
    users = (f'[{{name = "alice", password_hash = "{pw}", role = "user"}}, '
             f'{{name = "ops", password_hash = "{pw}", role = "admin"}}]')
    _, base = cl.start_apiserver(tmp_path / "api.port", f"apiserver.users={users}")
    _, cfg = load(cl.config_path)
    with httpx.Client(base_url=base, timeout=30) as http, \
            SyncClient.open(client_config(cfg, "apiserver@test"), role="apiserver") as c:  # a front end: it names users
        def hdr(user: str) -> dict[str, str]:
            r = http.post("/xce/v1/auth/logon", json={"username": user, "password": "pw"})
            return {"Authorization": f"Bearer {r.json()['data']['token']}"}

        alice, ops = hdr("alice"), hdr("ops")
        wait_for(lambda: http.get("/xce/v1/history/events", headers=alice).status_code == 200, 60,
                 what="the accounting role serves history")
        mine = [http.post("/xce/v1/jobs", json={"command": "true"}, headers=alice).json()["data"]["jobid"]
                for _ in range(3)]
        bobs = [c.call("jobsubmit", {"command": "exit 2", "user": "bob"}, deadline=30)["jobid"] for _ in range(2)]

        def rows(h: dict[str, str], **q: Any) -> list[dict[str, Any]]:
            r = http.get("/xce/v1/history/jobs", params=q, headers=h)
            assert r.status_code == 200, r.text
            return list(r.json()["data"]["rows"])

        wait_for(lambda: len(rows(ops, limit=1000)) == 5, 60, what="five jobs recorded")
        assert sorted(r["jobid"] for r in rows(alice)) == sorted(mine)
        assert sorted(r["jobid"] for r in rows(ops, owner="bob")) == sorted(bobs)
        assert all(r["reason"] == "exit code 2" for r in rows(ops, state="EXIT"))
        assert http.get("/xce/v1/history/jobs", params={"owner": "bob"}, headers=alice).status_code == 403
        assert http.get(f"/xce/v1/history/jobs/{bobs[0]}", headers=alice).status_code == 403
        assert http.get("/xce/v1/history/jobs", params={"limit": 5000}, headers=alice).status_code == 422
        assert http.get("/xce/v1/history/jobs", headers={}).status_code == 401
        # A job id past 64 bits is the caller's error naming the parameter, not a 500 (the
        # REST fuzzer's find: the id reached the encoder of the controller call).
        for url, params in ((f"/xce/v1/history/jobs/{2**64}", {}), ("/xce/v1/history/events", {"jobid": 2**70})):
            big = http.get(url, params=params, headers=alice)
            assert big.status_code == 422 and "jobid" in big.json()["msg"], big.text
        one = http.get(f"/xce/v1/history/jobs/{mine[0]}", headers=alice).json()["data"]
        assert [e["kind"] for e in one["events"]][-1] == "finished" and one["attempts"][0]["state"] == "DONE"
        ev = http.get("/xce/v1/history/events", params={"jobid": mine[0], "limit": 2}, headers=alice).json()["data"]
        assert len(ev["events"]) == 2 and ev["next"] is not None
        summary = http.get("/xce/v1/history/summary", params={"owner": "bob"}, headers=ops).json()["data"]
        assert (summary["jobs"], summary["exit"], summary["failures"]) == (2, 2, {"exit code 2": 2})
        # The commands: xce hist and xce acct, as processes. Who runs them is the authenticated
        # OS user (root here: under key auth the cluster's owner, an administrator), whatever
        # $LOGNAME says; another user's history refused is shown over REST above and in the
        # cluster test, through the same delegated ops.
        def xce(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cl.config_path), *argv],
                                  env={**os.environ, "USER": "alice", "LOGNAME": "alice"},
                                  capture_output=True, text=True, timeout=60)

        out = xce("hist", str(mine[0]))
        assert out.returncode == 0 and "Done successfully" in out.stdout and "Dispatched to <node1>" in out.stdout, out
        out = xce("acct", "-u", "all", "--since", "1d", "--json", "-l")
        assert out.returncode == 0, out
        got = json.loads(out.stdout)
        assert got["summary"]["jobs"] == 5 and len(got["rows"]) == 5
        out = xce("acct", "-u", "alice", "--format", "jobid,state,reason")
        assert out.returncode == 0 and out.stdout.splitlines()[0].split() == ["JOBID", "STATE", "REASON"], out
        assert "Jobs: 3" in out.stdout
        out = xce("acct", "--format", "jobid,nope")
        assert out.returncode == 1 and "unknown column" in out.stderr
        out = xce("acct", "--since", "yesterday")
        assert out.returncode == 1 and "time 'yesterday'" in out.stderr

        cluster = http.get("/xce/v1/history/events", headers=ops).json()["data"]["events"]
        assert any(e["kind"] == "member" and e["subject"].startswith("worker@") for e in cluster) or \
            any(e["kind"] == "host" and e["subject"] == "node1" for e in cluster)
