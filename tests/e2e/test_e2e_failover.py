"""End to end: a whole cluster of real processes survives the primary's SIGKILL.

Every role is configured with the full candidate list; none of them is restarted; each shows
its re-join in its log; nothing acknowledged is lost or applied twice.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import pytest
from e2ekit import Api, jobs_named

from xcecore.testing.cluster import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _pids(emb: Any) -> dict[str, int]:
    return {name: proc.pid for name, proc in emb.roles.items()}


def _done(emb: Any, prefix: str, count: int) -> bool:
    found = jobs_named(emb, prefix)
    return len(found) == count and all(j["state"] == "DONE" for j in found)


def test_full_cluster_failover_with_a_submission_in_flight(embedded: Any) -> None:
    emb = embedded(3, 2)
    api = Api(emb)
    before = _pids(emb)
    # The cluster works before the kill: a job goes PEND -> RUN -> DONE through every role.
    assert api.submit("true", "before-0").status_code == 200
    wait_for(lambda: _done(emb, "before-", 1), 60, what="a job to finish before the kill")

    # A submission through the API server is in flight when the primary dies.
    replies: list[httpx.Response] = []

    def submit_in_flight() -> None:
        replies.append(api.submit("true", "inflight-0"))

    old = emb.cluster.wait_primary()
    sender = threading.Thread(target=submit_in_flight)
    sender.start()
    kill_time = time.time()  # before the kill: the fastest roles re-join within milliseconds
    emb.cluster.candidates[old].kill()
    sender.join(60)
    assert replies and replies[0].status_code == 200, replies and replies[0].text
    new = emb.cluster.wait_primary(30, exclude=old)
    assert new != old

    # Every role re-joins the new primary on its own: same processes, re-join in each log.
    emb.wait_members(emb.expected_members(), 60, since=kill_time)
    assert _pids(emb) == before
    for name, proc in emb.roles.items():
        assert proc.alive(), f"{name} died:\n{proc.text()[-3000:]}"
        assert "re-joined" in proc.text(), f"{name} shows no re-join:\n{proc.text()[-3000:]}"

    # The in-flight submission exists exactly once, and it runs (scheduler + worker again).
    assert len(jobs_named(emb, "inflight-")) == 1
    for i in range(4):
        assert api.submit("true", f"after-{i}").status_code == 200
    wait_for(lambda: _done(emb, "after-", 4) and _done(emb, "inflight-", 1), 60,
             what="jobs submitted after the failover to run")
    # The API server receives pushes again: its own view shows them DONE.
    wait_for(lambda: sum(1 for j in api.jobs() if j["name"].startswith("after-") and j["state"] == "DONE") == 4,
             30, what="the API server's push-fed view to catch up")
    api.close()


def test_idle_failover_heartbeats_only(embedded: Any) -> None:
    emb = embedded(3, 0)
    api = Api(emb)
    apiserver = emb.roles["apiserver"]
    pid = apiserver.pid
    kill_time = time.time()
    old, _new = emb.cluster.kill_primary()
    # No client write during the outage: the heartbeat alone brings the API server back.
    emb.wait_members(emb.expected_members(), 60, since=kill_time)
    wait_for(lambda: "re-joined" in apiserver.text(), 30, what="the API server's re-join")
    assert apiserver.pid == pid and apiserver.alive()
    # ...and pushes flow again: a job submitted straight to the controller shows up.
    emb.call("jobsubmit", {"command": "true", "name": "direct-0"})
    wait_for(lambda: any(j["name"] == "direct-0" for j in api.jobs()), 30, what="the push of a new job")
    api.close()
    del old


def test_fail_fast_while_backend_is_down(embedded: Any) -> None:
    emb = embedded(3, 0)
    api = Api(emb)
    for i in list(emb.cluster.candidates):
        emb.cluster.candidates[i].kill()
    # The first write spends its retry budget and marks the backend degraded...
    first = api.submit("true", "down-0")
    assert first.status_code == 503, first.text
    # ...after which a request that needs the backend answers 503 in well under a second.
    t0 = time.monotonic()
    r = api.submit("true", "down-1")
    took = time.monotonic() - t0
    assert r.status_code == 503 and "Retry-After" in r.headers, r.text
    assert took < 1.0, f"503 took {took:.3f} s"
    assert r.json()["msg"]
    api.close()


def test_single_controller_mode(embedded: Any) -> None:
    emb = embedded(1, 1)
    assert len(emb.cluster.ports) == 1
    api = Api(emb)
    assert api.submit("echo single", "single-0").status_code == 200
    wait_for(lambda: _done(emb, "single-", 1), 60, what="a job to run with one controller")
    job = jobs_named(emb, "single-")[0]
    assert job["alloc"][0]["host"] == "node1" and job["exit_status"] == 0
    api.close()


def test_xce_up_demo_command(tmp_path: Any) -> None:
    """The README's run command, as a user runs it (fewer jobs)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "xcecore", "up", "--demo", "--jobs", "9",
                          "--state-dir", str(tmp_path / "up")],
                         capture_output=True, text=True, timeout=200, env={**os.environ, "COLUMNS": "120"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "every job ran exactly once" in res.stdout and "FAIL" not in res.stdout, res.stdout
