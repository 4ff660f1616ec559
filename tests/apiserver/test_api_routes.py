"""Every route of the REST API, over ASGI, with a push-fed store and a fake backend."""

from __future__ import annotations

from typing import Any

import pytest
from apikit import job
from xce_apiserver.app import PREFIX

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

V = PREFIX


def body(resp: Any) -> dict[str, Any]:
    """The envelope, checked for its shape and its code matching the HTTP status."""
    env = resp.json()
    shape = {"code", "msg", "data", "count"}
    listing = resp.request.url.path == f"{V}/jobs" and resp.request.method == "GET"
    assert set(env) == (shape | {"next"} if listing and resp.status_code == 200 else shape), env
    if resp.status_code != 200:
        assert env["code"] == resp.status_code, env
    return env


# ---------------------------------------------------------------------- auth

async def test_logon_logout(api: Any) -> None:
    r = await api.client.post(f"{V}/auth/logon", json={"username": "alice", "password": "alice-pw"})
    env = body(r)
    assert r.status_code == 200 and env["code"] == 200
    assert env["data"]["role"] == "user" and env["data"]["token_type"] == "bearer"
    hdr = {"Authorization": f"Bearer {env['data']['token']}"}
    assert (await api.client.get(f"{V}/jobs", headers=hdr)).status_code == 200
    r = await api.client.post(f"{V}/auth/logout", headers=hdr)
    assert r.status_code == 200
    r = await api.client.get(f"{V}/jobs", headers=hdr)
    assert r.status_code == 401 and "log on again" in body(r)["msg"]


@pytest.mark.parametrize(("user", "pw"), [("alice", "wrong"), ("nobody", "x")])
async def test_logon_refused(api: Any, user: str, pw: str) -> None:
    r = await api.client.post(f"{V}/auth/logon", json={"username": user, "password": pw})
    assert r.status_code == 401 and "logon failed" in body(r)["msg"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/jobs"), ("GET", "/jobs/1"), ("POST", "/jobs"), ("POST", "/jobs/create"),
     ("POST", "/jobs/1/control"), ("POST", "/jobs/1/run"), ("GET", "/queues"),
     ("POST", "/queues/control"), ("GET", "/hosts"), ("POST", "/hosts/control"),
     ("POST", "/hosts/select"), ("GET", "/resources"), ("GET", "/resources/values"),
     ("GET", "/cluster"), ("POST", "/auth/logout")],
)
async def test_every_route_needs_a_token(api: Any, method: str, path: str) -> None:
    r = await api.client.request(method, f"{V}{path}", json={})
    assert r.status_code == 401, r.text
    assert "Bearer" in body(r)["msg"] and r.headers["www-authenticate"] == "Bearer"
    r = await api.client.request(method, f"{V}{path}", json={}, headers={"Authorization": "Bearer junk"})
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("path", "payload"),
    [("/queues/control", {"queue": "normal", "action": "close"}),
     ("/hosts/control", {"host": "n1", "action": "close"}),
     ("/jobs/1/run", {"hosts": ["n1"]})],
)
async def test_admin_routes_refuse_users(api: Any, path: str, payload: dict[str, Any]) -> None:
    r = await api.client.post(f"{V}{path}", json=payload, headers=api.token("alice"))
    assert r.status_code == 403 and "not an administrator" in body(r)["msg"]
    assert api.fake.calls == []


# ---------------------------------------------------------------------- jobs

async def test_list_jobs_and_filters(api: Any) -> None:
    hdr = api.token("alice")
    env = body(await api.client.get(f"{V}/jobs", headers=hdr))
    assert [j["jobid"] for j in env["data"]] == [1, 2, 3] and env["count"] == 3
    env = body(await api.client.get(f"{V}/jobs", params={"user": "bob"}, headers=hdr))
    assert [j["jobid"] for j in env["data"]] == [2]
    api.store.apply("job", {**api.store.get_job(3), "state": "RUN", "queue": "priority"})
    env = body(await api.client.get(f"{V}/jobs", params={"state": "run,done"}, headers=hdr))
    assert [j["jobid"] for j in env["data"]] == [3]
    env = body(await api.client.get(f"{V}/jobs", params={"queue": "priority"}, headers=hdr))
    assert [j["jobid"] for j in env["data"]] == [3]
    env = body(await api.client.get(f"{V}/jobs", params={"fields": "jobid,state"}, headers=hdr))
    assert env["data"][0] == {"jobid": 1, "state": "PEND"} and env["next"] is None


async def test_list_jobs_in_pages(api: Any) -> None:
    hdr = api.token("alice")
    for jobid in range(4, 251):
        api.store.apply("job", job(jobid, user="alice" if jobid % 2 else "bob"))
    got, cursor, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 40, "user": "alice", "fields": "jobid,user"}
        if cursor is not None:
            params["cursor"] = cursor
        env = body(await api.client.get(f"{V}/jobs", params=params, headers=hdr))
        got += env["data"]
        pages += 1
        assert env["count"] == len(env["data"]) <= 40
        cursor = env["next"]
        if cursor is None:
            break
        assert isinstance(cursor, str)
    assert [j["jobid"] for j in got] == [i for i in range(1, 251) if i % 2] and pages == 4
    assert {j["user"] for j in got} == {"alice"}
    # Everything at once (no limit): the same jobs, streamed in chunks, as one envelope.
    r = await api.client.get(f"{V}/jobs", params={"user": "alice"}, headers=hdr)
    env = body(r)
    assert [j["jobid"] for j in env["data"]] == [j["jobid"] for j in got] and env["count"] == 125
    for bad, field in [({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"cursor": "x"}, "cursor"),
                       ({"cursor": "-1"}, "cursor"), ({"limit": "ten"}, "limit")]:
        r = await api.client.get(f"{V}/jobs", params=bad, headers=hdr)
        assert r.status_code == 422 and field in body(r)["msg"], (bad, r.text)


async def test_get_jobs_by_id(api: Any) -> None:
    hdr = api.token("alice")
    env = body(await api.client.get(f"{V}/jobs/3,1", headers=hdr))
    assert [j["jobid"] for j in env["data"]] == [3, 1]
    r = await api.client.get(f"{V}/jobs/1,99", headers=hdr)
    assert r.status_code == 404 and "99" in body(r)["msg"] and body(r)["data"] == {"missing": [99]}
    r = await api.client.get(f"{V}/jobs/1,x", headers=hdr)
    assert r.status_code == 422 and "jobids" in body(r)["msg"]


@pytest.mark.parametrize("path", ["/jobs", "/jobs/create"])
async def test_submit(api: Any, path: str) -> None:
    payload = {"command": "sleep 5", "queue": "priority", "resreq": "select[ncpus>=2]",
               "env": {"A": "1"}, "name": "j"}
    r = await api.client.post(f"{V}{path}", json=payload, headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 200 and env["code"] == 201, env
    assert env["data"] == {"jobid": 1001, "queue": "priority", "state": "PEND"}
    assert "1001" in env["msg"]
    assert api.fake.calls == [("jobsubmit", {**payload, "user": "alice"})]


async def test_submit_to_closed_queue_is_409(api: Any) -> None:
    r = await api.client.post(f"{V}/jobs", json={"command": "true", "queue": "closedq"},
                              headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 409 and "closed" in env["msg"] and env["data"]["error"] == "CONFLICT"


async def test_submit_to_unknown_queue_is_404(api: Any) -> None:
    r = await api.client.post(f"{V}/jobs", json={"command": "true", "queue": "nope"},
                              headers=api.token("alice"))
    assert r.status_code == 404 and "nope" in body(r)["msg"]


@pytest.mark.parametrize(
    ("payload", "field"),
    [({}, "body.command"), ({"command": ""}, "body.command"), ({"command": 5}, "body.command"),
     ({"command": "x", "ntasks": 0}, "body.ntasks"), ({"command": "x", "env": {"A": 1}}, "body.env.A"),
     ({"command": "x", "bogus": 1}, "body.bogus")],
)
async def test_submit_bad_body_names_the_field(api: Any, payload: dict[str, Any], field: str) -> None:
    r = await api.client.post(f"{V}/jobs", json=payload, headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 422 and field in env["msg"], env
    assert any(d["field"] == field for d in env["data"])
    assert api.fake.calls == []


async def test_submit_bad_resreq_is_400_with_position(api: Any) -> None:
    r = await api.client.post(f"{V}/jobs", json={"command": "x", "resreq": "select[gpus]"},
                              headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 400 and env["data"]["code"] == "UNKNOWN_RESOURCE"
    assert env["data"]["offset"] == 7 and "^^^^" in env["data"]["snippet"]
    assert api.fake.calls == []


async def test_job_control(api: Any) -> None:
    r = await api.client.post(f"{V}/jobs/1/control", json={"action": "kill"}, headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 200 and env["data"][0]["state"] == "EXIT"
    assert api.fake.calls[-1] == ("jobctrl", {"jobid": 1, "action": "kill", "user": "alice"})
    # Not her job: the controller says DENIED -> 403.
    r = await api.client.post(f"{V}/jobs/2/control", json={"action": "stop"}, headers=api.token("alice"))
    assert r.status_code == 403 and "does not own" in body(r)["msg"]
    # Admins may control any job.
    r = await api.client.post(f"{V}/jobs/1,2/control", json={"action": "resume"}, headers=api.token("root"))
    assert r.status_code == 200 and body(r)["count"] == 2
    r = await api.client.post(f"{V}/jobs/77/control", json={"action": "kill"}, headers=api.token("root"))
    assert r.status_code == 404
    r = await api.client.post(f"{V}/jobs/1/control", json={"action": "explode"}, headers=api.token("root"))
    assert r.status_code == 422 and "body.action" in body(r)["msg"]


async def test_force_run(api: Any) -> None:
    hdr = api.token("root")
    r = await api.client.post(f"{V}/jobs/1/run", json={"hosts": ["n1"]}, headers=hdr)
    assert r.status_code == 200 and body(r)["data"]["state"] == "RUN"
    assert api.fake.calls[-1] == ("jobdispatch", {"jobid": 1, "alloc": [{"host": "n1", "ntasks": 1}],
                                                  "force": True, "user": "root"})
    r = await api.client.post(f"{V}/jobs/1/run", json={"hosts": ["n1", "n2"]}, headers=hdr)
    assert r.status_code == 422 and "body.hosts" in body(r)["msg"]
    r = await api.client.post(f"{V}/jobs/1/run", json={"alloc": [{"host": "n2", "ntasks": 1}],
                                                       "force": False}, headers=hdr)
    assert r.status_code == 200 and api.fake.calls[-1][1]["force"] is False
    r = await api.client.post(f"{V}/jobs/99/run", json={"hosts": ["n1"]}, headers=hdr)
    assert r.status_code == 404
    r = await api.client.post(f"{V}/jobs/1/run", json={}, headers=hdr)
    assert r.status_code == 422


# ---------------------------------------------------------------------- queues

async def test_queues(api: Any) -> None:
    env = body(await api.client.get(f"{V}/queues", headers=api.token("bob")))
    assert [q["name"] for q in env["data"]] == ["priority", "normal", "closedq"]
    r = await api.client.post(f"{V}/queues/control", json={"queue": "normal", "action": "close"},
                              headers=api.token("root"))
    assert r.status_code == 200 and body(r)["data"]["open"] is False
    assert api.fake.calls[-1] == ("queuectrl", {"queue": "normal", "action": "close", "user": "root"})
    r = await api.client.post(f"{V}/queues/control", json={"queue": "zz", "action": "open"},
                              headers=api.token("root"))
    assert r.status_code == 404
    r = await api.client.post(f"{V}/queues/control", json={"queue": "normal"}, headers=api.token("root"))
    assert r.status_code == 422 and "body.action" in body(r)["msg"]


# ---------------------------------------------------------------------- hosts

async def test_hosts_in_lsf_fields(api: Any) -> None:
    env = body(await api.client.get(f"{V}/hosts", headers=api.token("bob")))
    assert env["count"] == 3
    h = env["data"][1]
    for key in ("hostName", "hostType", "hostModel", "cpuFactor", "maxCpus", "maxMem", "maxSwap",
                "maxTmp", "resources", "status", "loadIndices", "slots", "maxSlots", "usedSlots"):
        assert key in h, key
    assert h["hostName"] == "n1" and h["maxCpus"] == 3 and h["resources"] == ["gpu"]
    assert h["status"] == "ok" and h["slots"] == 3 and h["loadIndices"]["mem"] == 4000.0


async def test_host_control(api: Any) -> None:
    r = await api.client.post(f"{V}/hosts/control", json={"host": "n1", "action": "close",
                                                          "comment": "disk"}, headers=api.token("root"))
    env = body(r)
    assert r.status_code == 200 and env["data"]["status"] == "closed_Adm" and env["data"]["comment"] == "disk"
    r = await api.client.post(f"{V}/hosts/control", json={"host": "zz", "action": "open"},
                              headers=api.token("root"))
    assert r.status_code == 404
    r = await api.client.post(f"{V}/hosts/control", json={"host": "n1", "action": "reboot"},
                              headers=api.token("root"))
    assert r.status_code == 422 and "body.action" in body(r)["msg"]


async def test_host_select(api: Any) -> None:
    hdr = api.token("alice")
    r = await api.client.post(f"{V}/hosts/select", json={"resreq": "select[ncpus>=3] order[ncpus]"},
                              headers=hdr)
    env = body(r)
    assert [h["hostName"] for h in env["data"]] == ["n2", "n1"] and env["data"][0]["tasks"] == 1
    env = body(await api.client.post(f"{V}/hosts/select", json={"resreq": "gpu", "limit": 1}, headers=hdr))
    assert [h["hostName"] for h in env["data"]] == ["n1"]
    # A closed host is not "ok" for the evaluator.
    api.store.apply("host", {**api.store.hosts["n2"], "state": "closed", "closed": True})
    env = body(await api.client.post(f"{V}/hosts/select", json={"resreq": "status==ok"}, headers=hdr))
    assert [h["hostName"] for h in env["data"]] == ["n0", "n1"]


async def test_host_select_bad_requirement(api: Any) -> None:
    r = await api.client.post(f"{V}/hosts/select", json={"resreq": "select[mem>4G && gpus]"},
                              headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 400
    err = env["data"]
    assert err["code"] == "UNKNOWN_RESOURCE" and err["section"] == "select"
    assert err["offset"] == 17 and err["column"] == 18 and "^^^^" in err["snippet"]
    assert "gpu" in env["msg"]
    r = await api.client.post(f"{V}/hosts/select", json={"resreq": "x", "limit": 0},
                              headers=api.token("alice"))
    assert r.status_code == 422 and "body.limit" in body(r)["msg"]


# ---------------------------------------------------------------------- resources, cluster

async def test_resources_and_values(api: Any) -> None:
    hdr = api.token("bob")
    env = body(await api.client.get(f"{V}/resources", headers=hdr))
    names = {r["name"]: r for r in env["data"]}
    assert names["gpu"]["type"] == "bool" and not names["gpu"]["builtin"] and names["mem"]["builtin"]
    api.store.apply("resvals", {"host": "n1", "values": {"r1m": 2.5}})
    env = body(await api.client.get(f"{V}/resources/values", headers=hdr))
    assert env["data"]["n1"] == {"r1m": 2.5} and env["count"] == 3


async def test_cluster(api: Any) -> None:
    env = body(await api.client.get(f"{V}/cluster", headers=api.token("bob")))
    assert env["data"]["name"] == "test" and env["data"]["server"] == "127.0.0.1:7600"
    assert env["data"]["members"][0]["role"] == "scheduler"


# ---------------------------------------------------------------------- health, errors, docs

def _down(api: Any, detail: str = "reconnecting: controller gone") -> None:
    """The client lost its link and the grace is over: the breaker is open."""
    api.fake.connected = False
    api.health.grace = 0.0
    api.health.link_lost(detail)


async def test_healthz_readyz(api: Any) -> None:
    r = await api.client.get(f"{V}/healthz")
    assert r.status_code == 200 and body(r)["data"] == {"status": "up"}
    assert (await api.client.get(f"{V}/readyz")).status_code == 200
    _down(api)
    r = await api.client.get(f"{V}/readyz")
    assert r.status_code == 503 and "degraded" in body(r)["msg"] and int(r.headers["retry-after"]) >= 1
    api.fake.connected = True  # a heartbeat reconnected
    api.health.link_up()
    assert (await api.client.get(f"{V}/readyz")).status_code == 200
    api.store.apply("sync_begin", {"mode": "snapshot", "store": "s2", "rev": 1, "since": None})
    r = await api.client.get(f"{V}/readyz")
    assert r.status_code == 503 and "a snapshot of the state is streaming" in body(r)["msg"]
    assert body(r)["data"]["syncing"] is True
    api.store.apply("sync_end", {"rev": 1})
    assert (await api.client.get(f"{V}/readyz")).status_code == 200


async def test_degraded_write_is_503_with_retry_after(api: Any) -> None:
    _down(api)
    r = await api.client.post(f"{V}/jobs", json={"command": "x"}, headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 503 and "backend unavailable" in env["msg"] and "controller gone" in env["msg"]
    assert int(r.headers["retry-after"]) == 1 and "nothing was sent" in env["msg"]
    assert api.fake.calls == [] and api.fake.rids == []
    # Reads keep working from the store.
    assert (await api.client.get(f"{V}/jobs", headers=api.token("alice"))).status_code == 200


async def test_unknown_route_and_method(api: Any) -> None:
    r = await api.client.get(f"{V}/nothing")
    assert r.status_code == 404 and "no route" in body(r)["msg"]
    r = await api.client.delete(f"{V}/jobs")
    assert r.status_code == 405 and body(r)["code"] == 405


async def test_openapi_documents_every_route(api: Any) -> None:
    doc = (await api.client.get(f"{V}/openapi.json")).json()
    paths = doc["paths"]
    for path, method in [("/jobs", "get"), ("/jobs", "post"), ("/jobs/create", "post"),
                         ("/jobs/{jobids}", "get"), ("/jobs/{jobids}/control", "post"),
                         ("/jobs/{jobid}/run", "post"), ("/queues", "get"), ("/queues/control", "post"),
                         ("/hosts", "get"), ("/hosts/control", "post"), ("/hosts/select", "post"),
                         ("/resources", "get"), ("/resources/values", "get"), ("/cluster", "get"),
                         ("/healthz", "get"), ("/readyz", "get"), ("/auth/logon", "post"),
                         ("/auth/logout", "post")]:
        assert method in paths[f"{V}{path}"], (path, method)
    submit = paths[f"{V}/jobs"]["post"]
    assert {"401", "403", "404", "409", "422", "503"} <= set(submit["responses"])
    assert "bearer" in str(doc["components"]["securitySchemes"]).lower()
    assert "SubmitBody" in doc["components"]["schemas"]
    # The hot routes take the raw request (xce_apiserver.lean): what they check is declared
    for path in ("/jobs", "/jobs/create"):
        op = paths[f"{V}{path}"]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/SubmitBody"}
        assert [p["name"] for p in op["parameters"]] == ["Idempotency-Key"] and op["security"]
    listing = paths[f"{V}/jobs"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {
        "state", "user", "queue", "array", "fields", "limit", "cursor"}
    limit = next(p for p in listing["parameters"] if p["name"] == "limit")["schema"]["anyOf"][0]
    assert limit == {"type": "integer", "minimum": 1, "maximum": 1000} and listing["security"]
    assert [p["name"] for p in paths[f"{V}/jobs/{{jobids}}"]["get"]["parameters"]] == ["jobids"]


# ---------------------------------------------------------------------- idempotency, edge

async def test_same_key_same_request_same_response_and_applied_once(api: Any) -> None:
    hdr = {**api.token("alice"), "Idempotency-Key": '"k-1"'}
    first = await api.client.post(f"{V}/jobs", json={"command": "sleep 1"}, headers=hdr)
    again = await api.client.post(f"{V}/jobs", json={"command": "sleep 1"}, headers=hdr)
    assert first.status_code == again.status_code == 200 and first.content == again.content
    assert first.headers["idempotency-key"] == '"k-1"'
    assert [op for op, _ in api.fake.calls] == ["jobsubmit"]  # replayed, not sent again
    r = await api.client.post(f"{V}/jobs", json={"command": "sleep 2"}, headers=hdr)
    assert r.status_code == 422 and "header.Idempotency-Key" in body(r)["msg"]
    r = await api.client.post(f"{V}/jobs/1/control", json={"action": "kill"}, headers=hdr)
    assert r.status_code == 422  # another path is another request: the key is taken
    bob = {**api.token("bob"), "Idempotency-Key": "k-1"}  # keys belong to their user
    r = await api.client.post(f"{V}/jobs", json={"command": "sleep 2"}, headers=bob)
    assert r.status_code == 200 and len(api.fake.calls) == 2
    assert api.fake.rids[0] != api.fake.rids[-1] and api.fake.rids[0].endswith(":jobsubmit:k-1")


async def test_errors_are_remembered_too_and_each_job_of_a_control_has_its_rid(api: Any) -> None:
    hdr = {**api.token("root"), "Idempotency-Key": "ctl-7"}
    r = await api.client.post(f"{V}/jobs/1,2/control", json={"action": "kill"}, headers=hdr)
    assert r.status_code == 200 and body(r)["count"] == 2
    rids = api.fake.rids[-2:]
    assert rids[0] != rids[1] and rids[0].endswith("jobctrl.1:ctl-7") and rids[1].endswith("jobctrl.2:ctl-7")
    closed = {**api.token("alice"), "Idempotency-Key": "q-1"}
    a = await api.client.post(f"{V}/jobs", json={"command": "x", "queue": "closedq"}, headers=closed)
    b = await api.client.post(f"{V}/jobs", json={"command": "x", "queue": "closedq"}, headers=closed)
    assert a.status_code == b.status_code == 409 and a.content == b.content


async def test_a_write_sent_without_answer_is_504_with_its_key_and_a_retry_is_safe(api: Any) -> None:
    from xcecore.client import OutcomeUnknown

    api.fake.fail = OutcomeUnknown("deadline of 1 s passed after the send", rid="r", op="jobsubmit")
    r = await api.client.post(f"{V}/jobs", json={"command": "x"}, headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 504 and env["data"]["op"] == "jobsubmit"
    key = env["data"]["idempotency_key"]
    assert key in env["msg"] and r.headers["idempotency-key"] == f'"{key}"'
    api.fake.fail = None
    hdr = {**api.token("alice"), "Idempotency-Key": key}
    ok1 = await api.client.post(f"{V}/jobs", json={"command": "x"}, headers=hdr)
    ok2 = await api.client.post(f"{V}/jobs", json={"command": "x"}, headers=hdr)
    assert ok1.status_code == ok2.status_code == 200
    assert body(ok1)["data"]["jobid"] == body(ok2)["data"]["jobid"] and len(api.fake.calls) == 1


@pytest.mark.parametrize("key", ['"a"b"', "x" * 65, '"unbalanced', "sp ace", "\\x"])
async def test_a_bad_idempotency_key_is_422(api: Any, key: str) -> None:
    r = await api.client.post(f"{V}/jobs", json={"command": "x"},
                              headers={**api.token("alice"), "Idempotency-Key": key})
    assert r.status_code == 422 and "Idempotency-Key" in body(r)["msg"] and api.fake.calls == []


@pytest.mark.parametrize(("payload", "field", "words"), [
    ({"command": "ls\u0000"}, "body.command", "U+0000"),
    ({"command": "x", "cwd": "/a\u0000"}, "body.cwd", "control characters"),
    ({"command": "x", "env": {"A": "1\u0000"}}, "body.env.A", "control characters"),
    ({"command": "x", "ntasks": 2**70}, "body.ntasks", "<= 2147483647"),
    ({"command": "x", "ntasks": "2"}, "body.ntasks", "must be int, got str"),
    ({"command": "x", "queue": "true\u0000"}, "body.queue", "control characters"),
    ({"command": "x" * 40_000}, "body.command", "at most 32,768"),
])
async def test_hostile_values_are_422_naming_field_and_limit(api: Any, payload: dict[str, Any],
                                                             field: str, words: str) -> None:
    r = await api.client.post(f"{V}/jobs", json=payload, headers=api.token("alice"))
    env = body(r)
    assert r.status_code == 422 and field in env["msg"] and words in env["msg"], env
    assert api.fake.calls == []


async def test_edge_limits_paths_queries_and_methods(api: Any) -> None:
    hdr = api.token("root")
    r = await api.client.post(f"{V}/jobs", content=b"{" + b" " * (1 << 20) + b"}", headers=hdr)
    assert r.status_code == 413 and body(r)["data"] == {"limit": 1 << 20}
    r = await api.client.post(f"{V}/jobs/{2**63}/run", json={"hosts": ["n1"]}, headers=hdr)
    assert r.status_code == 422 and "path.jobid" in body(r)["msg"]
    r = await api.client.get(f"{V}/jobs/{2**64}", headers=hdr)
    assert r.status_code == 422 and "path.jobids" in body(r)["msg"]
    r = await api.client.get(f"{V}/jobs", params={"usr": "bob"}, headers=hdr)
    assert r.status_code == 422 and "query.usr" in body(r)["msg"]
    r = await api.client.get(f"{V}/jobs", params={"user": "b\u0000"}, headers=hdr)
    assert r.status_code == 422 and "query.user" in body(r)["msg"]
    r = await api.client.request("OPTIONS", f"{V}/jobs", headers=hdr)
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    r = await api.client.get(f"{V}/jobs/create", headers=hdr)  # create is not a job id
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = await api.client.post(f"{V}/jobs", content=b"\xff\xfe", headers={**hdr, "content-type": "application/json"})
    assert r.status_code == 422 and "body" in body(r)["msg"]
    assert api.fake.calls == []
