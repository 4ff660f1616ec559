"""Who ended a job, end to end (issue 21): a job killed by its owner reports "killed by owner
NAME", by an administrator "killed by administrator NAME" -- in ``xce jobs -l`` and in REST --
and a forced dispatch (``xce run-job``, LSF's ``brun``) never breaks an exclusive (``-x``)
hold. Real processes: one controller candidate, a worker running the jobs, the scheduler, the
API server, the ``xce`` command."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from xce_apiserver.auth import hash_password

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

USERS = (f'[{{name = "alice", password_hash = "{hash_password("pw", iterations=1000)}", '
         f'role = "user"}}, {{name = "root", password_hash = "{hash_password("rpw", iterations=1000)}", '
         'role = "admin"}]')


def xce(cl: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cl.config_path),
                           "--timeout", "10", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_kill_reasons_and_a_forced_dispatch_that_would_share_an_exclusive_host(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1, extra_config='[controller]\nadmins = ["root"]\n')
    cl.start_role("worker", 'worker.hname="k1"', f'worker.state_dir="{tmp_path / "k1"}"',
                  "worker.slots=4", "worker.ncpus=4", name="k1")
    cl.start_role("worker", 'worker.hname="k2"', f'worker.state_dir="{tmp_path / "k2"}"',
                  "worker.slots=4", "worker.ncpus=4", name="k2")
    cl.start_role("scheduler")
    _, base = cl.start_apiserver(tmp_path / "api.port", f"apiserver.users={USERS}")
    http = httpx.Client(base_url=f"{base}/xce/v1", timeout=10)

    def auth(user: str, pw: str) -> dict[str, str]:
        r = http.post("/auth/logon", json={"username": user, "password": pw})
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['data']['token']}"}

    alice, root = auth("alice", "pw"), auth("root", "rpw")

    def submit(body: dict[str, Any]) -> int:
        r = http.post("/jobs", json=body, headers=alice)
        assert r.status_code == 200 and r.json()["code"] == 201, r.text
        return int(r.json()["data"]["jobid"])

    def job(jobid: int) -> dict[str, Any]:
        got = http.get(f"/jobs/{jobid}", headers=alice).json()["data"]
        return dict(got[0]) if got else {}

    wait_for(lambda: len(http.get("/hosts", headers=alice).json()["data"]) == 2, 30, what="two hosts")
    by_owner, by_admin, by_cli = (submit({"command": "sleep 120"}) for _ in range(3))
    for j in (by_owner, by_admin, by_cli):
        wait_for(lambda j=j: job(j).get("state") == "RUN", 60, what=f"job {j} running")
    r = http.post(f"/jobs/{by_owner}/control", json={"action": "kill"}, headers=alice)
    assert r.status_code == 200, r.text
    r = http.post(f"/jobs/{by_admin}/control", json={"action": "kill"}, headers=root)
    assert r.status_code == 200, r.text
    got = xce(cl, "job", "kill", str(by_cli))  # root at the command line: an administrator
    assert got.returncode == 0, got.stderr
    want = {by_owner: "killed by owner alice", by_admin: "killed by administrator root",
            by_cli: "killed by administrator root"}
    for j, reason in want.items():
        wait_for(lambda j=j: job(j).get("state") == "EXIT", 60, what=f"job {j} ended")
        rec = job(j)
        assert rec["reason"] == reason, rec
        long = xce(cl, "jobs", "-l", str(j))
        assert long.returncode == 0 and f"Reason: {reason}" in long.stdout, long.stdout
    # -x: the scheduler gives an exclusive job an idle host; a forced run of another job to
    # that host is refused, naming the exclusive job, and so is a forced run of an exclusive
    # job to a host another job runs on.
    x = submit({"command": "sleep 120", "exclusive": True})
    wait_for(lambda: job(x).get("state") == "RUN", 60, what="the exclusive job running")
    held = job(x)["alloc"][0]["host"]
    other = "k2" if held == "k1" else "k1"
    assert xce(cl, "host", "close", other).returncode == 0  # the next job has nowhere to go
    p = submit({"command": "sleep 120"})
    got = xce(cl, "run-job", str(p), "-m", held)
    assert got.returncode != 0, got.stdout
    assert f"host {held} is held by exclusive job {x} (-x): cannot dispatch job {p}" in got.stderr
    assert job(p)["state"] == "PEND"
    assert xce(cl, "host", "open", other).returncode == 0
    wait_for(lambda: job(p).get("state") == "RUN", 60, what="the plain job running elsewhere")
    assert job(p)["alloc"][0]["host"] == other
    x2 = submit({"command": "sleep 120", "exclusive": True})  # no idle host: it pends
    r = http.post(f"/jobs/{x2}/run", json={"hosts": [other]}, headers=root)
    assert r.status_code == 409 and f"host {other} runs job {p}: exclusive job {x2}" in r.json()["msg"], r.text
    for j in (x, p, x2):
        xce(cl, "job", "kill", str(j))
