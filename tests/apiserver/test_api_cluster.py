"""The API server as a real ``xce run apiserver`` process against three real candidates."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from xce_apiserver.auth import hash_password

from xcecore.client import SyncClient
from xcecore.config import Config
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, Proc, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]

ADMIN_CONFIG = '[controller]\nadmins = ["root"]\nhost_timeout = 60.0\n'


class Running:
    """A cluster plus one API server process and an HTTP client for it."""

    def __init__(self, cluster: LocalCluster, proc: Proc, base: str) -> None:
        self.cluster, self.proc, self.base = cluster, proc, base
        self.http = httpx.Client(base_url=base, timeout=10.0)
        r = self.http.post("/xce/v1/auth/logon", json={"username": "alice", "password": "pw"})
        assert r.status_code == 200, r.text
        self.hdr = {"Authorization": f"Bearer {r.json()['data']['token']}"}

    def jobs(self) -> list[dict[str, Any]]:
        r = self.http.get("/xce/v1/jobs", headers=self.hdr)
        assert r.status_code == 200, r.text
        return list(r.json()["data"])

    def submit(self, name: str) -> httpx.Response:
        return self.http.post("/xce/v1/jobs", json={"command": "true", "name": name}, headers=self.hdr)


def _start(xce_cluster: Callable[..., LocalCluster], tmp_path: Path, *, controller: str = "",
           **settings: Any) -> Running:
    cluster = xce_cluster(3, extra_config=ADMIN_CONFIG + controller)
    p = cluster.ports
    standby_first = f"127.0.0.1:{p[1]},127.0.0.1:{p[0]},127.0.0.1:{p[2]}"
    users = (f'[{{name = "alice", password_hash = "{hash_password("pw", iterations=1000)}", '
             'role = "user"}]')
    proc, base = cluster.start_apiserver(
        tmp_path / "api.port", f'cluster.peers="{standby_first}"', f"apiserver.users={users}",
        *(f"apiserver.{k}={v}" for k, v in settings.items()))
    return Running(cluster, proc, base)


def _direct_client(cluster: LocalCluster) -> tuple[Config, Any]:
    _, config = load(cluster.config_path)
    return config, client_config(config, "cli@test")


def test_registers_through_one_connect_with_redirect(xce_cluster: Any, tmp_path: Path) -> None:
    run = _start(xce_cluster, tmp_path)
    log = run.proc.text()
    assert "following redirect" in log and "joined as apiserver" in log, log
    assert "snapshot sync from" in log and "REST API listening" in log
    r = run.submit("one")
    env = r.json()
    assert r.status_code == 200 and env["code"] == 201, env
    jobid = env["data"]["jobid"]
    seen = wait_for(lambda: [j for j in run.jobs() if j["jobid"] == jobid], 10, what="the job's push")
    assert seen[0]["user"] == "alice" and seen[0]["state"] == "PEND"
    r = run.http.post(f"/xce/v1/jobs/{jobid}/control", json={"action": "kill"}, headers=run.hdr)
    assert r.status_code == 200, r.text
    gone = wait_for(lambda: [j for j in run.jobs() if j["jobid"] == jobid and j["state"] == "EXIT"],
                    10, what="the killed job's push")
    assert gone[0]["reason"] == "killed by owner alice"  # the exit reason, in REST
    r = run.http.post("/xce/v1/jobs", json={"command": "x", "queue": "nope"}, headers=run.hdr)
    assert r.status_code == 404
    run.http.close()


def test_failover_during_submissions_is_exactly_once(xce_cluster: Any, tmp_path: Path) -> None:
    # A grace well above any failover on a loaded machine: this test is about exactly-once.
    run = _start(xce_cluster, tmp_path, backend_timeout=10, failover_grace=5)
    pid = run.proc.pid
    results: list[tuple[str, int, Any]] = []
    stop = threading.Event()

    def submitter() -> None:
        with httpx.Client(base_url=run.base, timeout=30.0) as http:
            n = 0
            while not stop.is_set():
                n += 1
                r = http.post("/xce/v1/jobs", json={"command": "true", "name": f"s{n}"}, headers=run.hdr)
                results.append((f"s{n}", r.status_code, r.json()))

    t = threading.Thread(target=submitter)
    t.start()
    try:
        wait_for(lambda: len(results) >= 20, 20, what="submissions before the kill")
        before = len(results)
        old, new = run.cluster.kill_primary()
        wait_for(lambda: len(results) >= before + 20, 30, what="submissions after the failover")
    finally:
        stop.set()
        t.join(40)
    assert old != new
    bad = [r for r in results if r[1] != 200 or r[2]["code"] != 201]
    assert not bad, bad[:3]
    ids = {name: env["data"]["jobid"] for name, _, env in results}

    def all_pushed() -> bool:
        names = [j["name"] for j in run.jobs() if j["name"] in ids]
        return len(names) == len(ids)

    wait_for(all_pushed, 20, what="every submitted job in GET /jobs")
    jobs = run.jobs()
    names = [j["name"] for j in jobs if j["name"] in ids]
    assert sorted(names) == sorted(ids), "a submission was lost or duplicated"
    assert {j["name"]: j["jobid"] for j in jobs if j["name"] in ids} == ids
    assert run.proc.alive() and run.proc.pid == pid
    assert "re-joined as apiserver" in run.proc.text()
    run.http.close()


def test_idle_failover_rejoins_and_pushes_resume(xce_cluster: Any, tmp_path: Path) -> None:
    run = _start(xce_cluster, tmp_path)
    pid = run.proc.pid
    run.cluster.kill_primary()
    wait_for(lambda: "re-joined as apiserver" in run.proc.text(), 30, what="the heartbeat re-join")
    _, cfg = _direct_client(run.cluster)
    with SyncClient.open(cfg, role="cli") as direct:
        got = direct.call("jobsubmit", {"command": "true", "name": "direct"})
    wait_for(lambda: [j for j in run.jobs() if j["jobid"] == got["jobid"]], 20,
             what="the directly submitted job in GET /jobs")
    assert run.proc.alive() and run.proc.pid == pid
    run.http.close()


def test_backend_down_opens_the_breaker_without_a_write(xce_cluster: Any, tmp_path: Path) -> None:
    run = _start(xce_cluster, tmp_path, backend_timeout=1.0)
    for proc in list(run.cluster.candidates.values()):
        proc.kill()
    # No write needed: the heartbeats' failing reconnects open the breaker.
    wait_for(lambda: run.http.get("/xce/v1/readyz").status_code == 503, 10, what="readyz 503")
    r = run.http.get("/xce/v1/readyz")
    assert "backend degraded" in r.json()["msg"] and r.json()["data"]["degraded"] is True
    first = run.submit("first")
    assert first.status_code == 503, first.text
    assert "nothing was sent" in first.json()["msg"] and first.headers["retry-after"] == "1"
    assert run.http.get("/xce/v1/jobs", headers=run.hdr).status_code == 200  # reads still served
    assert "writes answer 503 at once" in run.proc.text()
    # Heartbeat recovery closes it: no write probes, the first write after it goes through.
    run.cluster.start_candidate(0)
    wait_for(lambda: run.http.get("/xce/v1/readyz").status_code == 200, 30, what="readyz 200 again")
    r = run.submit("after")
    assert r.status_code == 200 and r.json()["code"] == 201, r.text
    assert run.proc.alive()
    run.http.close()


def test_hung_primary_answers_504_with_the_key_and_the_retry_is_applied_once(
        xce_cluster: Any, tmp_path: Path) -> None:
    # The standbys must not fence the frozen primary while the API server's 2 s deadline runs
    # (with the default hung_timeout, also 2 s, they race): this test is about the API server's
    # answer to a primary that hangs and comes back, not about takeover.
    run = _start(xce_cluster, tmp_path, controller="hung_timeout = 60.0\n", backend_timeout=2.0)
    primary = run.cluster.candidates[run.cluster.wait_primary()]
    key = "hung-primary-1"
    hdr = {**run.hdr, "Idempotency-Key": f'"{key}"'}
    primary.kill(signal.SIGSTOP)
    try:
        r = run.http.post("/xce/v1/jobs", json={"command": "true", "name": "hung"}, headers=hdr)
        assert r.status_code == 504, r.text
        env = r.json()
        assert env["data"] == {"idempotency_key": key, "op": "jobsubmit"} and key in env["msg"]
        assert r.headers["idempotency-key"] == f'"{key}"'
        # The liveness timeout opened the breaker: a new write is refused, not sent.
        wait_for(lambda: run.http.get("/xce/v1/readyz").status_code == 503, 10, what="readyz 503")
        refused = run.submit("refused")
        assert refused.status_code == 503 and "nothing was sent" in refused.json()["msg"]
    finally:
        primary.kill(signal.SIGCONT)
    wait_for(lambda: run.http.get("/xce/v1/readyz").status_code == 200, 30, what="readyz 200 again")
    again = run.http.post("/xce/v1/jobs", json={"command": "true", "name": "hung"}, headers=hdr)
    assert again.status_code == 200 and again.json()["code"] == 201, again.text
    jobid = again.json()["data"]["jobid"]
    wait_for(lambda: [j for j in run.jobs() if j["jobid"] == jobid], 10, what="the job's push")
    names = [j["name"] for j in run.jobs()]
    assert names.count("hung") == 1 and "refused" not in names, names
    run.http.close()


def test_idempotency_key_against_a_real_controller(xce_cluster: Any, tmp_path: Path) -> None:
    run = _start(xce_cluster, tmp_path)
    hdr = {**run.hdr, "Idempotency-Key": "k-123"}
    body = {"command": "true", "name": "once"}
    first = run.http.post("/xce/v1/jobs", json=body, headers=hdr)
    assert first.status_code == 200 and first.json()["code"] == 201, first.text
    second = run.http.post("/xce/v1/jobs", json=body, headers=hdr)
    assert second.content == first.content  # same key, same request: same response
    other = run.http.post("/xce/v1/jobs", json={**body, "name": "twice"}, headers=hdr)
    assert other.status_code == 422 and "header.Idempotency-Key" in other.json()["msg"]
    # A key the API server made (no header) is returned, and retrying with it is safe too.
    made = run.submit("made")
    key = made.headers["idempotency-key"].strip('"')
    again = run.http.post("/xce/v1/jobs", json={"command": "true", "name": "made"},
                          headers={**run.hdr, "Idempotency-Key": key})
    assert again.json()["data"]["jobid"] == made.json()["data"]["jobid"]
    jobid = made.json()["data"]["jobid"]
    wait_for(lambda: [j for j in run.jobs() if j["jobid"] == jobid], 10, what="the job's push")
    names = [j["name"] for j in run.jobs()]
    assert names.count("once") == 1 and names.count("made") == 1 and "twice" not in names
    run.http.close()


def test_oversized_submission_is_413_at_the_edge(xce_cluster: Any, tmp_path: Path) -> None:
    run = _start(xce_cluster, tmp_path)
    huge = {"command": "true", "env": {f"V{i}": "x" * 30_000 for i in range(600)}}  # ~17 MiB
    r = run.http.post("/xce/v1/jobs", json=huge, headers=run.hdr)
    assert r.status_code == 413, r.text
    assert "too large" in r.json()["msg"] and r.json()["data"] == {"limit": 1024 * 1024}
    log = run.proc.text()
    assert "lost connection" not in log and "reconnect" not in log.split("REST API listening")[-1]
    r = run.submit("after")  # the controller connection was never touched
    assert r.status_code == 200 and r.json()["code"] == 201, r.text
    run.http.close()


def test_job_arrays_over_rest(xce_cluster: Any, tmp_path: Path) -> None:
    """POST /jobs with ``array``, GET /jobs?array=, control of one element and of the whole
    array, through a real API server, controller, worker and scheduler."""
    run = _start(xce_cluster, tmp_path)
    run.cluster.start_role("worker", 'worker.hname="rn1"', f'worker.state_dir="{tmp_path / "rn1"}"',
                           "worker.slots=2", name="rn1")
    run.cluster.start_role("scheduler")
    r = run.http.post("/xce/v1/jobs", json={"command": "true", "name": "ra", "array": "1-4%2"},
                      headers=run.hdr)
    env = r.json()
    assert env["code"] == 201 and (env["data"]["array"], env["data"]["size"]) == ("1-4%2", 4), env
    array = env["data"]["jobid"]

    def state_of(jobid: int) -> str:
        got = run.http.get(f"/xce/v1/jobs/{jobid}", headers=run.hdr).json()["data"]
        return str(got[0]["state"]) if got else ""
    wait_for(lambda: state_of(array) == "DONE", 60, what="the array to end DONE")
    els = run.http.get(f"/xce/v1/jobs?array={array}&limit=10", headers=run.hdr).json()["data"]
    assert sorted(e["array"]["index"] for e in els) == [1, 2, 3, 4], els
    assert all(e["array"]["of"] == array and e["state"] == "DONE" for e in els)
    r = run.http.post("/xce/v1/jobs", json={"command": "sleep 30", "array": "1-50%1"}, headers=run.hdr)
    big = r.json()["data"]["jobid"]
    r = run.http.post(f"/xce/v1/jobs/{big}/control", json={"action": "kill", "index": 40},
                      headers=run.hdr)
    assert r.status_code == 200 and r.json()["data"][0]["state"] == "EXIT", r.text
    r = run.http.post(f"/xce/v1/jobs/{big}/control", json={"action": "kill", "index": 99},
                      headers=run.hdr)
    assert r.status_code == 404 and "no such array element" in r.json()["msg"], r.text
    r = run.http.post(f"/xce/v1/jobs/{big}/control", json={"action": "kill"}, headers=run.hdr)
    assert r.status_code == 200, r.text
    wait_for(lambda: state_of(big) == "EXIT", 60, what="the killed array to end EXIT")
    r = run.http.post("/xce/v1/jobs", json={"command": "true", "array": "3-1"}, headers=run.hdr)
    assert r.status_code == 422 and "ends before it starts" in r.json()["msg"], r.text
