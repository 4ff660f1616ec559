"""Existing XCE REST clients, replayed: the calls a small public Go client makes, against a real
cluster (controller, worker and API server processes), every field it reads checked for
presence and JSON type strictly (Go's decoder zero-fills a missing field and fails on an
int field given 1.5). And ``GET /xce/v1/events`` over the same cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from xce_apiserver.auth import hash_password
from xce_apiserver.hosts import HOST_INFO, JOB_CLIENT

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.e2e]


def check_types(obj: dict[str, Any], fields: dict[str, type], what: str) -> None:
    """Every field present with exactly its JSON type (int is not float, bool is not int);
    the assertion names the field."""
    for name, want in fields.items():
        assert name in obj, f"{what}: field {name!r} is missing"
        value = obj[name]
        if want is float:
            ok = isinstance(value, float)
        elif want is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, want)
        assert ok, f"{what}: field {name!r} is {type(value).__name__} {value!r}, not {want.__name__}"


def test_xce_client_calls_and_events(xce_cluster: Any, tmp_path: Path) -> None:
    cl: LocalCluster = xce_cluster(1, extra_config='[controller]\nadmins = ["ops"]\nhost_timeout = 1.0\n')
    worker = cl.start_role("worker", 'worker.hname="node1"', f'worker.state_dir="{tmp_path / "w"}"',
                           "worker.monitor_interval=0.1", "worker.slots=2", name="node1")
    pw = hash_password("pw", iterations=1000)
    users = (f'[{{name = "alice", password_hash = "{pw}", role = "user"}}, '
             f'{{name = "ops", password_hash = "{pw}", role = "admin"}}]')
    _, base = cl.start_apiserver(tmp_path / "api.port", f"apiserver.users={users}")
    with httpx.Client(base_url=base, timeout=30) as http:
        # 1. logon: {"code":200,"msg":...,"data":{"token","path","ip"},"count":...}
        r = http.post("/xce/v1/auth/logon", json={"username": "alice", "password": "pw"})
        body = r.json()
        check_types(body, {"code": int, "msg": str, "data": dict, "count": int}, "logon")
        assert body["code"] == 200
        check_types(body["data"], {"token": str, "path": str, "ip": str}, "logon data")
        assert body["data"]["path"] == "/xce/v1" and body["data"]["ip"] == "127.0.0.1"
        alice = {"Authorization": f"Bearer {body['data']['token']}"}
        ops_tok = http.post("/xce/v1/auth/logon", json={"username": "ops", "password": "pw"})
        ops = {"Authorization": f"Bearer {ops_tok.json()['data']['token']}"}
        # 2. POST /jobs: code 201, data.jobid an integer.
        r = http.post("/xce/v1/jobs", json={"command": "sleep 30", "name": "compat", "project": "p1",
                                            "resreq": "select[ncpus>=1]"}, headers=alice)
        body = r.json()
        assert body["code"] == 201, body
        check_types(body["data"], {"jobid": int}, "POST /jobs data")
        jobid = body["data"]["jobid"]
        # 3. GET /hosts: LSF's hostInfo whole, with its types.
        wait_for(lambda: http.get("/xce/v1/hosts", headers=alice).json()["data"], 30, what="a host")
        hosts = http.get("/xce/v1/hosts", headers=alice).json()
        check_types(hosts, {"code": int, "count": int, "data": list}, "GET /hosts")
        for h in hosts["data"]:
            check_types(h, HOST_INFO, f"host {h.get('hostName')}")
            assert all(isinstance(x, str) for x in h["resources"] + h["DResources"])
            assert all(isinstance(x, float) for x in h["busyThreshold"])
            assert h["numIndx"] == len(h["busyThreshold"]) and h["nRes"] == len(h["resources"])
        node = next(h for h in hosts["data"] if h["hostName"] == "node1")
        assert node["maxCpus"] >= 1 and node["maxMem"] > 0 and node["threads_per_core"] >= 1
        # 4. GET /jobs: the fields the client reads, beside xce's own.
        wait_for(lambda: any(j["jobid"] == jobid for j in http.get("/xce/v1/jobs", headers=alice).json()["data"]),
                 30, what="the job pushed to the API server")
        for page in (http.get("/xce/v1/jobs", headers=alice).json(),
                     http.get("/xce/v1/jobs", params={"limit": 10}, headers=alice).json(),
                     http.get(f"/xce/v1/jobs/{jobid}", headers=alice).json()):
            job = next(j for j in page["data"] if j["jobid"] == jobid)
            check_types(job, JOB_CLIENT, f"job {jobid}")
            assert (job["jobname"], job["projectname"], job["resreq"], job["user"]) == \
                ("compat", "p1", "select[ncpus>=1]", "alice")
            assert job["status"] == job["state"] and job["command"] == "sleep 30"
            assert "state" in job and "submit_time" in job  # xce's own stay
        # 5. Events over REST: the host closed and opened by an administrator.
        for action in ("close", "open"):
            r = http.post("/xce/v1/hosts/control", json={"host": "node1", "action": action}, headers=ops)
            assert r.status_code == 200, r.text

        def host_events() -> list[dict[str, Any]]:
            r = http.get("/xce/v1/events", params={"kind": "host_state", "limit": 1000}, headers=alice)
            assert r.status_code == 200, r.text
            return list(r.json()["data"])

        wait_for(lambda: [e["state"] for e in host_events()][-2:] == ["closed", "opened"], 30,
                 what="close and open recorded")
        ev = host_events()[-1]
        check_types(ev, {"seq": int, "time": float, "kind": str, "text": str, "host": str}, "event")
        assert "ops" in ev["by"]
        # The worker SIGKILLed: its host goes unavail (host_timeout 1 s), recorded once.
        worker.kill()
        wait_for(lambda: any(e["state"] == "unavail" for e in host_events()), 30, what="unavail")
        page = http.get("/xce/v1/events", params={"limit": 2}, headers=alice).json()
        check_types(page, {"code": int, "msg": str, "data": list, "count": int, "next": int,
                           "more": bool, "oldest": int, "newest": int}, "GET /events")
        assert page["count"] == 2 and page["more"] is True
        rest = http.get("/xce/v1/events", params={"since": page["next"], "limit": 1000}, headers=alice).json()
        seqs = [e["seq"] for e in page["data"] + rest["data"]]
        assert seqs == sorted(set(seqs)) and not rest["more"]
        kinds = {e["kind"] for e in page["data"] + rest["data"]}
        assert {"promotion", "member_join", "host_state"} <= kinds
        # Bad input: clear errors in the envelope.
        bad = http.get("/xce/v1/events", params={"limit": 5000}, headers=alice)
        assert bad.status_code == 422 and "limit" in bad.text
        bad = http.get("/xce/v1/events", params={"kind": "bogus"}, headers=alice)
        assert bad.status_code == 422 and "unknown kind 'bogus'" in bad.json()["msg"]
        bad = http.get("/xce/v1/events", params={"since": 10**12}, headers=alice)
        assert bad.status_code == 422 and "beyond the newest event" in bad.json()["msg"]
        assert http.get("/xce/v1/events", headers={}).status_code == 401
